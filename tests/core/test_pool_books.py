"""A pool's books hold at every moment and through the paths that do not end well.

``max_sandboxes`` caps every sandbox the pool holds, the ones between idle and leased
included (being reset after a release, health-checked before a hand-out); a sandbox
whose acquire or release is cancelled half-way is never left open outside the books
(where ``Pool.close()`` would not find it); a warm create that fails is counted and wakes
whoever waits for it."""

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

SPEC, OTHER = SandboxSpec(env={"SPEC": "1"}), SandboxSpec(env={"SPEC": "2"})


class SlowToPingBackend(FakeBackend):
    """Its sandboxes' health checks begin (``pinging``) and answer once ``answer`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.pinging, self.answer = asyncio.Event(), asyncio.Event()

    async def create(self, spec: SandboxSpec) -> FakeSandbox:
        made = await super().create(spec)
        slow = SlowToPing(self, made.id, spec, made.files)
        self.live[made.id] = slow
        return slow


class SlowToPing(FakeSandbox):
    async def ping(self) -> bool:
        assert isinstance(self.backend, SlowToPingBackend)
        self.backend.pinging.set()
        await self.backend.answer.wait()
        return await super().ping()


async def test_a_sandbox_being_reset_counts_toward_max_sandboxes() -> None:
    backend = FakeBackend(reset_delay=0.2)
    async with Pool(backend, max_sandboxes=1) as pool:
        lease = await pool.acquire(SPEC)
        release = asyncio.ensure_future(pool.release(lease))
        await asyncio.sleep(0.05)  # the reset is under way
        second = asyncio.ensure_future(pool.acquire(OTHER))
        await asyncio.sleep(0.05)
        assert len(backend.live) == 1 and not second.done()
        await release
        await (await second).release()
        assert backend.created == 2  # the reset one was evicted to make room
        assert len(backend.live) <= 1


async def test_a_sandbox_being_health_checked_counts_toward_max_sandboxes() -> None:
    backend = SlowToPingBackend()
    async with Pool(backend, max_sandboxes=1) as pool:
        await (await pool.acquire(SPEC)).release()  # idle now
        reuse = asyncio.ensure_future(pool.acquire(SPEC))
        await backend.pinging.wait()
        other = asyncio.ensure_future(pool.acquire(OTHER))
        await asyncio.sleep(0.05)
        assert len(backend.live) == 1 and not other.done()
        backend.answer.set()
        await (await reuse).release()
        await (await other).release()
        assert len(backend.live) <= 1


async def test_an_acquire_that_times_out_in_the_health_check_leaves_the_sandbox_idle() -> None:
    backend = SlowToPingBackend()  # never answers
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
