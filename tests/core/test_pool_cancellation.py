"""A pool keeps track of a sandbox whose acquire or release is cancelled half-way: it is
never left open outside the pool's books, where ``Pool.close()`` would not find it."""

from __future__ import annotations

import asyncio

import pytest
from rollbox import AcquireTimeoutError, Pool, SandboxSpec
from rollbox.testing import FakeBackend, FakeSandbox

SPEC = SandboxSpec()


class SlowSandbox(FakeSandbox):
    async def ping(self) -> bool:
        await asyncio.sleep(5)
        return await super().ping()


class SlowBackend(FakeBackend):
    async def create(self, spec: SandboxSpec) -> FakeSandbox:
        made = await super().create(spec)
        slow = SlowSandbox(self, made.id, spec, made.files)
        self.live[made.id] = slow
        return slow


async def test_an_acquire_that_times_out_in_the_health_check_leaves_the_sandbox_idle() -> None:
    backend = SlowBackend()
    pool = Pool(backend)
    await (await pool.acquire(SPEC)).release()
    with pytest.raises(AcquireTimeoutError):
        await pool.acquire(SPEC, timeout=0.05)  # cancelled while pinging the idle one
    assert pool.idle_count(SPEC) == 1
    await pool.close()
    assert backend.live == {}


async def test_a_release_cancelled_mid_reset_closes_the_sandbox() -> None:
    backend = FakeBackend(reset_delay=5)
    pool = Pool(backend)
    lease = await pool.acquire(SPEC)
    release = asyncio.ensure_future(pool.release(lease))
    await asyncio.sleep(0.05)
    release.cancel()
    with pytest.raises(asyncio.CancelledError):
        await release
    await pool.close()
    assert backend.live == {}
    assert pool.live == 0
