"""The sandbox handle every backend implements, and the values that cross it.

A backend subclasses ``Sandbox`` and implements a handful of ``_``-free abstract methods
(``run``, ``start``, ``read_file``, ``write_file``, ``reset``, ``close``); the public
``exec``/``stream`` normalise arguments once, here, so every backend sees the same
``ExecRequest``: an argv, a full environment, a timeout and an output cap that are
always set. A class that adds behaviour to a sandbox it wraps (metering, faults)
subclasses ``rollbox.wrappers.SandboxWrapper``, which forwards all of this.
"""

from __future__ import annotations

import asyncio
import posixpath
import shlex
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Literal

from rollbox.errors import CapabilityNotSupportedError, PathOutsideSandboxError

if TYPE_CHECKING:
    from rollbox.spec import SandboxSpec


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do. The conformance suite skips by these flags, never by name."""

    reset_in_place: bool = False
    snapshot: bool = False
    fork: bool = False
    streaming: bool = False
    signals: bool = False
    network_none: bool = False
    network_host: bool = False
    file_transfer: bool = True
    # Limits, each enforced for the sandbox as a whole (see ``spec.Resources``). A spec
    # asking for one the backend does not declare is refused (UnsupportedSpecError).
    memory_limit: bool = False
    """resources.memory_mb: all processes' memory, tmpfs and memfd pages included."""
    pids_limit: bool = False
    """resources.pids: processes and threads alive at once."""
    cpu_limit: bool = False
    """resources.cpus: a CPU quota; the backend's own work keeps priority over sandboxes."""
    cpu_time_limit: bool = False
    """resources.cpu_seconds: CPU time of one process."""
    file_size_limit: bool = False
    """resources.file_size_mb: the largest file a command may write."""
    disk_limit: bool = False
    """resources.disk_mb: bytes the sandbox may write, all its filesystems together."""
    inode_limit: bool = False
    """resources.inodes: files and directories the sandbox may create."""
    reset_command: bool = False
    """SandboxSpec.reset_command runs after each reset."""
    entrypoint: bool = False
    """SandboxSpec.entrypoint runs in every fresh sandbox (and ready_port is waited for)."""
    isolation: bool = False
    """Processes, files and network of the host are out of reach (a real boundary)."""
    signal_exit_codes: bool = True
    """A command killed by signal N reports exit code -N. Backends that only see a
    shell-style 128+N (e.g. Kubernetes pod exec) set it False."""
    shell: bool = True
    """``exec`` runs real programs: the image has ``/bin/sh`` and the POSIX utilities.
    In-memory fakes set it False; the conformance suite skips shell-based tests then."""


@dataclass(frozen=True)
class ExecRequest:
    """One command, fully resolved: what a backend's ``run``/``start`` receives."""

    argv: tuple[str, ...]
    cwd: str
    env: Mapping[str, str]
    stdin: bytes | None
    timeout_s: float
    output_limit: int


@dataclass(frozen=True)
class ExecResult:
    """How a command ended. ``exit_code`` is negative (-N) when signal N killed it."""

    exit_code: int
    stdout: bytes = b""
    stderr: bytes = b""
    duration_s: float = 0.0
    stdout_truncated: bool = False
    stderr_truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def truncated(self) -> bool:
        return self.stdout_truncated or self.stderr_truncated

    @property
    def text(self) -> str:
        """stdout decoded as UTF-8, undecodable bytes replaced."""
        return self.stdout.decode("utf-8", "replace")


@dataclass(frozen=True)
class OutputChunk:
    stream: Literal["stdout", "stderr"]
    data: bytes


class Process(ABC):
    """A command running in a sandbox, for streaming output and sending signals."""

    @abstractmethod
    def __aiter__(self) -> AsyncIterator[OutputChunk]:
        """Output as it arrives, until both streams close."""

    @abstractmethod
    async def write_stdin(self, data: bytes) -> None: ...

    @abstractmethod
    async def close_stdin(self) -> None: ...

    @abstractmethod
    async def send_signal(self, signum: int) -> None:
        """Deliver ``signum`` to the command's process group."""

    @abstractmethod
    async def wait(self) -> int:
        """The exit code (-N for signal N); raises ExecTimeoutError past the timeout."""


