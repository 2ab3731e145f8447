"""Where sandboxes' writable layers live: in memory when the machine allows, else on disk.

A writable layer lives for one rollout. On disk it costs more than its writes: every
reset unmounts an overlay, and overlayfs then syncs its upper filesystem, the whole of
it, so each reset flushes every dirty page on that disk (freshly unpacked images
included) and the next commands' reads queue behind the flush (measured on a
discard-mounted ext4: 90 MiB of metadata written by those syncs in one bench arm, and
first commands waiting 100 ms for a directory block). On a tmpfs that sync is free.

``ROLLBOX_SCRATCH`` (or ``LocalBackend(scratch=...)``) picks the place:

* ``auto`` (default): memory if ``/dev/shm`` is a tmpfs of at least 2 GiB this kernel
  can hold overlay upper layers on (user xattrs on tmpfs, Linux 6.6+), else disk;
* ``memory``: like auto, but an error if memory is not possible;
* ``disk``: ``<state_dir>/sandboxes``;
* an absolute path: that directory.

Memory is bounded: a sandbox created while the tmpfs has less than ``MEMORY_RESERVE`` of
its size free gets its layer on disk instead, and a tmpfs holds at most its size (half
the RAM by default), so layers can fill it but not the machine. Each backend process
uses its own directory, ``/dev/shm/rollbox-<uid>/<pid>-<token>``; those of dead
processes are removed when a backend starts.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import re
import secrets
import stat
import threading
from pathlib import Path

from rollbox import settings
from rollbox.errors import UsageError

from rollbox_local.layers import remove_tree
from rollbox_local.paths import process_alive

log = logging.getLogger(__name__)

SHM = Path("/dev/shm")
MIN_KERNEL = (6, 6)  # tmpfs user.* xattrs, which overlayfs needs in a user namespace
MEMORY_RESERVE = 0.10
"""Fraction of the tmpfs kept free: below it, new layers go to disk."""
MIN_MEMORY_BYTES = 2 * 1024**3
"""A smaller tmpfs (a container's default /dev/shm is 64 MiB) would fill with one busy
sandbox's writes: layers then go to disk."""


class Scratch:
    """Where this backend's sandbox directories go (``place()`` picks one per sandbox)."""

    def __init__(self, disk: Path, memory: Path | None) -> None:
        self.disk = disk
        self._memory_parent = memory  # made on first use: most backends never create one
        self._lock = threading.Lock()  # place() runs in worker threads
        self.memory: Path | None = None

    @classmethod
    def choose(cls, setting: str | Path | None, state_dir: Path) -> Scratch:
        disk = state_dir / "sandboxes"
        disk.mkdir(parents=True, exist_ok=True)
        choice = str(setting or settings.text("ROLLBOX_SCRATCH", "auto"))
        origin = "scratch" if setting else "ROLLBOX_SCRATCH"
        if choice == "disk":
            return cls(disk, None)
        if choice not in ("auto", "memory"):
            path = Path(choice)
            if not path.is_absolute():
                raise _bad_scratch(origin, choice, "is not auto, memory, disk or an "
                                   "absolute path", "set it to one of those")
            try:
                path.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise _bad_scratch(origin, choice, f"cannot be made a directory "
                                   f"({exc.strerror})", "give a directory you can write") from None
            return cls(path, None)
        why_not = memory_unavailable()
        if why_not is None and choice == "auto":
            return cls(disk, SHM / f"rollbox-{os.geteuid()}")
        if why_not is None:  # asked for memory: make its directory now, or say why not
            chosen = cls(disk, None)
            try:
                chosen.memory = _own_directory(SHM / f"rollbox-{os.geteuid()}")
                return chosen
            except OSError as exc:
                why_not = f"cannot use {SHM}: {exc}"
        if choice == "memory":
            raise UsageError(f"{origin}=memory, but {why_not}; use auto or disk")
        return cls(disk, None)

    @property
    def roots(self) -> list[Path]:
        return [self.disk] + ([self.memory] if self.memory is not None else [])

    def place(self) -> Path:
        """The parent directory for a new sandbox's directory (blocking: call it in a
        thread)."""
        with self._lock:
            if self.memory is None and self._memory_parent is not None:
                try:
                    self.memory = _own_directory(self._memory_parent)
                except OSError as exc:
                    log.warning("sandbox layers go to disk: cannot use %s (%s)",
                                self._memory_parent, exc)
                self._memory_parent = None
        if self.memory is not None and _free_fraction(self.memory) >= MEMORY_RESERVE:
            return self.memory
        return self.disk

    def close(self) -> None:
        """Remove this process's memory directory if it is empty (call after every sandbox
        directory is gone)."""
        if self.memory is not None:
            with contextlib.suppress(OSError):
                self.memory.rmdir()


def memory_unavailable() -> str | None:
    """Why sandbox layers cannot live in memory here, or None if they can."""
    try:
        if os.statvfs(SHM).f_bsize <= 0 or not SHM.is_dir():
            return f"{SHM} is not usable"
    except OSError:
        return f"{SHM} does not exist"
    if _fs_type(SHM) != "tmpfs":
        return f"{SHM} is not a tmpfs"
    st = os.statvfs(SHM)
    if st.f_blocks * st.f_frsize < MIN_MEMORY_BYTES:
        return (f"{SHM} holds only {st.f_blocks * st.f_frsize // 2**20} MiB (less than "
                f"{MIN_MEMORY_BYTES // 2**30} GiB)")
    if _kernel() < MIN_KERNEL:
        return (f"Linux {platform.release()} cannot keep overlay upper layers on tmpfs in a "
                "user namespace (needs 6.6+)")
    return None


def _own_directory(parent: Path) -> Path:
    """``parent`` (created private to this user, or checked to be) and in it a fresh
    directory for this process; directories of dead processes are removed."""
    with contextlib.suppress(FileExistsError):
        parent.mkdir(mode=0o755)
    st = os.lstat(parent)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise PermissionError(f"{parent} is not a directory owned by this user and "
                              "writable only by it")
    for stale in parent.iterdir():
        pid = stale.name.split("-", 1)[0]
        if pid.isdigit() and not process_alive(int(pid)):
            with contextlib.suppress(OSError):
                remove_tree(stale)
    mine = parent / f"{os.getpid()}-{secrets.token_hex(4)}"
    mine.mkdir(mode=0o755)
    os.chmod(mine, 0o755)  # the sandbox user (when root) must reach its directories
    return mine


def _free_fraction(path: Path) -> float:
    try:
        st = os.statvfs(path)
    except OSError:
        return 0.0
    return st.f_bavail / st.f_blocks if st.f_blocks else 0.0


def _fs_type(path: Path) -> str | None:
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


def _bad_scratch(origin: str, value: str, problem: str, advice: str) -> UsageError:
    if origin == "ROLLBOX_SCRATCH":
        return settings.invalid(origin, value, problem, advice)
    return UsageError(f"LocalBackend(scratch={value!r}) {problem}; {advice}")
