"""The sandbox handle every backend implements, and the values that cross it.

A backend subclasses ``Sandbox`` and implements a handful of ``_``-free abstract methods
(``run``, ``start``, ``read_file``, ``write_file``, ``reset``, ``close``) and, with
the matching capability, ``snapshot`` and ``endpoint``; the public
``exec``/``stream`` normalise arguments once, here, so every backend sees the same
``ExecRequest``: an argv, a full environment, a timeout and an output cap that are
always set. A class that adds behaviour to a sandbox it wraps (metering, faults)
subclasses ``rollbox.wrappers.SandboxWrapper``, which forwards all of this.
"""

from __future__ import annotations

import asyncio
import math
import posixpath
import shlex
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Literal
from urllib.parse import urlsplit

from rollbox.errors import (
    CapabilityNotSupportedError,
    InvalidCommandError,
    PathOutsideSandboxError,
    UsageError,
)

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
    ports: bool = False
    """``Sandbox.endpoint(port)`` reaches a port a process inside listens on, from the
    host, whatever the sandbox's network policy (the sandbox gains no network by it)."""
    seal: bool = False
    """``Sandbox.seal()`` ends every process the sandbox's commands started, daemons
    included, and keeps its files: commands after it (a task's verdict) run with nothing
    of the workload alive to watch, signal, trace or race them."""
    exec_isolation: bool = False
    """No process a command started can trace another command's processes, read or
    write their memory, or take their file descriptors (ptrace, /proc/PID/mem,
    process_vm_writev, pidfd_getfd): what one command leaves running cannot forge a
    later command's result. Processes within one command's tree may (a debugger)."""


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
class Endpoint:
    """Where the host reaches a port a sandbox listens on (``Sandbox.endpoint``).

    ``url`` is ``http://HOST:PORT`` (plain TCP underneath: any protocol on that port
    works, HTTP, WebSocket or not HTTP at all); send ``headers`` with every HTTP request
    (empty when the address alone is enough, e.g. a relay on this host's loopback).
    """

    url: str
    headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def host(self) -> str:
        return urlsplit(self.url).hostname or ""

    @property
    def port(self) -> int:
        return urlsplit(self.url).port or (443 if self.url.startswith("https:") else 80)


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

    async def seal(self) -> None:
        """End the workload: kill every process the sandbox's commands started (daemons,
        background jobs, whatever they left running; a command running now ends killed)
        and keep the files as they are. Afterwards the sandbox runs commands again, with
        nothing of what ran before alive. Backends with ``seal`` implement it; a task's
        verdict runs after it (``rollbox.envs.Task.verdict``).

        Raises SandboxLostError if the sandbox died, or when its processes would not end
        (then it is stopped: nothing run in it afterwards could be trusted)."""
        raise CapabilityNotSupportedError(f"{type(self).__name__} does not support seal")

    async def endpoint(self, port: int) -> Endpoint:
        """How the host reaches ``port``, which a process in this sandbox listens on
        (on 127.0.0.1 or any address inside). Backends with ``ports`` override this.

        The address is valid until the sandbox closes; connecting to it while nothing
        listens inside gives a refused or closed connection, not an error here. Raises
        CapabilityNotSupportedError, or UsageError for a port outside 1-65535."""
        raise CapabilityNotSupportedError(f"{type(self).__name__} does not expose ports")

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
        """Resolve exec arguments against the spec. A str runs through ``/bin/sh -c``.

        Raises InvalidCommandError for arguments no process could be started with (see
        ``check_command``): they are refused here, before a backend sees them."""
        if isinstance(command, str):
            argv: tuple[str, ...] = ("/bin/sh", "-c", command)
        elif isinstance(command, bytes) or not isinstance(command, Sequence):
            raise InvalidCommandError(
                f"command must be a shell string or a list of str, got {type(command).__name__}"
            )
        else:
            argv = tuple(command)
        merged = {**self.base_env, **self.spec.env, **(env or {})}
        merged.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        merged.setdefault("HOME", "/root")
        limit = self.spec.output_limit_bytes if output_limit is None else output_limit
        timeout_s = self.spec.timeouts.exec_s if timeout is None else timeout
        check_command(argv, merged, stdin=stdin, timeout_s=timeout_s, output_limit=limit)
        return ExecRequest(
            argv=argv,
            cwd=resolve_path(cwd or self.spec.workdir, self.spec.workdir),
            env=merged,
            stdin=stdin,
            timeout_s=timeout_s,
            output_limit=limit,
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


def check_command(
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    stdin: bytes | None = None,
    timeout_s: float = 1.0,
    output_limit: int = 1,
) -> None:
    """Refuse, as InvalidCommandError, what no process could be started with.

    An argv or environment string cannot hold a NUL byte (the kernel takes C strings), an
    empty argv or program name names nothing to run, and a variable name cannot be empty
    or hold ``=``. A backend handed such a request might only notice deep inside the
    sandbox and lose it; refusing here keeps a caller's mistake the caller's."""
    if not argv:
        raise InvalidCommandError("command is empty: give a program to run, e.g. ['true']")
    for i, arg in enumerate(argv):
        if not isinstance(arg, str):
            raise InvalidCommandError(
                f"command argument {i} must be a str, got {type(arg).__name__}: {arg!r}")
        if "\0" in arg:
            raise InvalidCommandError(
                f"command argument {i} holds a NUL byte, which no program can receive: {arg!r}")
    if not argv[0]:
        raise InvalidCommandError("the program name (command argument 0) is empty")
    for key, value in env.items():
        if not isinstance(key, str) or not key or "=" in key or "\0" in key:
            raise InvalidCommandError(
                f"environment variable name {key!r} must be a non-empty str without '=' or NUL")
        if not isinstance(value, str) or "\0" in value:
            raise InvalidCommandError(
                f"environment variable {key} must be a str without NUL, got {value!r}")
    _check_sizes(argv, env)
    if stdin is not None and not isinstance(stdin, bytes | bytearray | memoryview):
        raise InvalidCommandError(f"stdin must be bytes, got {type(stdin).__name__}")
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not (
            0 < timeout_s < math.inf):
        raise InvalidCommandError(f"timeout must be a positive number of seconds, "
                                  f"got {timeout_s!r}")
    if isinstance(output_limit, bool) or not isinstance(output_limit, int) or output_limit <= 0:
        raise InvalidCommandError(f"output_limit must be a positive number of bytes, "
                                  f"got {output_limit!r}")


MAX_ARG_BYTES = 128 * 1024
"""The most one argument or ``NAME=value`` may take, its NUL included (Linux's
MAX_ARG_STRLEN): ``execve`` refuses a longer one."""
MAX_ARGS_TOTAL_BYTES = 2 * 1024 * 1024
"""The most argv and the environment may take together, counting each string's NUL and
pointer as the kernel does (Linux's ARG_MAX under the default 8 MiB stack)."""


def _check_sizes(argv: Sequence[str], env: Mapping[str, str]) -> None:
    total = 0
    strings = [(f"command argument {i}", arg) for i, arg in enumerate(argv)]
    strings += [(f"environment variable {key}", f"{key}={value}") for key, value in env.items()]
    for what, text in strings:
        size = len(text.encode("utf-8", "surrogateescape")) + 1
        if size > MAX_ARG_BYTES:
            raise InvalidCommandError(
                f"{what} takes {size} bytes, over the {MAX_ARG_BYTES} one argument or "
                "variable may hold; pass large data as stdin or in a file (write_file)")
        total += size + 8
    if total > MAX_ARGS_TOTAL_BYTES:
        raise InvalidCommandError(
            f"the command's arguments and environment take {total} bytes, over the "
            f"{MAX_ARGS_TOTAL_BYTES} a program can be started with; pass large data as stdin "
            "or in a file (write_file)")


def resolve_path(path: str, workdir: str = "/") -> str:
    """Normalise a sandbox path (relative ones are taken from ``workdir``).

    This is a lexical check only: it refuses NUL bytes and returns an absolute path with
    no ``..``. Backends must still refuse symlinks that lead outside the sandbox.
    """
    if not isinstance(path, str) or not path or "\0" in path:
        raise PathOutsideSandboxError(f"invalid sandbox path {path!r}")
    return posixpath.normpath(posixpath.join(workdir, path)).replace("//", "/")


def check_port(port: object) -> int:
    """``port`` if it is a TCP port number (1-65535), else UsageError."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise UsageError(f"a port is an int in 1-65535, got {port!r}")
    return port


def shell_join(argv: Sequence[str]) -> str:
    """Quote an argv for display or for backends that only take a shell string."""
    return shlex.join(argv)
