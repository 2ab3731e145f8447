"""The static policy is a pool of fixed size per spec whose sandboxes come back by reset."""

from __future__ import annotations

from rollbox import Pool, SandboxSpec, StaticPoolPolicy
from rollbox.testing import FakeBackend


async def test_one_at_a_time_leases_reuse_one_sandbox_by_reset() -> None:
    backend = FakeBackend()
    async with Pool(backend, policy=StaticPoolPolicy(size=1)) as pool:
        spec = SandboxSpec()
        for _ in range(20):
            async with pool.lease(spec) as sandbox:
                assert (await sandbox.exec(["true"])).ok
        assert backend.created == 1
        assert pool.metrics.counters["resets"] == 20
        assert pool.metrics.counters["reuses"] == 19


async def test_concurrent_leases_beyond_the_size_create_and_return_to_size() -> None:
    backend = FakeBackend()
    async with Pool(backend, policy=StaticPoolPolicy(size=2)) as pool:
        spec = SandboxSpec()
        leases = [await pool.acquire(spec) for _ in range(3)]
        for lease in leases:
            await lease.release()
        assert backend.created == 3
        assert pool.idle_count(spec) == 2  # the surplus one was closed
        assert len(backend.live) == 2


async def test_closing_while_a_warm_sandbox_is_being_prepared_leaks_nothing() -> None:
    import asyncio

    from rollbox.testing import FakeSandbox

    preparing = asyncio.Event()

    class SlowToPrepare(FakeSandbox):
        async def prepare(self) -> None:
            preparing.set()
            await asyncio.sleep(10)

    backend = FakeBackend()
    original = backend._make

    async def make(spec: SandboxSpec, files: object) -> FakeSandbox:
        sandbox = await original(spec, files)  # type: ignore[arg-type]
        sandbox.__class__ = SlowToPrepare
        return sandbox

    backend._make = make  # type: ignore[method-assign]
    pool = Pool(backend, policy=StaticPoolPolicy(size=1))
    pool.upcoming([SandboxSpec()])  # the filler creates one and prepares it
    await asyncio.wait_for(preparing.wait(), 5)
    await pool.close()
    assert backend.live == {}
