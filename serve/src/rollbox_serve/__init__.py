"""rollbox serve: one backend and its warm pool, shared by many processes over HTTP.

``rollbox serve`` runs it; ``rollbox_remote.RemoteBackend`` (the ``remote`` backend) is
its client. docs/serve.md describes both, and the protocol.
"""

from rollbox_serve.demand import SharedPolicy
from rollbox_serve.registry import Held
from rollbox_serve.server import Server

__all__ = ["Held", "Server", "SharedPolicy"]
