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

from rollbox.backend import Backend
from rollbox.errors import (
    CreateFailedError,
    ExecTimeoutError,
    RollboxError,
    SandboxLostError,
    UsageError,
)
from rollbox.sandbox import ExecRequest, ExecResult, Sandbox
from rollbox.spec import SandboxSpec
from rollbox.wrappers import BackendWrapper, SandboxWrapper

KILLED = "killed"
HUNG = "hung"
CREATE_FAILED = "create_failed"


class ChaosBackend(BackendWrapper[Backend]):
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
        super().__init__(inner)
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
        return await super().create(spec)

    def wrap(self, sandbox: Sandbox) -> Sandbox:
        return ChaosSandbox(self, sandbox)


class ChaosSandbox(SandboxWrapper[Sandbox]):
    """Forwards to the real sandbox; some commands die or hang on the way."""

    def __init__(self, chaos: ChaosBackend, inner: Sandbox) -> None:
        self.chaos = chaos
        self.killed = False
        super().__init__(inner)

    @property
    def inner(self) -> Sandbox:
        if self.killed:
            raise SandboxLostError(f"sandbox {self.id} was killed (chaos)", sandbox_id=self.id)
        return self._wrapped

    async def run(self, request: ExecRequest) -> ExecResult:
        inner = self.inner
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

    async def ping(self) -> bool:
        return not self.killed and await self._wrapped.ping()

    async def close(self) -> None:
        await self._wrapped.close()
