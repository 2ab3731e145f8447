"""Deliberately broken backends that run real commands on this machine (as whoever runs
the tests) while claiming isolation and limits they do not have.

Each breaks what a shell test of the conformance suite checks; ``test_suite_can_fail.py``
runs the suite against them. They stay cheap and harmless: files of their own go to
private temporary directories, what they start on the host is killed by ``aclose``
(found by a tag in its environment), and where the breakage is reading a device or
waiting on a FIFO forever it is simulated, never done.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
import signal
import socket
import stat
import tempfile
import uuid
from pathlib import Path
from typing import Any

from rollbox import Backend, Capabilities, ExecRequest, ExecResult, Sandbox, SandboxSpec, Snapshot
from rollbox.errors import (
    CommandNotFoundError,
    ExecTimeoutError,
    SandboxFileNotFoundError,
    SandboxLostError,
)
from rollbox.sandbox import Endpoint, check_port, resolve_path

SCRATCH = Path(tempfile.gettempdir())
"""The host directory the suite's shell tests work in (``scratch_dir``); the test that
runs the suite against these backends sets it."""


class HostShellSandbox(Sandbox):
    """Runs commands on the host. Its files live in a private directory; a timeout
    kills only the command's first process; close kills nothing."""

    backend: HostShellBackend

    def __init__(self, backend: HostShellBackend, spec: SandboxSpec) -> None:
        super().__init__(f"host-{uuid.uuid4().hex[:8]}", spec)
        self.backend = backend
        self._root: Path | None = None
        self.closed = False

    @property
    def root(self) -> Path:
        """The private directory of its files, made on first use (an owner killed in
        the crash test leaves none behind)."""
        if self._root is None:
            self._root = Path(tempfile.mkdtemp(prefix="rbx-hostshell-"))
        return self._root

    def _path(self, path: str) -> Path:
        return self.root / resolve_path(path, self.spec.workdir).lstrip("/")

    def _spawn_options(self) -> dict[str, Any]:
        """Extra keyword arguments for starting a command (variants add to them)."""
        return {}

    def _on_timeout(self, proc: asyncio.subprocess.Process) -> None:
        proc.kill()  # only the first process: the rest of the tree lives on

    async def run(self, request: ExecRequest) -> ExecResult:
        if self.closed:
            raise SandboxLostError("closed", sandbox_id=self.id)
        env = {**request.env, "RBX_HOSTSHELL_TAG": self.backend.tag,
               "RBX_HOSTSHELL_SANDBOX": self.id}
        try:
            proc = await asyncio.create_subprocess_exec(
                *request.argv, cwd=request.cwd, env=env,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, **self._spawn_options(),
            )
        except FileNotFoundError as exc:
            raise CommandNotFoundError(str(exc), sandbox_id=self.id) from None
        try:
            async with asyncio.timeout(request.timeout_s):
                out, err = await proc.communicate(request.stdin)
        except TimeoutError:
            self._on_timeout(proc)
            raise ExecTimeoutError("timed out", sandbox_id=self.id,
                                   timeout_s=request.timeout_s) from None
        cap = request.output_limit
        code = proc.returncode if proc.returncode is not None else -1
        return ExecResult(code, out[:cap], err[:cap], stdout_truncated=len(out) > cap,
                          stderr_truncated=len(err) > cap)

    async def read_file(self, path: str) -> bytes:
        try:
            return self._path(path).read_bytes()
        except FileNotFoundError:
            raise SandboxFileNotFoundError(path, sandbox_id=self.id) from None

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        target = self._path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        target.chmod(mode)

    async def reset(self) -> None:
        return None

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self._root is not None:
                shutil.rmtree(self._root, ignore_errors=True)


class HostShellBackend(Backend):
    name = "broken-host-shell"
    capabilities = Capabilities(
        isolation=True, shell=True, file_size_limit=True, pids_limit=True
    )
    sandbox_class: type[HostShellSandbox] = HostShellSandbox

    def __init__(self) -> None:
        self.tag = uuid.uuid4().hex

    async def create(self, spec: SandboxSpec) -> HostShellSandbox:
        return self.sandbox_class(self, spec)

    async def aclose(self) -> None:
        """Clean up after the test (not part of the broken behaviour): kill every host
        process started by this backend, found by the tag in its environment."""
        _kill_tagged(f"RBX_HOSTSHELL_TAG={self.tag}".encode())


def _kill_tagged(needle: bytes) -> None:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                os.kill(int(entry.name), signal.SIGKILL)


# -- commands -------------------------------------------------------------------------


class _LeakingFdSandbox(HostShellSandbox):
    def _spawn_options(self) -> dict[str, Any]:
        assert isinstance(self.backend, LeaksAnFd)
        return {"pass_fds": (self.backend.control.fileno(),)}


class LeaksAnFd(HostShellBackend):
    """Every command inherits the backend's end of a control socket (at fd 3 or so)."""

    sandbox_class = _LeakingFdSandbox

    def __init__(self) -> None:
        super().__init__()
        self.control, self._peer = socket.socketpair()

    async def aclose(self) -> None:
        await super().aclose()
        self.control.close()
        self._peer.close()


class _KillAllOnTimeoutSandbox(HostShellSandbox):
    def _on_timeout(self, proc: asyncio.subprocess.Process) -> None:
        _kill_tagged(f"RBX_HOSTSHELL_SANDBOX={self.id}".encode())


class TimeoutKillsEverything(HostShellBackend):
    """A timeout kills every process of the sandbox, other commands' daemons too."""

    sandbox_class = _KillAllOnTimeoutSandbox


