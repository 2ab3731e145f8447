"""rollbox's local backend: bubblewrap sandboxes on this machine (the embedded default)."""

from rollbox_local.backend import LocalBackend
from rollbox_local.sandbox import LocalSandbox

__all__ = ["LocalBackend", "LocalSandbox"]
