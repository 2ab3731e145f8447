"""Build an agent-server image for rollbox's local backend from PyPI packages alone.

OpenHands publishes its agent-server as container images in a registry; rollbox's local
backend needs no registry. This builds the same layout as those images, as an OCI image
layout laid over the host's system directories (label ``org.rollbox.base=host``):

    /agent-server/python/          a copy of a Python >= 3.12 interpreter (its prefix)
    /agent-server/.venv/           a virtualenv with openhands-agent-server and -tools
    /usr/local/bin/openhands-agent-server   runs ``python -m openhands.agent_server``
    /usr/... (optional)            Debian's chromium and the libraries this host lacks

so both commands OpenHands' clients send to ``/start`` work unchanged: the app server's
and the SDK's "binary" target ``/usr/local/bin/openhands-agent-server --port 60000`` and
the SDK's "source" target ``/agent-server/.venv/bin/python -m openhands.agent_server``.
The host's ``/usr`` provides the shell, git, tmux and system libraries. An image over
the host belongs to the machine it was built on (and its like).

Bytecode is compiled at build time and files keep their modification times (a ``.pyc``
records its source's): a sandbox's writable layer is dropped on every reset, so bytecode
compiled at run time would be compiled again by every agent-server boot.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from rollbox.errors import UsageError

PREFIX = "/agent-server"
"""Where the image keeps its Python and virtualenv (as OpenHands' own images do)."""
VENV_PYTHON = f"{PREFIX}/.venv/bin/python"
LAUNCHER = "/usr/local/bin/openhands-agent-server"
DEFAULT_VERSION = "1.58.2"
BASE_LABEL = "org.rollbox.base"

CONSTRAINTS = ("mcp<2", "cryptography<51")
"""OpenHands builds its images from a lockfile; installing from PyPI resolves the newest
dependencies instead. Those known to break the agent-server are held back here: mcp 2
dropped the server API browser-use's MCP server uses (the browser tool then fails to
start, and the app server cannot create a conversation); cryptography 51 refuses a
Fernet key in standard base64, which the SDK's ``Cipher`` derives (``b64encode`` of a
SHA-256), so every conversation whose secrets it saves failed with HTTP 500."""

_SKIP_IN_PREFIX = ("lib/python3.{minor}/test", "lib/python3.{minor}/idlelib",
                   "lib/python3.{minor}/tkinter", "lib/python3.{minor}/turtledemo",
                   "lib/python3.{minor}/site-packages")


@dataclass(frozen=True)
class BuildRequest:
    """What to build. ``packages`` default to the agent-server and its tools at
    ``version``; ``chromium`` adds Debian's chromium for the browser tool."""

    output: Path
    python: Path
    version: str = DEFAULT_VERSION
    packages: tuple[str, ...] = ()
    chromium: bool = False
    uv: str | None = None

    def requirements(self) -> tuple[str, ...]:
        if self.packages:
            return self.packages
        return tuple(f"{name}=={self.version}" for name in
                     ("openhands-agent-server", "openhands-tools", "openhands-sdk"))


def find_python(explicit: str | None = None) -> Path:
    """The interpreter to copy into the image: ``explicit``, else this one if it is
    >= 3.12, else ``python3.13`` or ``python3.12`` on PATH."""
    candidates = [explicit] if explicit else [
        sys.executable if sys.version_info >= (3, 12) else None,
        shutil.which("python3.13"), shutil.which("python3.12")]
    for candidate in candidates:
        if candidate and _python_version(Path(candidate)) >= (3, 12):
            return Path(candidate)
    raise UsageError(
        "the agent-server needs Python >= 3.12 and none was found"
        + (f" ({explicit} is not one)" if explicit else "")
        + ": pass --python /path/to/python3.12 (pyenv, uv python install, or your OS)")


def _python_version(python: Path) -> tuple[int, int]:
    try:
        out = subprocess.run([str(python), "-c", "import sys; print(*sys.version_info[:2])"],
                             capture_output=True, text=True, timeout=60, check=True).stdout
        major, minor = out.split()
        return int(major), int(minor)
    except (OSError, subprocess.SubprocessError, ValueError):
        return (0, 0)


def build(request: BuildRequest) -> Path:
    """Build the image as an OCI layout directory at ``request.output``; return it.

    Needs ``uv`` (to install from PyPI) and, with ``chromium``, Debian's ``apt-get`` and
    ``dpkg-deb``. The output is replaced if it exists."""
    uv = request.uv or shutil.which("uv")
    if uv is None:
        raise UsageError("building the agent-server image needs uv: pip install uv")
    with tempfile.TemporaryDirectory(prefix="rollbox-agent-server-") as tmp:
        root = Path(tmp) / "rootfs"
        _stage_python(request.python, root / PREFIX.lstrip("/") / "python")
        _stage_venv(uv, root, request.requirements())
        _stage_launcher(root)
        if request.chromium:
            _stage_chromium(root, Path(tmp) / "debs")
        _write_oci_layout(root, request.output, env={
            # The copied interpreter may link libpython dynamically with an rpath of
            # its original place: point the loader at the copy.
            "LD_LIBRARY_PATH": f"{PREFIX}/python/lib",
            "OPENHANDS_AGENT_SERVER_VERSION": request.version,
            # A sandbox has no route to the internet by default: no price-list download.
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        })
    return request.output


def _clean_env() -> dict[str, str]:
    """This environment without what would make uv or Python look elsewhere (a
    PYTHONPATH makes uv count the packages on it as installed in the image)."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith("PYTHON") and k not in ("VIRTUAL_ENV", "CONDA_PREFIX")}


def _run(command: Sequence[str], what: str) -> None:
    result = subprocess.run(list(command), capture_output=True, text=True, env=_clean_env())
    if result.returncode != 0:
        raise UsageError(f"{what} failed ({' '.join(command)}):\n{result.stderr[-3000:]}")


def _stage_python(python: Path, dest: Path) -> None:
    info = subprocess.run(
        [str(python), "-c", "import sys; print(sys.base_prefix); print(sys.version_info[1])"],
        capture_output=True, text=True, check=True, env=_clean_env()).stdout.split()
    prefix, minor = Path(info[0]), info[1]
    skip = {prefix / s.format(minor=minor) for s in _SKIP_IN_PREFIX}

    def ignore(directory: str, names: list[str]) -> set[str]:
        return {n for n in names if Path(directory, n) in skip or n == "__pycache__"}

    shutil.copytree(prefix, dest, symlinks=True, ignore=ignore)
    (dest / f"lib/python3.{minor}/site-packages").mkdir(exist_ok=True)
    for entry in (dest / "bin").iterdir():  # pip, idle, ...: scripts naming the old prefix
        if not entry.name.startswith("python"):
            entry.unlink()


def _stage_venv(uv: str, root: Path, requirements: Sequence[str]) -> None:
    prefix = root / PREFIX.lstrip("/")
    pythons = sorted((prefix / "python/bin").glob("python3.*[0-9]"))
    if not pythons:
        raise UsageError(f"no python3.X executable in the copied interpreter {prefix}/python")
    staged_python = pythons[0]
    venv = prefix / ".venv"
    # --no-config: a pyproject.toml or uv.toml around the caller (say, a uv workspace
    # that overrides OpenHands' packages away) must not change what goes in the image.
    _run([uv, "venv", "--quiet", "--no-config", "--python", str(staged_python), str(venv)],
         "uv venv")
    constraints = venv.parent / "constraints.txt"
    constraints.write_text("\n".join(CONSTRAINTS) + "\n")
    _run([uv, "pip", "install", "--quiet", "--no-config", "--compile-bytecode",
          "--python", str(venv / "bin/python"), "--constraint", str(constraints),
          *requirements], "installing the agent-server")
    constraints.unlink()
    # Point the virtualenv at the interpreter's place inside the image.
    final_python = f"{PREFIX}/python/bin/{staged_python.name}"
    cfg = venv / "pyvenv.cfg"
    lines = [f"home = {PREFIX}/python/bin" if line.startswith("home") else line
             for line in cfg.read_text().splitlines()]
    cfg.write_text("\n".join(lines) + "\n")
    staged_bin = str(venv / "bin/python")
    for entry in (venv / "bin").iterdir():
        if entry.is_symlink() and entry.name.startswith("python"):
            entry.unlink()
            entry.symlink_to(final_python)
        elif entry.is_file():
            _rewrite_shebang(entry, staged_bin, VENV_PYTHON)


def _rewrite_shebang(path: Path, old: str, new: str) -> None:
    with path.open("rb") as handle:
        head = handle.read(len(old) + 2)
    if head != b"#!" + old.encode():
        return
    data = path.read_bytes()
    path.write_bytes(b"#!" + new.encode() + data[len(head):])


def _stage_launcher(root: Path) -> None:
    launcher = root / LAUNCHER.lstrip("/")
    launcher.parent.mkdir(parents=True, exist_ok=True)
    launcher.write_text(f'#!/bin/sh\nexec {VENV_PYTHON} -m openhands.agent_server "$@"\n')
    launcher.chmod(0o755)


def _stage_chromium(root: Path, debs: Path) -> None:
    """Debian's chromium and the packages this host lacks for it, unpacked (not
    installed: nothing on the host changes)."""
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        raise UsageError("--chromium needs Debian's apt-get and dpkg-deb (or build without "
                         "it and install chromium on the host: the image shows the host's "
                         "/usr)")
    simulate = ["apt-get", "install", "--simulate", "--no-install-recommends", "chromium"]
    plan = subprocess.run(simulate, capture_output=True, text=True)
    if plan.returncode != 0 and os.geteuid() == 0:  # no package lists yet: fetch them
        subprocess.run(["apt-get", "update", "-qq"], capture_output=True)
        plan = subprocess.run(simulate, capture_output=True, text=True)
    if plan.returncode != 0:
        raise UsageError(f"apt-get cannot plan chromium: {plan.stderr[-2000:]} "
                         "(run `apt-get update` once as root)")
    names = [line.split()[1] for line in plan.stdout.splitlines() if line.startswith("Inst ")]
    if not names:
        return  # the host has chromium already: the image shows it
    debs.mkdir()
    subprocess.run(["chown", "_apt", str(debs)], capture_output=True)  # apt drops to _apt
    downloaded = subprocess.run(["apt-get", "download", *names], cwd=debs,
                                capture_output=True, text=True)
    if downloaded.returncode != 0:
        raise UsageError(f"apt-get download failed: {downloaded.stderr[-2000:]}")
    for deb in sorted(debs.glob("*.deb")):
        _run(["dpkg-deb", "-x", str(deb), str(root)], f"unpacking {deb.name}")


def _write_oci_layout(root: Path, dest: Path, *, env: dict[str, str]) -> None:
    """One uncompressed layer made of ``root``, streamed to disk (it is large)."""
    if dest.exists():
        shutil.rmtree(dest)
    blobs = dest / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    layer_tmp = blobs / ".layer.partial"
    with layer_tmp.open("wb") as raw:
        digester = _DigestingWriter(raw)
        with tarfile.open(fileobj=digester, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for path in _walk_sorted(root):
                info = tar.gettarinfo(str(path), arcname=path.relative_to(root).as_posix())
                info.uid = info.gid = 0
                info.uname = info.gname = "root"
                if info.isreg():
                    with path.open("rb") as handle:
                        tar.addfile(info, handle)
                else:
                    tar.addfile(info)
    layer_digest, layer_size = digester.hexdigest(), digester.size
    layer_tmp.rename(blobs / layer_digest)

    def put(data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        return "sha256:" + digest

    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine)
    config = json.dumps({
        "architecture": arch, "os": "linux",
        "config": {"Env": [f"{k}={v}" for k, v in env.items()], "WorkingDir": "/",
                   "Labels": {BASE_LABEL: "host"}},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + layer_digest]},
    }, sort_keys=True).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": put(config), "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": "sha256:" + layer_digest, "size": layer_size}],
    }, sort_keys=True).encode()
    index = {"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": put(manifest),
        "size": len(manifest), "platform": {"os": "linux", "architecture": arch}}]}
    (dest / "index.json").write_text(json.dumps(index, sort_keys=True))
    (dest / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))


def _walk_sorted(root: Path) -> Iterator[Path]:
    for directory, dirs, files in os.walk(root):
        dirs.sort()
        base = Path(directory)
        if base != root:
            yield base
        for name in sorted(files):
            yield base / name
        for name in dirs:  # symlinks to directories are not descended into
            if (base / name).is_symlink():
                yield base / name


class _DigestingWriter(io.RawIOBase):
    """A write-only stream that hashes and counts what passes through."""

    def __init__(self, raw: io.BufferedWriter) -> None:
        self._raw, self._hash, self.size = raw, hashlib.sha256(), 0

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self._raw.write(data)
        self._hash.update(data)
        self.size += len(data)
        return len(data)

    def hexdigest(self) -> str:
        return self._hash.hexdigest()

