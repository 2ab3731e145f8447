"""The ``remote`` backend: a client of ``rollbox serve`` (pure Python, standard library).

    backend = rollbox.open_backend("remote", url="unix:/run/rollbox.sock", token=...)

or ``ROLLBOX_BACKEND=remote ROLLBOX_URL=...``: every rollbox program then uses the
server's warm pool. ``sandbox.id`` is a handle another process attaches to with
``backend.attach(id)``. The wire format is ``rollbox_remote.protocol``.
"""

from rollbox_remote.backend import RemoteBackend, RemoteProcess, RemoteSandbox

__all__ = ["RemoteBackend", "RemoteProcess", "RemoteSandbox"]
