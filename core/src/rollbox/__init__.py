"""rollbox: sandboxes for agentic RL and evaluation, fast enough that the GPUs never wait.

    import rollbox
    async with rollbox.open_backend() as backend, rollbox.Pool(backend) as pool:
        async with pool.lease(rollbox.SandboxSpec(image="host")) as sandbox:
            print((await sandbox.exec("echo hello")).text)

What the README uses is here: specs, sandboxes, backends, pools and every policy, the
runner (``rollbox.runner``, ``run_rollouts``, ``RetryPolicy``), the environment contract
(``Task``, ``Session``; more in ``rollbox.envs``), the wrappers and every error
(``rollbox.errors`` draws their tree).
"""

from __future__ import annotations

from typing import Any

from rollbox import runner
from rollbox.backend import Backend, Diagnostic
from rollbox.envs import Judgement, Session, StepOutcome, Task, TaskSource, load_tasks
from rollbox.errors import (
    SANDBOX_SOUND_AFTER,
    AcquireTimeoutError,
    AuthenticationError,
    BackendUnavailableError,
    CapabilityNotSupportedError,
    CommandNotFoundError,
    CreateFailedError,
    ExecTimeoutError,
    FileTooLargeError,
    ImageCorruptError,
    ImageError,
    ImageNotFoundError,
    ImageStoreFullError,
    InvalidCommandError,
    InvalidSettingError,
    InvalidSpecError,
    MissingExtraError,
    NotRegularFileError,
    PathOutsideSandboxError,
    PluginError,
    PoolClosedError,
    PoolError,
    PortNotOpenError,
    ResetFailedError,
    RollboxError,
    SandboxError,
    SandboxFileNotFoundError,
    SandboxLostError,
    SandboxNotFoundError,
    ServerUnavailableError,
    SnapshotFailedError,
    UnknownBackendError,
    UnsupportedSpecError,
    UsageError,
    WorkloadError,
)
from rollbox.lease import Lease, Outcome
from rollbox.metrics import Metrics
from rollbox.plugins import DEFAULT_BACKEND, backend_class, get_plugin_manager
from rollbox.policies import LookaheadPolicy, NoPoolPolicy, PoolPolicy, StaticPoolPolicy
from rollbox.pool import Pool
from rollbox.results import Failure, RolloutOutput, RolloutResult, RunReport
from rollbox.runner import GroupPolicy, RetryPolicy, run_rollouts, run_rollouts_sync
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
from rollbox.wrappers import BackendWrapper, SandboxWrapper

__version__ = "0.1.0"


def open_backend(name: str | None = None, **options: Any) -> Backend:
    """The backend called ``name`` (default: ``$ROLLBOX_BACKEND``, else ``local``).

    Moving from a laptop to a cluster is this one setting.
    """
    return backend_class(get_plugin_manager(), name)(**options)


__all__ = [
    "DEFAULT_BACKEND",
    "SANDBOX_SOUND_AFTER",
    "AcquireTimeoutError",
    "AuthenticationError",
    "Backend",
    "BackendUnavailableError",
    "BackendWrapper",
    "Capabilities",
    "CapabilityNotSupportedError",
    "CommandNotFoundError",
    "CreateFailedError",
    "Diagnostic",
    "Endpoint",
    "ExecRequest",
    "ExecResult",
    "ExecTimeoutError",
    "Failure",
    "FileTooLargeError",
    "GroupPolicy",
    "ImageCorruptError",
    "ImageError",
    "ImageNotFoundError",
    "ImageStoreFullError",
    "InvalidCommandError",
    "InvalidSettingError",
    "InvalidSpecError",
    "Judgement",
    "Lease",
    "LookaheadPolicy",
    "Metrics",
    "MissingExtraError",
    "Network",
    "NoPoolPolicy",
    "NotRegularFileError",
    "Outcome",
    "OutputChunk",
    "PathOutsideSandboxError",
    "PluginError",
    "Pool",
    "PoolClosedError",
    "PoolError",
    "PoolPolicy",
    "PortNotOpenError",
    "Process",
    "ResetFailedError",
    "Resources",
    "RetryPolicy",
    "RollboxError",
    "RolloutOutput",
    "RolloutResult",
    "RunReport",
    "Sandbox",
    "SandboxError",
    "SandboxFileNotFoundError",
    "SandboxLostError",
    "SandboxNotFoundError",
    "SandboxSpec",
    "SandboxWrapper",
    "ServerUnavailableError",
    "Session",
    "Snapshot",
    "SnapshotFailedError",
    "StaticPoolPolicy",
    "StepOutcome",
    "Task",
    "TaskSource",
    "Timeouts",
    "UnknownBackendError",
    "UnsupportedSpecError",
    "UsageError",
    "WorkloadError",
    "get_plugin_manager",
    "load_tasks",
    "open_backend",
    "run_rollouts",
    "run_rollouts_sync",
    "runner",
]
