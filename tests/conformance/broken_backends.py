"""Deliberately broken backends: each breaks one property the conformance suite checks.

``test_suite_can_fail.py`` runs the suite against them and expects failures; a suite
that passes them would prove nothing. Most are FakeBackend with one thing wrong; the
host-shell backends (``broken_host_shells.py``, re-exported here) run real commands on
this machine while claiming isolation.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import ClassVar

from broken_host_shells import (
    ClaimsEveryLimit,
    ClaimsSealAndIsolation,
    HostPathsBackend,
    HostPorts,
    HostShellBackend,
    LeaksAnFd,
    TimeoutKillsEverything,
)
from rollbox import ExecRequest, ExecResult, SandboxSpec, Snapshot
from rollbox.errors import CreateFailedError, ExecTimeoutError
from rollbox.sandbox import resolve_path
from rollbox.testing import FakeBackend, FakeSandbox, builtin_handler

__all__ = [  # the host-shell ones are run from here too
    "ClaimsEveryLimit", "ClaimsSealAndIsolation", "HostPathsBackend", "HostPorts",
    "HostShellBackend", "LeaksAnFd", "TimeoutKillsEverything",
]


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


class _FragileTimeoutsSandbox(FakeSandbox):
    """Dies when a command times out while another of its commands runs (as an agent
    whose reaper trips over a pid it already forgot)."""

    async def run(self, request: ExecRequest) -> ExecResult:
        self.__dict__["running"] = self.__dict__.get("running", 0) + 1
        try:
            return await super().run(request)
        except ExecTimeoutError:
            if self.__dict__["running"] > 1:
                self.lost = True
            raise
        finally:
            self.__dict__["running"] -= 1


class LosesSandboxesUnderTimeouts(_BrokenFake):
    sandbox_class = _FragileTimeoutsSandbox


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


class _UncheckedSandbox(FakeSandbox):
    """Builds its requests without core's checks, and dies of what it cannot run (as a
    backend that passes a NUL byte or an empty argv to its agent would)."""

    def request(self, command: str | Sequence[str], *, cwd: str | None = None,
                env: Mapping[str, str] | None = None, stdin: bytes | None = None,
                timeout: float | None = None, output_limit: int | None = None) -> ExecRequest:
        argv = ("/bin/sh", "-c", command) if isinstance(command, str) else tuple(command)
        return ExecRequest(argv, cwd or self.spec.workdir, {**self.spec.env, **(env or {})},
                           stdin, timeout or self.spec.timeouts.exec_s,
                           output_limit or self.spec.output_limit_bytes)

    async def run(self, request: ExecRequest) -> ExecResult:
        if not request.argv or not request.argv[0] or any("\0" in a for a in request.argv):
            self.lost = True
        return await super().run(request)


class DiesOfBadCommands(_BrokenFake):
    sandbox_class = _UncheckedSandbox


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


class _DeviceReadingSandbox(FakeSandbox):
    async def read_file(self, path: str) -> bytes:
        if resolve_path(path, self.spec.workdir) in ("/dev/zero", "/dev/urandom"):
            return bytes(1 << 20)  # stands for an endless read; simulated, never done
        return await super().read_file(path)


class ReadsDevices(_BrokenFake):
    """read_file of a device returns what the device gives (here: 1 MiB of it)."""

    sandbox_class = _DeviceReadingSandbox


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


# -- limits ---------------------------------------------------------------------------------


class AcceptsEveryLimit(FakeBackend):
    """Takes any spec: a limit it cannot enforce is silently ignored."""

    def check_spec(self, spec: SandboxSpec) -> None:
        return None
