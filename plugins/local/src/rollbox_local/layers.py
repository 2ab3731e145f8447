"""Removing a layer (or any tree rollbox made) for good."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from pathlib import Path


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
