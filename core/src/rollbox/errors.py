"""Every error rollbox raises, in one tree.

Each error says what went wrong and what to do, and carries ``retryable``: whether the
same work may succeed on a fresh sandbox. Backend-native errors (OSError, HTTP status
codes, ...) are mapped onto this tree at the backend's edge, so callers never see them.

    RollboxError
    ├── UsageError                      the caller must change something; never retryable
    │   ├── InvalidSpecError            a SandboxSpec field is out of range or malformed
    │   │   └── UnsupportedSpecError    a field this backend cannot honour (here)
    │   ├── InvalidCommandError         exec arguments no process could take (NUL, empty argv)
    │   ├── InvalidSettingError         a ROLLBOX_* environment variable is malformed
    │   ├── PathOutsideSandboxError     a path or symlink leads outside the sandbox
    │   ├── CapabilityNotSupportedError the backend does not declare this capability
    │   ├── UnknownBackendError         no plugin registered a backend by that name
    │   ├── PluginError                 a plugin is broken (bad hook, duplicate name)
    │   ├── MissingExtraError           an optional package is not installed
    │   ├── BackendUnavailableError     the backend cannot run here (e.g. no user namespaces)
    │   ├── NotRegularFileError         the file API met a directory, FIFO, socket or device
    │   ├── FileTooLargeError           a file over the sandbox's size cap (file_size_mb)
    │   └── AuthenticationError         a rollbox server refused the token (HTTP 401)
    ├── SandboxError                    a sandbox failed; ``sandbox_id`` says which
    │   ├── CreateFailedError           retryable: the backend could not start it
    │   ├── SandboxLostError            retryable: it died or vanished (mid-command, too)
    │   │   └── SandboxNotFoundError    a server knows no sandbox by that id (closed, reaped)
    │   ├── ServerUnavailableError      retryable: the rollbox server is unreachable or went away
    │   ├── ResetFailedError            retryable: it did not come back clean; quarantined
    │   ├── ExecTimeoutError            the command overran its timeout; its tree was killed
    │   ├── CommandNotFoundError        the program does not exist in the image
    │   ├── SandboxFileNotFoundError    read of a path that does not exist in the sandbox
    │   ├── PortNotOpenError            nothing accepts connections on that port inside
    │   ├── SnapshotFailedError         the sandbox's state could not be copied
    │   ├── WorkloadError               the sandbox's own workload broke it (its memory,
    │   │                               rollbox's helpers): an outcome, never retried
    │   └── ImageError
    │       ├── ImageNotFoundError      no such image anywhere the backend looks
    │       ├── ImageCorruptError       the image exists but cannot be unpacked
    │       └── ImageStoreFullError     retryable: pinned images fill the store right now
    └── PoolError
        ├── PoolClosedError             acquire on a pool that is shutting down
        └── AcquireTimeoutError         retryable: no sandbox became free in time

After most sandbox errors the sandbox cannot be trusted: its holder gives it back as
broken and the pool closes it. ``SANDBOX_SOUND_AFTER`` names the exceptions
(``ExecTimeoutError``, ``CommandNotFoundError``, ``SandboxFileNotFoundError``,
``PortNotOpenError``, ``SnapshotFailedError``): the operation failed, the sandbox did
not, and a reset cleans up after it, so a lease that ends with one is released OK and
the sandbox is reused.
"""

from __future__ import annotations

from typing import ClassVar


class RollboxError(Exception):
    """Base of every rollbox error."""

    retryable: ClassVar[bool] = False
    kind: ClassVar[str] = "error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UsageError(RollboxError):
    """The caller must change something (code, configuration, installation)."""

    kind = "usage"


class InvalidSpecError(UsageError):
    kind = "invalid_spec"


class UnsupportedSpecError(InvalidSpecError):
    """A spec asks for something the backend cannot honour (here): a limit it cannot
    enforce, a network it cannot give. ``field`` and ``backend`` say which."""

    kind = "unsupported_spec"

    def __init__(self, message: str, *, field: str, backend: str) -> None:
        super().__init__(message)
        self.field = field
        self.backend = backend


class InvalidCommandError(UsageError):
    """Arguments of ``exec``/``stream`` that no process could be started with: an empty
    argv or program name, a NUL byte, a malformed environment variable, a timeout or
    output cap that is not positive. Refused before the backend sees them, so a caller's
    mistake never costs the sandbox."""

    kind = "invalid_command"


class InvalidSettingError(UsageError):
    """A ``ROLLBOX_*`` environment variable is malformed; ``variable`` names it."""

    kind = "invalid_setting"

    def __init__(self, message: str, *, variable: str) -> None:
        super().__init__(message)
        self.variable = variable


class PathOutsideSandboxError(UsageError):
    kind = "path_outside_sandbox"


class CapabilityNotSupportedError(UsageError):
    kind = "capability_not_supported"


class UnknownBackendError(UsageError):
    kind = "unknown_backend"


