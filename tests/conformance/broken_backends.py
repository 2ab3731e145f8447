"""Deliberately broken backends: each breaks one property the conformance suite checks.

``test_suite_can_fail.py`` runs the suite against them and expects failures; a suite
that passes them would prove nothing. Most are FakeBackend with one thing wrong; the
host-shell backend runs real commands on this machine while claiming isolation.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
import signal
import tempfile
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

from rollbox import Backend, Capabilities, ExecRequest, ExecResult, Sandbox, SandboxSpec, Snapshot
from rollbox.errors import (
    CommandNotFoundError,
    CreateFailedError,
    ExecTimeoutError,
    SandboxFileNotFoundError,
    SandboxLostError,
)
from rollbox.sandbox import Endpoint, check_port, resolve_path
from rollbox.testing import FakeBackend, FakeSandbox, builtin_handler


class IsolatedFake(FakeBackend):
    """The intact fake, declaring the isolation it truly has (nothing it runs reaches
    the host): the control that the isolation tests pass when nothing is broken."""

    capabilities = dataclasses.replace(FakeBackend.capabilities, isolation=True)


class _BrokenFake(FakeBackend):
    """A FakeBackend whose sandboxes are of ``sandbox_class``."""

    sandbox_class: ClassVar[type[FakeSandbox]] = FakeSandbox

    async def _make(self, spec: SandboxSpec, files: Mapping[str, bytes]) -> FakeSandbox:
        sandbox = await super()._make(spec, files)
        sandbox.__class__ = self.sandbox_class
        return sandbox


# -- exec -------------------------------------------------------------------------------


class _NoTimeoutSandbox(FakeSandbox):
    async def run(self, request: ExecRequest) -> ExecResult:
        return await super().run(dataclasses.replace(request, timeout_s=3600.0))


class IgnoresTimeouts(_BrokenFake):
    sandbox_class = _NoTimeoutSandbox


async def _wrong_exit_codes(sandbox: FakeSandbox, request: ExecRequest) -> ExecResult:
    result = await builtin_handler(sandbox, request)
    return dataclasses.replace(result, exit_code=0)


class WrongExitCodes(FakeBackend):
    def __init__(self) -> None:
        super().__init__(_wrong_exit_codes)


class _SilentCapSandbox(FakeSandbox):
    async def run(self, request: ExecRequest) -> ExecResult:
        result = await super().run(request)
        return dataclasses.replace(result, stdout_truncated=False, stderr_truncated=False)


class TruncatesSilently(_BrokenFake):
    sandbox_class = _SilentCapSandbox


# -- lifecycle and failures ---------------------------------------------------------------


class _LeakySandbox(FakeSandbox):
    async def close(self) -> None:
        self.closed = True  # but never forgotten by the backend: a leak


class LeaksOnClose(_BrokenFake):
    sandbox_class = _LeakySandbox


class LosesSilently(FakeBackend):
    """A killed sandbox keeps answering as if nothing happened."""

    def kill(self, sandbox_id: str) -> None:
        return None


class WrongImageError(FakeBackend):
    """A missing image surfaces as a retryable create failure (it is not retryable)."""

    async def create(self, spec: SandboxSpec) -> FakeSandbox:
        if spec.image not in self.images:
            raise CreateFailedError(f"could not start {spec.image}")
        return await super().create(spec)


# -- concurrency --------------------------------------------------------------------------


async def _cross_talk(sandbox: FakeSandbox, request: ExecRequest) -> ExecResult:
    """Keeps one stdin buffer per sandbox: concurrent commands read each other's."""
    if request.argv[0] == "cat" and request.stdin is not None:
        sandbox.__dict__["buffer"] = request.stdin
        await asyncio.sleep(0.001)
        return ExecResult(0, stdout=sandbox.__dict__["buffer"])
    return await builtin_handler(sandbox, request)


class CrossTalk(FakeBackend):
    def __init__(self) -> None:
        super().__init__(_cross_talk)


class _SerialSandbox(FakeSandbox):
    async def run(self, request: ExecRequest) -> ExecResult:
        lock = self.__dict__.setdefault("lock", asyncio.Lock())
        async with lock:
            return await super().run(request)


class SerialExec(_BrokenFake):
    sandbox_class = _SerialSandbox


# -- files, reset, snapshots ----------------------------------------------------------------


class _EscapingFilesSandbox(FakeSandbox):
    """Resolves paths lexically, then uses them on the host (kept to the temp dir)."""

    def _host(self, path: str) -> Path | None:
        host = Path(resolve_path(path, self.spec.workdir))
        return host if host.is_relative_to(tempfile.gettempdir()) else None

    async def read_file(self, path: str) -> bytes:
        host = self._host(path)
        if host is not None and host.exists():
            return host.read_bytes()
        return await super().read_file(path)

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        host = self._host(path)
        if host is not None and host.parent.exists():
            host.write_bytes(data)
        await super().write_file(path, data, mode=mode)


