"""Where rollbox keeps its state on this machine (images, sandboxes, bench corpora)."""

from __future__ import annotations

import os
from pathlib import Path

from rollbox import settings


def default_home() -> Path:
    """``$ROLLBOX_HOME``; else /var/lib/rollbox for root (sandboxes run as another user,
    who must reach it, and root's home is private); else ``$XDG_CACHE_HOME/rollbox`` or
    ~/.cache/rollbox."""
    if home := settings.path("ROLLBOX_HOME"):
        return home
    if os.geteuid() == 0:
        return Path("/var/lib/rollbox")
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "rollbox"
