"""rollbox: sandboxes for agentic RL and evaluation, fast enough that the GPUs never wait.

    import rollbox
    async with rollbox.open_backend() as backend, rollbox.Pool(backend) as pool:
        async with pool.lease(rollbox.SandboxSpec(image="host")) as sandbox:
            print((await sandbox.exec("echo hello")).text)
"""

from __future__ import annotations

from typing import Any

from rollbox.backend import Backend, Diagnostic
from rollbox.errors import (
    ExecTimeoutError,
    RollboxError,
    SandboxError,
    SandboxLostError,
    UsageError,
)
from rollbox.metrics import Metrics
from rollbox.plugins import DEFAULT_BACKEND, backend_class, get_plugin_manager
from rollbox.pool import Lease, NoPoolPolicy, Outcome, Pool, PoolPolicy, StaticPoolPolicy
from rollbox.sandbox import (
    Capabilities,
    ExecRequest,
    ExecResult,
    OutputChunk,
    Process,
    Sandbox,
    Snapshot,
)
from rollbox.spec import Network, Resources, SandboxSpec, Timeouts

__version__ = "0.1.0"


def open_backend(name: str | None = None, **options: Any) -> Backend:
    """The backend called ``name`` (default: ``$ROLLBOX_BACKEND``, else ``local``).

    Moving from a laptop to a cluster is this one setting.
    """
    return backend_class(get_plugin_manager(), name)(**options)


__all__ = [
    "DEFAULT_BACKEND",
    "Backend",
    "Capabilities",
    "Diagnostic",
    "ExecRequest",
    "ExecResult",
    "ExecTimeoutError",
    "Lease",
    "Metrics",
    "Network",
    "NoPoolPolicy",
    "Outcome",
    "OutputChunk",
    "Pool",
    "PoolPolicy",
    "Process",
    "Resources",
    "RollboxError",
    "Sandbox",
    "SandboxError",
    "SandboxLostError",
    "SandboxSpec",
    "Snapshot",
    "StaticPoolPolicy",
    "Timeouts",
    "UsageError",
    "get_plugin_manager",
    "open_backend",
]
