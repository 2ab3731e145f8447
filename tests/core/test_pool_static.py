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
