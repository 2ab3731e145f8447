"""Where sandboxes' writable layers live: a tmpfs of their own when the machine allows,
else a directory on disk.

In memory (the default where possible), each generation of a sandbox mounts a tmpfs of
its own for its writable layer, /tmp and /dev/shm, sized by the spec's ``disk_mb`` and
``inodes`` (the zygote mounts it in a mount namespace of the generation's own, see
``_agent._mount_layer``). That enforces the disk limit, costs no disk I/O (on disk every
reset's overlay unmount syncs the whole upper filesystem: measured 90 MiB of metadata
per bench arm, first commands waiting 100 ms for a directory block), and frees the
memory when the generation ends: there is nothing to delete. The pages count against
the sandbox's memory cgroup where there is one (``memory_mb`` then bounds processes and
files together).

On disk the layer is an ordinary directory: ``disk_mb`` and ``inodes`` cannot be
enforced (the backend then does not declare them), and /dev/shm is a tmpfs of its own.

``ROLLBOX_SCRATCH`` (or ``LocalBackend(scratch=...)``) picks:

* ``auto`` (default): memory where this kernel can keep overlay upper layers on tmpfs
  inside a user namespace (user xattrs on tmpfs, Linux 6.6+), else disk;
* ``memory``: like auto, but an error where memory is not possible;
* ``disk``: ``<state_dir>/sandboxes``;
* an absolute path: that directory (on disk).

Sandbox directories (the mount points, bwrap's logs; tiny) go under ``/dev/shm`` when
that is a tmpfs, else under the state directory, in a directory per backend process
(``owners.py``): those of dead processes are removed when a backend starts.
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
import stat
import threading
from pathlib import Path

from rollbox.errors import UsageError

from rollbox_local.owners import claim, sweep

SHM = Path("/dev/shm")
MIN_KERNEL = (6, 6)  # tmpfs user.* xattrs, which overlayfs needs in a user namespace


class Scratch:
    """Where this backend's sandbox directories go, and whether layers get a tmpfs."""

    def __init__(self, disk: Path, memory: Path | None, *, tmpfs_layers: bool) -> None:
        self.disk_parent = disk
        self.memory_parent = memory  # /dev/shm/rollbox-<uid>, made on first use
        self.tmpfs_layers = tmpfs_layers
        """Each generation's writable layer is a tmpfs of its own (disk_mb enforced)."""
        self._lock = threading.Lock()  # place() runs in worker threads
        self._placed: Path | None = None

    @classmethod
    def choose(cls, setting: str | Path | None, state_dir: Path) -> Scratch:
        disk = state_dir / "sandboxes"
        disk.mkdir(parents=True, exist_ok=True)
        sweep(disk)
        choice = str(setting or os.environ.get("ROLLBOX_SCRATCH") or "auto")
        if choice == "disk":
            return cls(disk, None, tmpfs_layers=False)
        if choice not in ("auto", "memory"):
            path = Path(choice)
            if not path.is_absolute():
                raise UsageError(f"ROLLBOX_SCRATCH must be auto, memory, disk or an absolute "
                                 f"path, got {choice!r}")
            path.mkdir(parents=True, exist_ok=True)
            sweep(path)
            return cls(path, None, tmpfs_layers=False)
        why_not = memory_unavailable()
        if why_not is not None:
            if choice == "memory":
                raise UsageError(f"ROLLBOX_SCRATCH=memory, but {why_not}; use auto or disk")
            return cls(disk, None, tmpfs_layers=False)
        shm = SHM / f"rollbox-{os.geteuid()}" if _is_tmpfs(SHM) else None
        if shm is not None and shm.is_dir():
            sweep(shm)
        return cls(disk, shm, tmpfs_layers=True)

    @property
    def roots(self) -> list[Path]:
        """The directories this backend's sandbox directories can be in."""
        return [self.disk_parent] + ([self.memory_parent] if self.memory_parent else [])

    def place(self) -> Path:
        """This process's directory for sandbox directories (blocking: call it in a
        thread), made on first use."""
        with self._lock:
            if self._placed is None:
                self._placed = self._claim()
            return self._placed

    def _claim(self) -> Path:
        if self.memory_parent is not None:
            try:
                _private_parent(self.memory_parent)
                return claim(self.memory_parent)
            except OSError:
                self.memory_parent = None
        return claim(self.disk_parent)

    def close(self) -> None:
        """Remove this process's directory if it is empty (after every sandbox's)."""
        if self._placed is not None:
            with contextlib.suppress(OSError):
                self._placed.rmdir()
            self._placed = None


def memory_unavailable() -> str | None:
    """Why writable layers cannot get a tmpfs of their own here, or None if they can."""
    if _kernel() < MIN_KERNEL:
        return (f"Linux {platform.release()} cannot keep overlay upper layers on tmpfs in a "
                "user namespace (needs 6.6+)")
    if os.geteuid() != 0 and not _user_namespaces_allowed():
        return "unprivileged user namespaces are not allowed here"
    return None


def _private_parent(parent: Path) -> None:
    """``parent`` (made private to this user, or checked to be)."""
    with contextlib.suppress(FileExistsError):
        parent.mkdir(mode=0o755)
    st = os.lstat(parent)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise PermissionError(f"{parent} is not a directory owned by this user and "
                              "writable only by it")


def _user_namespaces_allowed() -> bool:
    try:
        return int(Path("/proc/sys/user/max_user_namespaces").read_text()) > 0
    except (OSError, ValueError):
        return True


def _is_tmpfs(path: Path) -> bool:
    return fs_type(path) == "tmpfs"


def fs_type(path: Path) -> str | None:
    """The filesystem type of the mount ``path`` is on (from /proc/self/mountinfo)."""
    best, kind = "", None
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                mount_point = left.split()[4]
                if (str(path) == mount_point or str(path).startswith(mount_point.rstrip("/") + "/")
                        ) and len(mount_point) >= len(best):
                    best, kind = mount_point, right.split()[0]
    except OSError:
        return None
    return kind


def _kernel() -> tuple[int, int]:
    match = re.match(r"(\d+)\.(\d+)", platform.release())
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)