class PluginError(UsageError):
    kind = "plugin"


class MissingExtraError(UsageError, ImportError):
    """An optional dependency is missing; the message says how to install it."""

    kind = "missing_extra"

    def __init__(self, feature: str, extra: str) -> None:
        super().__init__(f"{feature} needs an optional package: {install_hint(extra)}")
        self.extra = extra


def install_hint(extra: str) -> str:
    """How to add the extra ``extra`` of the ``rollbox`` package: in a checkout (what
    works today) and from a package index (once rollbox is published there)."""
    return (f"in a rollbox checkout run `uv sync --inexact --extra {extra}`; "
            f'from a package index, `pip install "rollbox[{extra}]"`')


class BackendUnavailableError(UsageError):
    kind = "backend_unavailable"


class NotRegularFileError(UsageError):
    """The file API moves regular files only: not directories, FIFOs (which could block
    forever), sockets or devices (``/dev/zero`` never ends)."""

    kind = "not_regular_file"


class FileTooLargeError(UsageError):
    """A file over the sandbox's size cap (``resources.file_size_mb``)."""

    kind = "file_too_large"


class AuthenticationError(UsageError):
    """A rollbox server (``rollbox serve``) refused the request's token."""

    kind = "authentication"


class SandboxError(RollboxError):
    """A sandbox failed. ``sandbox_id`` is None when it failed before it had one."""

    kind = "sandbox"

    def __init__(self, message: str, *, sandbox_id: str | None = None) -> None:
        super().__init__(message)
        self.sandbox_id = sandbox_id


class CreateFailedError(SandboxError):
    retryable = True
    kind = "create_failed"


class SandboxLostError(SandboxError):
    retryable = True
    kind = "sandbox_lost"


class SandboxNotFoundError(SandboxLostError):
    """A rollbox server holds no sandbox by that id: closed, reaped after its idle TTL,
    or never created there."""

    kind = "sandbox_not_found"


class ServerUnavailableError(SandboxError):
    """The rollbox server cannot be reached, or went away in the middle of a request.

    Retryable: what the request was doing may or may not have happened on the server,
    so a rollout retries it on a fresh sandbox."""

    retryable = True
    kind = "server_unavailable"


class ResetFailedError(SandboxError):
    retryable = True
    kind = "reset_failed"


class ExecTimeoutError(SandboxError):
    """The command overran; it and every process it started were killed.

    ``stdout`` and ``stderr`` hold what it printed before that.
    """

    kind = "exec_timeout"

    def __init__(
        self,
        message: str,
        *,
        sandbox_id: str | None = None,
        timeout_s: float,
        stdout: bytes = b"",
        stderr: bytes = b"",
    ) -> None:
        super().__init__(message, sandbox_id=sandbox_id)
        self.timeout_s = timeout_s
        self.stdout = stdout
        self.stderr = stderr


class CommandNotFoundError(SandboxError):
    kind = "command_not_found"


class SandboxFileNotFoundError(SandboxError, FileNotFoundError):
    kind = "file_not_found"


class PortNotOpenError(SandboxError):
    """Nothing accepts connections on the port inside the sandbox (yet)."""

    kind = "port_not_open"


class SnapshotFailedError(SandboxError):
    kind = "snapshot_failed"


class WorkloadError(SandboxError):
    """What the sandbox's own commands did broke it: they exhausted one of its limits
    past what a command's own failure shows (its memory with rollbox's agent in it),
    or killed or stopped the helpers rollbox runs commands through, again and again.

    Not retryable, on purpose: in RL a rollout that crashes its sandbox whenever it is
    failing would otherwise be retried on a fresh one, and its failures would vanish
    from the reward. It is an outcome of the rollout (``rollbox.envs`` scores it, 0.0
    by default, and the runner keeps it in its group); ``cause`` says which limit or
    part (``memory``, ``helpers``, ...)."""

    kind = "workload"

    def __init__(self, message: str, *, sandbox_id: str | None = None,
                 cause: str = "workload") -> None:
        super().__init__(message, sandbox_id=sandbox_id)
        self.cause = cause


class ImageError(SandboxError):
    kind = "image"


class ImageNotFoundError(ImageError):
    kind = "image_not_found"


class ImageCorruptError(ImageError):
    kind = "image_corrupt"


class ImageStoreFullError(ImageError):
    retryable = True
    kind = "image_store_full"


class PoolError(RollboxError):
    kind = "pool"


class PoolClosedError(PoolError):
    kind = "pool_closed"


class AcquireTimeoutError(PoolError):
    retryable = True
    kind = "acquire_timeout"


SANDBOX_SOUND_AFTER: tuple[type[SandboxError], ...] = (
    ExecTimeoutError,
    CommandNotFoundError,
    SandboxFileNotFoundError,
    PortNotOpenError,
    SnapshotFailedError,
)
"""Errors after which the sandbox itself is still sound: a reset cleans up after them,
so a pool may reuse it (every other SandboxError means: give it back as broken)."""
