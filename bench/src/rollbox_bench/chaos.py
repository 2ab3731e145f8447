"""Fault injection as a Backend wrapper, so it works on any backend.

``ChaosBackend(inner, kill_rate=…, hang_rate=…, create_fail_rate=…, seed=…)``:

* create fails (``CreateFailedError``, retryable) with ``create_fail_rate``;
* a command is killed mid-way with ``kill_rate``: the sandbox is closed under it and
  the command raises ``SandboxLostError`` (retryable), as when a node dies;
* a command hangs with ``hang_rate``: it makes no progress until its timeout, then
  raises ``ExecTimeoutError``, as a backend does after killing a hung process tree.

``injected`` counts every fault by kind so a report can show each one accounted for.
Randomness comes from ``random.Random(seed)``; waits use ``asyncio.sleep`` only.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import shlex
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from rollbox.backend import Backend
from rollbox.errors import (
    CreateFailedError,
    ExecTimeoutError,
    RollboxError,
    SandboxLostError,
    UsageError,
)
from rollbox.sandbox import ExecRequest, ExecResult, Process, Sandbox, Snapshot
from rollbox.spec import SandboxSpec

KILLED = "killed"
HUNG = "hung"
CREATE_FAILED = "create_failed"


class ChaosBackend(Backend):
    """Wraps ``inner`` and injects faults at the given rates (each in [0, 1])."""

    name = "chaos"

    def __init__(
        self,
        inner: Backend,
        *,
        kill_rate: float = 0.0,
        hang_rate: float = 0.0,
        create_fail_rate: float = 0.0,
        seed: int = 0,
    ) -> None:
        for label, rate in (("kill_rate", kill_rate), ("hang_rate", hang_rate),
                            ("create_fail_rate", create_fail_rate)):
            if not 0.0 <= rate <= 1.0:
                raise UsageError(f"chaos {label} must be within [0, 1], got {rate}")
        self.inner = inner
        # Same abilities as the wrapped backend (a ClassVar on backends; set per instance).
        setattr(self, "capabilities", inner.capabilities)  # noqa: B010
        self.kill_rate = kill_rate
        self.hang_rate = hang_rate
        self.create_fail_rate = create_fail_rate
        self.rng = random.Random(seed)
        self.injected: Counter[str] = Counter()

    def roll(self, rate: float) -> bool:
        return rate > 0 and self.rng.random() < rate

    async def create(self, spec: SandboxSpec) -> Sandbox:
        if self.roll(self.create_fail_rate):
            self.injected[CREATE_FAILED] += 1
            await asyncio.sleep(0)
            raise CreateFailedError("chaos: injected create failure")
        return ChaosSandbox(self, await self.inner.create(spec))

    async def prefetch(self, image: str) -> None:
        await self.inner.prefetch(image)

    def hint_upcoming(self, images: Sequence[str]) -> None:
        self.inner.hint_upcoming(images)

    async def fork(self, snapshot: Snapshot) -> Sandbox:
        return ChaosSandbox(self, await self.inner.fork(snapshot))

    async def drop_snapshot(self, snapshot: Snapshot) -> None:
        await self.inner.drop_snapshot(snapshot)

    async def aclose(self) -> None:
        await self.inner.aclose()


class ChaosSandbox(Sandbox):
    """Delegates to the real sandbox; some commands die or hang on the way."""

    def __init__(self, chaos: ChaosBackend, inner: Sandbox) -> None:
        super().__init__(inner.id, inner.spec)
        self.chaos = chaos
        self.inner = inner
        self.killed = False

    def _alive(self) -> Sandbox:
        if self.killed:
            raise SandboxLostError(f"sandbox {self.id} was killed (chaos)", sandbox_id=self.id)
        return self.inner

    async def run(self, request: ExecRequest) -> ExecResult:
        inner = self._alive()
        if self.chaos.roll(self.chaos.kill_rate):
            self.chaos.injected[KILLED] += 1
            command = asyncio.ensure_future(inner.run(request))
            await asyncio.sleep(0)  # the command has started when its sandbox dies
            self.killed = True
            command.cancel()
            with contextlib.suppress(BaseException):
                await command
            with contextlib.suppress(RollboxError, OSError):
                await inner.close()
            raise SandboxLostError(
                f"sandbox {self.id} died during {shlex.join(request.argv)!r} (chaos)",
                sandbox_id=self.id,
            )
        if self.chaos.roll(self.chaos.hang_rate):
            self.chaos.injected[HUNG] += 1
            await asyncio.sleep(request.timeout_s)
            raise ExecTimeoutError(
                f"command {shlex.join(request.argv)!r} hung past {request.timeout_s}s "
                "(chaos); its process tree was killed",
                sandbox_id=self.id, timeout_s=request.timeout_s,
            )
        return await inner.run(request)

    async def start(self, request: ExecRequest) -> Process:
        return await self._alive().start(request)

    async def read_file(self, path: str) -> bytes:
        return await self._alive().read_file(path)

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        await self._alive().write_file(path, data, mode=mode)

    async def upload(self, local: str | Path, remote: str) -> None:
        await self._alive().upload(local, remote)

    async def download(self, remote: str, local: str | Path) -> None:
        await self._alive().download(remote, local)

    async def reset(self) -> None:
        await self._alive().reset()

    async def snapshot(self) -> Snapshot:
        return await self._alive().snapshot()

    async def ping(self) -> bool:
        return not self.killed and await self.inner.ping()

    async def close(self) -> None:
        await self.inner.close()
