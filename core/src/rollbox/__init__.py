"""rollbox: sandboxes for agentic RL and evaluation, fast enough that the GPUs never wait.

    import rollbox
    async with rollbox.open_backend() as backend, rollbox.Pool(backend) as pool:
        async with pool.lease(rollbox.SandboxSpec(image="host")) as sandbox:
            print((await sandbox.exec("echo hello")).text)
"""

from __future__ import annotations

import os
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
from rollbox.plugins import backend_class, get_plugin_manager
from rollbox.pool import Lease, NoPoolPolicy, Outcome, Pool, PoolPolicy, StaticPoolPolicy
from rollbox.sandbox import (
    Capabilities,
    Endpoint,
    ExecRequest,
    ExecResult,
    OutputChunk,
    Process,
    Sandbox,
    Snapshot,
)
from rollbox.spec import Network, Resources, SandboxSpec, Timeouts

__version__ = "0.1.0"

DEFAULT_BACKEND = "local"


def open_backend(name: str | None = None, **options: Any) -> Backend:
    """The backend called ``name`` (default: ``$ROLLBOX_BACKEND``, else ``local``).

    Moving from a laptop to a cluster is this one setting.
    """
    chosen = name or os.environ.get("ROLLBOX_BACKEND") or DEFAULT_BACKEND
    return backend_class(get_plugin_manager(), chosen)(**options)


__all__ = [
    "Backend",
    "Capabilities",
    "Diagnostic",
    "Endpoint",
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
