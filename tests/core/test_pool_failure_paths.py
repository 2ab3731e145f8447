"""A pool's books hold through the paths that do not end well: a sandbox whose acquire or
release is cancelled half-way is never left open outside them (where ``Pool.close()``
would not find it), and a warm create that fails is counted and wakes whoever waits."""

from __future__ import annotations

import asyncio

import pytest
from rollbox import (
    AcquireTimeoutError,
    BackendUnavailableError,
    Pool,
    SandboxSpec,
    StaticPoolPolicy,
)
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


async def test_a_warm_create_failing_with_a_usage_error_is_counted_and_wakes_its_waiter() -> None:
    """A filler's create that failed with an error other than a sandbox error (the
    Kubernetes backend's "cannot reach the API server" under load) ended the filler with
    an exception nobody retrieved, uncounted, and an acquire waiting for that warm
    sandbox was never woken."""
    started = asyncio.Event()

    class Flaky(FakeBackend):
        fails = 1

        async def create(self, spec: SandboxSpec) -> FakeSandbox:
            started.set()
            await asyncio.sleep(0.05)
            if self.fails:
                self.fails -= 1
                raise BackendUnavailableError("create Sandbox: cannot reach the API server")
            return await super().create(spec)

    backend = Flaky()
    async with Pool(backend, policy=StaticPoolPolicy(size=1)) as pool:
        pool.upcoming([SPEC])  # the filler starts a warm create...
        await started.wait()
        lease = await asyncio.wait_for(pool.acquire(SPEC), 5)  # ...this acquire waits on it
        await lease.release()
        assert pool.metrics.failures_by_kind() == {"backend_unavailable": 1}