class _HighPrioritySandbox(HostShellSandbox):
    def _spawn_options(self) -> dict[str, Any]:
        return {"preexec_fn": _raise_priority}


def _raise_priority() -> None:
    with contextlib.suppress(OSError):  # not root: the machine's load decides
        os.nice(-15)


class ClaimsEveryLimit(HostShellBackend):
    """Declares every limit and enforces none. Its commands run at a high priority, so
    that ignoring a CPU quota shows even on a busy machine."""

    capabilities = dataclasses.replace(
        HostShellBackend.capabilities, memory_limit=True, cpu_limit=True, disk_limit=True,
        inode_limit=True, cpu_time_limit=True)
    sandbox_class = _HighPrioritySandbox


# -- files and snapshots on host paths --------------------------------------------------


class _HostPathsSandbox(HostShellSandbox):
    """Paths under the temporary directory are the host's own, followed as this process
    (symlinks included); other paths go to the private directory."""

    backend: HostPathsBackend

    def __init__(self, backend: HostPathsBackend, spec: SandboxSpec,
                 tree: Path | None = None) -> None:
        super().__init__(backend, spec)
        self.tree = tree  # a fork's copy of SCRATCH

    def _path(self, path: str) -> Path:
        host = Path(resolve_path(path, self.spec.workdir))
        if self.tree is not None and host.is_relative_to(SCRATCH):
            return self.tree / host.relative_to(SCRATCH)
        if host.is_relative_to(tempfile.gettempdir()):
            return host
        return super()._path(path)

    async def _special(self, target: Path) -> bytes | None:
        """What a naive backend does with a device or FIFO, simulated: a device gives
        (a little of) what it has, a FIFO blocks the caller and every other file call
        of the backend until the backend closes."""
        mode = _mode(target)
        if mode is None:
            return None
        if stat.S_ISCHR(mode):
            return bytes(1 << 20)  # stands for an endless read; never read for real
        if stat.S_ISFIFO(mode):
            await self.backend.closing.wait()
            raise SandboxLostError("the backend closed", sandbox_id=self.id)
        return None

    async def read_file(self, path: str) -> bytes:
        async with self.backend.files_lock:
            target = self._path(path)
            special = await self._special(target)
            if special is not None:
                return special
            try:
                return target.read_bytes()
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                raise SandboxFileNotFoundError(path, sandbox_id=self.id) from None

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        async with self.backend.files_lock:
            target = self._path(path)
            await self._special(target)
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                raise SandboxFileNotFoundError(path, sandbox_id=self.id) from None

    async def snapshot(self) -> Snapshot:
        """Copies SCRATCH as this process, following every symlink in it."""
        copy = Path(tempfile.mkdtemp(prefix="rbx-hostshell-snap-"))
        with contextlib.suppress(shutil.Error, OSError):  # names vanish while copying
            shutil.copytree(SCRATCH, copy / "tree", symlinks=False,
                            ignore_dangling_symlinks=True)
        self.backend.snapshots.add(copy)
        return Snapshot(id=copy.name, spec=self.spec, backend=self.backend.name,
                        meta={"copy": str(copy)})


def _mode(path: Path) -> int | None:
    try:
        return path.stat().st_mode
    except OSError:
        return None


class HostPathsBackend(HostShellBackend):
    """The file API and snapshots work on the host's paths as this process: they follow
    the sandbox's symlinks out to the host, and a FIFO holds up every file call."""

    capabilities = dataclasses.replace(HostShellBackend.capabilities, snapshot=True,
                                       fork=True)
    sandbox_class = _HostPathsSandbox

    def __init__(self) -> None:
        super().__init__()
        self.files_lock = asyncio.Lock()
        self.closing = asyncio.Event()
        self.snapshots: set[Path] = set()

    async def fork(self, snapshot: Snapshot) -> _HostPathsSandbox:
        return _HostPathsSandbox(self, snapshot.spec, Path(snapshot.meta["copy"]) / "tree")

    async def drop_snapshot(self, snapshot: Snapshot) -> None:
        copy = Path(snapshot.meta["copy"])
        self.snapshots.discard(copy)
        shutil.rmtree(copy, ignore_errors=True)

    async def aclose(self) -> None:
        self.closing.set()
        await super().aclose()
        for copy in self.snapshots:
            shutil.rmtree(copy, ignore_errors=True)


class _UnsealedSandbox(_HostPathsSandbox):
    async def seal(self) -> None:
        return None  # claims to end the workload; every process of it lives on


class ClaimsSealAndIsolation(HostPathsBackend):
    """Declares ``seal`` and ``exec_isolation`` and gives neither: a seal leaves every
    process running, and a command's processes can trace a later command's (the host's
    own rules, as whoever runs the tests)."""

    capabilities = dataclasses.replace(HostPathsBackend.capabilities, seal=True,
                                       exec_isolation=True)
    sandbox_class = _UnsealedSandbox


class HostPorts(HostShellBackend):
    """Claims ports, and its sandboxes' listeners are on the host's loopback: reachable
    without the endpoint, by anyone."""

    name = "broken-host-ports"
    capabilities = dataclasses.replace(HostShellBackend.capabilities, ports=True)

    async def create(self, spec: SandboxSpec) -> HostShellSandbox:
        sandbox = self.sandbox_class(self, spec)
        sandbox.endpoint = _host_endpoint  # type: ignore[method-assign]
        return sandbox


async def _host_endpoint(port: int) -> Endpoint:
    return Endpoint(f"http://127.0.0.1:{check_port(port)}")
