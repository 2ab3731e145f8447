"""What a backend process that died without closing (``kill -9``, the OOM killer) left,
and its removal.

Its processes are already gone: every sandbox's holder blocks on a pipe of the dead
process and its agent serves a socket of it, so both end with it, and with them every
process, mount namespace and tmpfs layer of the sandbox. What stays is on the host:
its directories under ``sandboxes/`` and ``/dev/shm/rollbox-<uid>/`` (mount points,
logs, layers on disk), its snapshots (with ``.partial`` ones), its cgroups. All are
named after their owner process (``owners.py``) and removed by ``sweep_dead``, which a
backend runs when it starts and ``rollbox doctor --clean`` runs on demand.
"""

from __future__ import annotations

import os
from pathlib import Path

from rollbox_local import cgroups, owners
from rollbox_local.scratch import SHM


def places(state_dir: Path) -> list[Path]:
    """The directories holding one directory per owner process."""
    return [state_dir / "sandboxes", state_dir / "snapshots", SHM / f"rollbox-{os.geteuid()}"]


def sweep_dead(state_dir: Path) -> list[str]:
    """Remove every leftover of dead backend processes using ``state_dir``, and their
    cgroups; one line per thing removed."""
    removed = [str(path) for place in places(state_dir) for path in owners.sweep(place)]
    removed += [f"cgroup {path}" for path in cgroups.sweep_all_dead()]
    return removed