@dataclass(frozen=True)
class Snapshot:
    """An opaque, backend-owned frozen copy of a sandbox's filesystem."""

    id: str
    spec: SandboxSpec
    backend: str
    meta: Mapping[str, str] = field(default_factory=dict)


class Sandbox(ABC):
    """An isolated place to run commands. Use it as an async context manager."""

    base_env: Mapping[str, str] = {}
    """Environment under the spec's (e.g. the image's own ENV); the spec's wins."""

    def __init__(self, sandbox_id: str, spec: SandboxSpec) -> None:
        self.id = sandbox_id
        self.spec = spec

    # -- what backends implement -------------------------------------------------------

    @abstractmethod
    async def run(self, request: ExecRequest) -> ExecResult:
        """Run one command to completion and return how it ended.

        This is the method every backend implements and every caller's ``exec`` ends in
        (through any wrappers). ``request`` is fully resolved (``Sandbox.request``):

        * ``argv``: the program and its arguments, run as given: no shell is added (a
          string command arrives as ``/bin/sh -c ...``). ``argv[0]`` is looked up on the
          ``PATH`` of ``env``.
        * ``cwd``: an absolute, normalised path inside the sandbox to start in.
        * ``env``: the command's whole environment (image, spec, call, defaults merged):
          use exactly this, nothing of the host's or the backend's own.
        * ``stdin``: bytes written to the command, then end of file; ``None`` means end
          of file at once (never the backend's own stdin).
        * ``timeout_s``: wall-clock limit of the command.
        * ``output_limit``: bytes kept per stream; more is read and dropped (the
          command never blocks on a full pipe) and flagged ``stdout_truncated`` /
          ``stderr_truncated``.

        Returns an ``ExecResult``: stdout and stderr kept apart, as bytes; ``exit_code``
        as the program returned it, or -N when signal N killed it (128+N on backends
        without ``signal_exit_codes``); ``duration_s``. A non-zero exit is a result,
        never an error.

        Raises (only errors of ``rollbox.errors``, backend-native ones mapped):

        * ``ExecTimeoutError`` past ``timeout_s``, after the whole process tree the
          command started (daemons included) was killed; it carries the output so far.
          The sandbox stays usable.
        * ``CommandNotFoundError`` when ``argv[0]`` does not exist in the image;
          ``SandboxFileNotFoundError`` when ``cwd`` does not (a backend that changes
          directory through a shell may report that shell's failure as the exit code).
        * ``SandboxLostError`` (retryable) when the sandbox died or was closed, before
          or while the command ran; never a made-up exit code.

        Many ``run`` calls may be in flight on one sandbox at once, each with its own
        output. A cancelled ``run`` must not leave its command behind: the backend kills
        the tree (the local backend before the cancellation propagates).
        """

    async def start(self, request: ExecRequest) -> Process:
        """Start one command and return it running, for streaming and signals.

        The streaming twin of ``run`` (what ``stream`` ends in), for backends that
        declare ``streaming``; the default raises ``CapabilityNotSupportedError``.
        ``request`` means what it means for ``run``, except that ``stdin`` is written by
        the caller through ``Process.write_stdin``/``close_stdin``.

        The returned ``Process`` yields ``OutputChunk``s as the command writes them,
        each tagged ``stdout`` or ``stderr``, until both streams close (at most
        ``output_limit`` bytes per stream); ``send_signal`` signals the command's
        process group (backends with ``signals``); ``wait`` returns the exit code as
        ``run`` reports it, or raises ``ExecTimeoutError`` past ``timeout_s`` (the tree
        killed) or ``SandboxLostError`` if the sandbox died. ``start`` itself raises
        what ``run`` raises before a command runs (``CommandNotFoundError`` may also
        come from ``wait``).
        """
        raise CapabilityNotSupportedError(f"{type(self).__name__} does not support streaming")

    @abstractmethod
    async def read_file(self, path: str) -> bytes:
        """Bytes of a file inside the sandbox; refuses paths or symlinks leading outside."""

    @abstractmethod
    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        """Create or replace a file (parents created); refuses paths leading outside."""

    async def upload(self, local: str | Path, remote: str) -> None:
        """Copy a local file into the sandbox (backends may add directory support)."""
        src = Path(local)
        data, mode = await asyncio.to_thread(lambda: (src.read_bytes(), src.stat().st_mode))
        await self.write_file(remote, data, mode=mode & 0o777)

    async def download(self, remote: str, local: str | Path) -> None:
        """Copy a file out of the sandbox."""
        data = await self.read_file(remote)
        await asyncio.to_thread(Path(local).write_bytes, data)

    @abstractmethod
    async def reset(self) -> None:
        """Bring the sandbox back to its image's state: files, processes, environment.
        Raise ResetFailedError if that cannot be guaranteed."""

    async def snapshot(self) -> Snapshot:
        raise CapabilityNotSupportedError(f"{type(self).__name__} does not support snapshots")

    async def prepare(self) -> None:
        """Get ready for a fast first command (start helpers a backend starts lazily).

        Pools call it on sandboxes they create; the default does nothing."""

    async def ping(self) -> bool:
        """Cheap health check before a pool hands the sandbox out."""
        try:
            return (await self.exec(["true"], timeout=10)).ok
        except Exception:
            return False

    @abstractmethod
    async def close(self) -> None:
        """Release everything (processes, mounts, directories, remote objects). Idempotent."""

    # -- what callers use --------------------------------------------------------------

    def request(
        self,
        command: str | Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
        timeout: float | None = None,
        output_limit: int | None = None,
    ) -> ExecRequest:
        """Resolve exec arguments against the spec. A str runs through ``/bin/sh -c``."""
        if isinstance(command, str):
            argv: tuple[str, ...] = ("/bin/sh", "-c", command)
        else:
            argv = tuple(command)
            if not argv or not all(isinstance(a, str) for a in argv):
                raise TypeError("command must be a shell string or a non-empty list of str")
        merged = {**self.base_env, **self.spec.env, **(env or {})}
        merged.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        merged.setdefault("HOME", "/root")
        return ExecRequest(
            argv=argv,
            cwd=resolve_path(cwd or self.spec.workdir, self.spec.workdir),
            env=merged,
            stdin=stdin,
            timeout_s=timeout if timeout is not None else self.spec.timeouts.exec_s,
            output_limit=output_limit or self.spec.output_limit_bytes,
        )

    async def exec(
        self,
        command: str | Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
        timeout: float | None = None,
        output_limit: int | None = None,
    ) -> ExecResult:
        """Run ``command`` (argv list, or a shell string) and return how it ended."""
        return await self.run(
            self.request(
                command, cwd=cwd, env=env, stdin=stdin, timeout=timeout, output_limit=output_limit
            )
        )

    async def stream(
        self,
        command: str | Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        output_limit: int | None = None,
    ) -> Process:
        """Start ``command`` and return a Process to stream its output and signal it."""
        return await self.start(
            self.request(command, cwd=cwd, env=env, timeout=timeout, output_limit=output_limit)
        )

    async def __aenter__(self) -> Sandbox:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.id} image={self.spec.image!r}>"


def resolve_path(path: str, workdir: str = "/") -> str:
    """Normalise a sandbox path (relative ones are taken from ``workdir``).

    This is a lexical check only: it refuses NUL bytes and returns an absolute path with
    no ``..``. Backends must still refuse symlinks that lead outside the sandbox.
    """
    if not isinstance(path, str) or not path or "\0" in path:
        raise PathOutsideSandboxError(f"invalid sandbox path {path!r}")
    return posixpath.normpath(posixpath.join(workdir, path)).replace("//", "/")


def shell_join(argv: Sequence[str]) -> str:
    """Quote an argv for display or for backends that only take a shell string."""
    return shlex.join(argv)
