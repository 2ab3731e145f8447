"""Directories owned by one backend process, and the sweep of those whose owner died.

Everything a backend makes for its sandboxes (writable layers, logs, snapshots) lives
under a directory named after the process that made it: ``<pid>.<start time>-<token>``.
The start time (clock ticks since boot, from ``/proc/<pid>/stat``) tells a live owner
from a new process that happens to reuse a dead one's pid. When a backend starts, and
when ``rollbox doctor --clean`` runs, the directories of owners that are gone are
removed — after ``kill -9`` of the owner, nothing it made outlives the next start.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
from collections.abc import Callable
from pathlib import Path

from rollbox_local.layers import remove_tree

_NAME = re.compile(r"^(\d+)\.(\d+)-[0-9a-f]+$")


def _start_time(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return int(data[data.rindex(b")") + 2:].split()[19])


_names: dict[int, str] = {}


def owner_name() -> str:
    """This process's owner name (a forked child gets its own)."""
    pid = os.getpid()
    if pid not in _names:
        _names[pid] = f"{pid}.{_start_time(pid) or 0}-{secrets.token_hex(4)}"
    return _names[pid]


def owner_alive(name: str) -> bool:
    """Whether the process that owns ``name`` still runs. Names that are not owner
    names are treated as alive (never swept)."""
    match = _NAME.match(name)
    if match is None:
        return True
    pid, started = int(match.group(1)), int(match.group(2))
    return _start_time(pid) == started


def claim(parent: Path, *, mode: int = 0o755,
          prepare: Callable[[Path], None] | None = None) -> Path:
    """``parent/<owner>``, made for this process (``prepare`` runs on it once made)."""
    mine = parent / owner_name()
    try:
        mine.mkdir(mode=mode, parents=True)
    except FileExistsError:
        return mine
    os.chmod(mine, mode)
    if prepare is not None:
        prepare(mine)
    return mine


def sweep(parent: Path) -> list[Path]:
    """Remove the directories in ``parent`` whose owner is gone; return what went."""
    removed: list[Path] = []
    with contextlib.suppress(FileNotFoundError):
        for entry in sorted(parent.iterdir()):
            if owner_alive(entry.name):
                continue
            with contextlib.suppress(OSError):
                remove_tree(entry)
                removed.append(entry)
    return removed


def dead(parent: Path) -> list[Path]:
    """The directories in ``parent`` whose owner is gone (what ``sweep`` would remove)."""
    with contextlib.suppress(FileNotFoundError):
        return [e for e in sorted(parent.iterdir()) if not owner_alive(e.name)]
    return []