class FilesEscape(_BrokenFake):
    sandbox_class = _EscapingFilesSandbox


class _NoResetSandbox(FakeSandbox):
    async def reset(self) -> None:
        self.backend.resets += 1  # claims success, keeps every file


class ResetKeepsFiles(_BrokenFake):
    sandbox_class = _NoResetSandbox


class _SharedSnapshotSandbox(FakeSandbox):
    async def snapshot(self) -> Snapshot:
        snap = Snapshot(id=f"snap-{uuid.uuid4().hex}", spec=self.spec, backend="fake")
        self.backend.snapshots[snap.id] = self.files  # the live dict, not a copy
        return snap


class SharedSnapshots(_BrokenFake):
    sandbox_class = _SharedSnapshotSandbox

    async def fork(self, snapshot: Snapshot) -> FakeSandbox:
        sandbox = await super().fork(snapshot)
        sandbox.files = self.snapshots[snapshot.id]
        return sandbox


# -- isolation ----------------------------------------------------------------------------


async def _leak_env(sandbox: FakeSandbox, request: ExecRequest) -> ExecResult:
    return await builtin_handler(
        sandbox, dataclasses.replace(request, env={**os.environ, **request.env})
    )


class LeaksHostEnv(FakeBackend):
    """Claims isolation, but commands see the host's environment."""

    capabilities = dataclasses.replace(FakeBackend.capabilities, isolation=True)

    def __init__(self) -> None:
        super().__init__(_leak_env)


class SharedFiles(_BrokenFake):
    """Claims isolation, but every sandbox sees the same files."""

    capabilities = dataclasses.replace(FakeBackend.capabilities, isolation=True)

    async def _make(self, spec: SandboxSpec, files: Mapping[str, bytes]) -> FakeSandbox:
        sandbox = await super()._make(spec, files)
        sandbox.files = self.__dict__.setdefault("shared", {})
        return sandbox


# -- a real shell on the host, claiming isolation and limits it does not have -------------


class HostShellSandbox(Sandbox):
    """Runs commands on the host. Its files live in a private directory; a timeout
    kills only the command's first process; close kills nothing."""

    def __init__(self, backend: HostShellBackend, spec: SandboxSpec) -> None:
        super().__init__(f"host-{uuid.uuid4().hex[:8]}", spec)
        self.backend = backend
        self.root = Path(tempfile.mkdtemp(prefix="rbx-hostshell-"))
        self.closed = False

    def _path(self, path: str) -> Path:
        return self.root / resolve_path(path, self.spec.workdir).lstrip("/")

    async def run(self, request: ExecRequest) -> ExecResult:
        if self.closed:
            raise SandboxLostError("closed", sandbox_id=self.id)
        env = {**request.env, "RBX_HOSTSHELL_TAG": self.backend.tag}
        try:
            proc = await asyncio.create_subprocess_exec(
                *request.argv, cwd=request.cwd, env=env,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except FileNotFoundError as exc:
            raise CommandNotFoundError(str(exc), sandbox_id=self.id) from None
        try:
            async with asyncio.timeout(request.timeout_s):
                out, err = await proc.communicate(request.stdin)
        except TimeoutError:
            proc.kill()  # only the first process: the rest of the tree lives on
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
            shutil.rmtree(self.root, ignore_errors=True)


class HostShellBackend(Backend):
    name = "broken-host-shell"
    capabilities: ClassVar[Capabilities] = Capabilities(
        isolation=True, shell=True, file_size_limit=True, pids_limit=True
    )

    def __init__(self) -> None:
        self.tag = uuid.uuid4().hex

    async def create(self, spec: SandboxSpec) -> HostShellSandbox:
        return HostShellSandbox(self, spec)

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


class HostPorts(HostShellBackend):
    """Claims ports, and its sandboxes' listeners are on the host's loopback: reachable
    without the endpoint, by anyone."""

    name = "broken-host-ports"
    capabilities: ClassVar[Capabilities] = dataclasses.replace(
        HostShellBackend.capabilities, ports=True)

    async def create(self, spec: SandboxSpec) -> HostShellSandbox:
        sandbox = HostShellSandbox(self, spec)
        sandbox.endpoint = _host_endpoint  # type: ignore[method-assign]
        return sandbox


async def _host_endpoint(port: int) -> Endpoint:
    return Endpoint(f"http://127.0.0.1:{check_port(port)}")
