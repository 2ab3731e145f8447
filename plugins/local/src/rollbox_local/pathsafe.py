"""File access inside a sandbox from the host, without ever leaving it.

Paths are resolved by the kernel with ``openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)``
against the sandbox's root directory: ``..`` and absolute symlinks stop at the
sandbox's ``/`` exactly as they do for a process inside it, and /proc magic links are
refused. Where openat2 is missing (Linux < 5.6) the same rules are applied by walking
the path one component at a time with ``O_NOFOLLOW``.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import posixpath
from collections.abc import Iterator

SYS_OPENAT2 = 437  # same number on every architecture
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_IN_ROOT = 0x10
MAX_SYMLINKS = 40

_libc = ctypes.CDLL(None, use_errno=True)
_have_openat2: bool | None = None


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                ("resolve", ctypes.c_uint64)]


def open_in_root(root_fd: int, path: str, flags: int, mode: int = 0o644) -> int:
    """Open ``path`` (absolute, inside the sandbox) relative to the sandbox root."""
    global _have_openat2
    rel = path.lstrip("/") or "."
    if _have_openat2 is not False:
        how = _OpenHow(flags | os.O_CLOEXEC, mode if flags & os.O_CREAT else 0,
                       RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)
        fd = _libc.syscall(SYS_OPENAT2, root_fd, rel.encode(), ctypes.byref(how),
                           ctypes.sizeof(how))
        if fd >= 0:
            _have_openat2 = True
            return int(fd)
        err = ctypes.get_errno()
        if err not in (errno.ENOSYS, errno.EPERM) or _have_openat2:
            raise OSError(err, os.strerror(err), path)
        _have_openat2 = False
    return _walk_open(root_fd, rel, flags, mode)


def _walk_open(root_fd: int, rel: str, flags: int, mode: int) -> int:
    """openat2's rules by hand: resolve every component, symlinks included, in root."""
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    stack: list[str] = []  # resolved components so far
    hops = 0
    while parts:
        name = parts.pop(0)
        if name == "..":
            if stack:
                stack.pop()
            continue
        here = "/".join([*stack, name])
        try:
            target = os.readlink(here, dir_fd=root_fd)
        except OSError as exc:
            if exc.errno not in (errno.EINVAL, errno.ENOENT):
                raise
            stack.append(name)
            continue
        hops += 1
        if hops > MAX_SYMLINKS:
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), rel)
        if target.startswith("/"):
            stack = []
        parts = [p for p in target.split("/") if p not in ("", ".")] + parts
    final = "/".join(stack) or "."
    return os.open(final, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=root_fd)


@contextlib.contextmanager
def acting_as(ids: tuple[int, int] | None) -> Iterator[None]:
    """Create files with the sandbox user's filesystem identity, on this thread only.

    A filesystem mounted inside the sandbox's user namespace refuses to create files
    owned by a host uid it cannot map (EOVERFLOW), so root must act as the sandbox user.
    setfsuid/setfsgid are per thread, so call this in a worker thread.
    """
    if ids is None:
        yield
        return
    previous_gid = _libc.setfsgid(ids[1])
    previous_uid = _libc.setfsuid(ids[0])
    try:
        yield
    finally:
        _libc.setfsuid(previous_uid)
        _libc.setfsgid(previous_gid)


def make_parents(root_fd: int, path: str, *, uid: int | None, gid: int | None) -> None:
    """``mkdir -p`` of ``path``'s parent, inside the sandbox, owned by the sandbox user."""
    parent = posixpath.dirname(path)
    missing: list[str] = []
    while parent not in ("/", ""):
        try:
            os.close(open_in_root(root_fd, parent, os.O_PATH | os.O_DIRECTORY))
            break
        except FileNotFoundError:
            missing.append(parent)
            parent = posixpath.dirname(parent)
    for directory in reversed(missing):
        head, name = posixpath.split(directory)
        dfd = open_in_root(root_fd, head or "/", os.O_PATH | os.O_DIRECTORY)
        try:
            os.mkdir(name, 0o755, dir_fd=dfd)
            if uid is not None and gid is not None:
                os.chown(name, uid, gid, dir_fd=dfd, follow_symlinks=False)
        except FileExistsError:
            pass
        finally:
            os.close(dfd)
