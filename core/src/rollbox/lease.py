"""A sandbox on loan from a pool: the ``Lease``, the metered sandbox its holder uses, and
``pool.lease(spec)``'s context manager.

The holder talks to ``lease.sandbox``, a ``MeteredSandbox``: every call goes to the real
sandbox (``lease.raw``) through ``rollbox.wrappers.SandboxWrapper``, and commands report
their latency, the first one its time-to-first-command, to the pool's metrics. After the
release the metered sandbox refuses further use.
"""

from __future__ import annotations

import asyncio
from enum import Enum
from typing import TYPE_CHECKING

from rollbox.errors import SANDBOX_SOUND_AFTER, SandboxError, SandboxLostError
from rollbox.sandbox import ExecRequest, ExecResult, Sandbox
from rollbox.spec import SandboxSpec
from rollbox.wrappers import SandboxWrapper

if TYPE_CHECKING:
    from rollbox.pool import Pool


class Outcome(str, Enum):
    """How the holder of a lease leaves the sandbox."""

    OK = "ok"  # reusable after a reset
    BROKEN = "broken"  # do not trust it: close it


class Lease:
    """A sandbox on loan from a pool. ``sandbox`` records TTFC and exec latency."""

    def __init__(self, pool: Pool, sandbox: Sandbox, spec: SandboxSpec, requested: float) -> None:
        self.pool = pool
        self.raw = sandbox
        self.spec = spec
        self.requested = requested
        self.released = False
        self.sandbox: Sandbox = MeteredSandbox(self)

    async def release(self, outcome: Outcome = Outcome.OK) -> None:
        await self.pool.release(self, outcome)


class MeteredSandbox(SandboxWrapper[Sandbox]):
    """A leased sandbox: forwards to the real one and reports timings to the pool."""

    def __init__(self, lease: Lease) -> None:
        self._lease = lease
        self._first = True
        super().__init__(lease.raw)
        self.spec = lease.spec

    @property
    def inner(self) -> Sandbox:
        if self._lease.released:
            raise SandboxLostError(
                f"lease on sandbox {self.id} was released; acquire a new one", sandbox_id=self.id
            )
        return self._lease.raw

    async def run(self, request: ExecRequest) -> ExecResult:
        inner = self.inner
        metrics = self._lease.pool.metrics
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            return await inner.run(request)
        finally:
            now = loop.time()
            metrics.observe("exec", now - started)
            if self._first:
                self._first = False
                metrics.observe("ttfc", now - self._lease.requested)

    async def close(self) -> None:
        """Closing a leased sandbox gives it back as broken."""
        await self._lease.release(Outcome.BROKEN)


class LeaseContext:
    def __init__(self, pool: Pool, spec: SandboxSpec, timeout: float | None) -> None:
        self._pool, self._spec, self._timeout = pool, spec, timeout
        self._lease: Lease | None = None

    async def __aenter__(self) -> Sandbox:
        self._lease = await self._pool.acquire(self._spec, timeout=self._timeout)
        return self._lease.sandbox

    async def __aexit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        assert self._lease is not None
        broken = exc_type is not None and issubclass(exc_type, SandboxError) and not issubclass(
            exc_type, SANDBOX_SOUND_AFTER
        )
        await self._lease.release(Outcome.BROKEN if broken else Outcome.OK)
