"""rollbox serve: one backend and its warm pool, shared by many processes over HTTP.

``rollbox serve`` runs it; ``rollbox_remote.RemoteBackend`` (the ``remote`` backend) is
its client. docs/serve.md describes both, and the protocol.

Every ``rollbox`` command loads this package's plugin module, so the package imports
nothing on its own: ``Server`` (and aiohttp, half a second) comes on first use.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rollbox_serve.demand import SharedPolicy
    from rollbox_serve.registry import Held
    from rollbox_serve.server import Server

__all__ = ["Held", "Server", "SharedPolicy"]
_HOMES = {"Held": "rollbox_serve.registry", "Server": "rollbox_serve.server",
          "SharedPolicy": "rollbox_serve.demand"}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'rollbox_serve' has no attribute {name!r}")
