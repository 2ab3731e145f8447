"""Where the local backend keeps its state (images, sandboxes, snapshots)."""

from __future__ import annotations

import os
from pathlib import Path

from rollbox import settings
from rollbox.paths import default_home

__all__ = ["default_home", "process_alive", "sandbox_ids", "unreachable_by"]

DEFAULT_SANDBOX_UID = 200_000


def sandbox_ids() -> tuple[int, int] | None:
    """Host uid/gid that sandboxes run as when rollbox runs as root; None otherwise
    (an unprivileged user's sandboxes run as that user, mapped to root inside)."""
    if os.geteuid() != 0:
        return None
    # Not 0 (the point is to not be root) and not 2**32-1, which means "no uid" to chown.
    uid = settings.integer("ROLLBOX_SANDBOX_UID", DEFAULT_SANDBOX_UID, low=1, high=2**32 - 2,
                           what="an unprivileged host uid (not 0: sandboxes never run as "
                                "root)")
    return uid, uid


def unreachable_by(path: Path, uid: int) -> Path | None:
    """The first directory on ``path``'s chain that ``uid`` cannot traverse, if any."""
    for directory in [path, *path.parents][::-1]:
        try:
            st = directory.stat()
        except FileNotFoundError:
            return None
        if st.st_uid != uid and not st.st_mode & 0o001:
            return directory
    return None


def process_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (this one always does)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
