"""``max_sandboxes`` caps the sandboxes a pool holds at every moment, including the ones
between idle and leased (being reset after a release, being health-checked before a
hand-out): another spec's acquire waits for room instead of creating beside them."""

from __future__ import annotations

import asyncio

from rollbox import Pool, SandboxSpec
from rollbox.testing import FakeBackend, FakeSandbox

FIRST, SECOND = SandboxSpec(env={"SPEC": "1"}), SandboxSpec(env={"SPEC": "2"})


async def test_a_sandbox_being_reset_counts_toward_max_sandboxes() -> None:
    backend = FakeBackend(reset_delay=0.2)
    async with Pool(backend, max_sandboxes=1) as pool:
        lease = await pool.acquire(FIRST)
        release = asyncio.ensure_future(pool.release(lease))
        await asyncio.sleep(0.05)  # the reset is under way
        second = asyncio.ensure_future(pool.acquire(SECOND))
        await asyncio.sleep(0.05)
        assert len(backend.live) == 1 and not second.done()
        await release
        await (await second).release()
        assert backend.created == 2  # the reset one was evicted to make room
        assert len(backend.live) <= 1


async def test_a_sandbox_being_health_checked_counts_toward_max_sandboxes() -> None:
    pinging = asyncio.Event()
    answer = asyncio.Event()

    class SlowToPing(FakeSandbox):
        async def ping(self) -> bool:
            pinging.set()
            await answer.wait()
            return await super().ping()

    class Backend(FakeBackend):
        async def create(self, spec: SandboxSpec) -> FakeSandbox:
            made = await super().create(spec)
            slow = SlowToPing(self, made.id, spec, made.files)
            self.live[made.id] = slow
            return slow

    backend = Backend()
    async with Pool(backend, max_sandboxes=1) as pool:
        await (await pool.acquire(FIRST)).release()  # idle now
        reuse = asyncio.ensure_future(pool.acquire(FIRST))
        await pinging.wait()
        other = asyncio.ensure_future(pool.acquire(SECOND))
        await asyncio.sleep(0.05)
        assert len(backend.live) == 1 and not other.done()
        answer.set()
        await (await reuse).release()
        await (await other).release()
        assert len(backend.live) <= 1
