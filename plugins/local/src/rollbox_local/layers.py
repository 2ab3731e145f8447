"""Copy-on-write layers on disk: copying one for a snapshot, removing one for good."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import sys
from pathlib import Path


def copy_layer(src: Path, dest: Path) -> None:
    """Copy an overlay upper directory so it can serve as a read-only lower layer.

    Regular files are copied (their data may still change in the live sandbox);
    whiteouts (0/0 character devices, never modified) are hard-linked, which needs no
    privilege; directories keep their xattrs (the overlay's opaque markers).
    """
    dest.mkdir(parents=True)
    shutil.copystat(src, dest, follow_symlinks=False)
    for dirpath, dirnames, filenames in os.walk(src):
        rel = Path(dirpath).relative_to(src)
        for name in dirnames:
            s, d = Path(dirpath, name), dest / rel / name
            if s.is_symlink():
                os.symlink(os.readlink(s), d)
                continue
            d.mkdir()
            shutil.copystat(s, d, follow_symlinks=False)
            _copy_owner(s, d)
        for name in filenames:
            s, d = Path(dirpath, name), dest / rel / name
            st = s.lstat()
            if stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(s), d)
            elif stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
                _copy_whiteout(s, d, st)
                continue
            elif stat.S_ISREG(st.st_mode):
                shutil.copy2(s, d, follow_symlinks=False)
            else:
                continue  # sockets and fifos do not survive a snapshot
            _copy_owner(s, d)


def _copy_whiteout(src: Path, dest: Path, st: os.stat_result) -> None:
    """A hard link where the layers share a filesystem; else a new 0/0 device, which
    Linux lets anyone create since 5.8 (a layer in memory, its snapshot on disk)."""
    try:
        os.link(src, dest, follow_symlinks=False)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        os.mknod(dest, stat.S_IFMT(st.st_mode) | stat.S_IMODE(st.st_mode), st.st_rdev)


def _copy_owner(src: Path, dest: Path) -> None:
    st = src.lstat()
    with contextlib.suppress(PermissionError):
        os.lchown(dest, st.st_uid, st.st_gid)


def remove_tree(path: Path) -> None:
    """``rm -rf`` that also gets through directories left without permissions (the
    mode-000 dirs overlayfs leaves in work dirs, read-only dirs an image brings)."""
    if not (os.path.isdir(path) and not os.path.islink(path)):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    try:
        _rmtree(path)
        return
    except PermissionError:
        pass
    # Unprivileged and some directory is closed: open every directory up, then retry.
    # os.walk lists a directory only after its parent's loop body ran, so the chmod of a
    # child happens before it is read.
    with contextlib.suppress(OSError):
        os.chmod(path, 0o700)
    for dirpath, dirnames, _files in os.walk(path):
        for name in dirnames:
            child = os.path.join(dirpath, name)
            if not os.path.islink(child):
                with contextlib.suppress(OSError):
                    os.chmod(child, 0o700)
    _rmtree(path)


def _rmtree(path: Path) -> None:
    """shutil.rmtree, with ``rm -f``'s tolerance: what vanishes meanwhile (another
    deletion in the same tree) is not an error."""

    def vanished_is_fine(function: object, name: str, error: BaseException) -> None:
        if not isinstance(error, FileNotFoundError):
            raise error

    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=vanished_is_fine)
    else:
        shutil.rmtree(path, onerror=lambda f, n, info: vanished_is_fine(f, n, info[1]))
