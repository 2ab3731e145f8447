"""``Backend.keep_warm``: the pool tells the backend each spec's warm target, and a
backend with warm capacity of its own may take that spec's warming over."""

from __future__ import annotations

import asyncio

import pytest
from rollbox import Pool, SandboxSpec, StaticPoolPolicy
from rollbox.policies import LookaheadPolicy
from rollbox.testing import FakeBackend, FakeSandbox

A = SandboxSpec(image="host", workdir="/a")
B = SandboxSpec(image="host", workdir="/b")


class WarmingBackend(FakeBackend):
    """Takes a spec's warming over once its target reaches ``threshold``, and from then
    on keeps it (as a cluster warm pool, once made, stays)."""

    def __init__(self, threshold: int = 1) -> None:
        super().__init__()
        self.threshold = threshold
        self.calls: list[tuple[str, int]] = []
        self.taken: set[SandboxSpec] = set()

    def keep_warm(self, spec: SandboxSpec, count: int) -> bool:
        self.calls.append((spec.workdir, count))
        if count >= self.threshold:
            self.taken.add(spec)
        return spec in self.taken


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def test_the_default_leaves_warming_to_the_pool() -> None:
    assert FakeBackend().keep_warm(A, 5) is False


async def test_a_backend_that_takes_over_gets_the_target_and_the_pool_creates_none() -> None:
    backend = WarmingBackend()
    async with Pool(backend, policy=StaticPoolPolicy(size=3)) as pool:
        for _ in range(3):
            async with pool.lease(A) as sandbox:
                assert (await sandbox.exec(["true"])).ok
            await settle()
        assert pool.delegated(A)
        assert backend.calls == [("/a", 3)]  # told once, before the first create
        assert backend.created == 1  # the acquire; no warm fills by the pool
        assert pool.idle_count(A) == 1  # released ones are still reused by reset
        assert pool.metrics.counters["reuses"] == 2
    assert backend.calls == [("/a", 3), ("/a", 0)]  # closing: the pool wants none


async def test_without_take_over_the_pool_fills_and_stops_once_the_backend_takes_it() -> None:
    backend = WarmingBackend(threshold=2)
    policy = StaticPoolPolicy(size=1)
    async with Pool(backend, policy=policy) as pool:
        pool.upcoming([A])
        await settle()
        assert not pool.delegated(A)
        assert backend.created == 1 and pool.idle_count(A) == 1  # the pool warmed it
        policy.size = 4
        pool.upcoming([A])
        await settle()
        assert pool.delegated(A)
        assert backend.created == 1  # the backend warms it now, not the filler
        assert backend.calls == [("/a", 1), ("/a", 4)]


async def test_lookahead_targets_are_reported_as_they_change_and_only_then() -> None:
    backend = WarmingBackend(threshold=1)
    policy = LookaheadPolicy(budget=4)
    async with Pool(backend, policy=policy) as pool:
        pool.upcoming([A, B])
        pool.upcoming([A, B])  # unchanged: no second report
        assert backend.calls == [("/a", 1), ("/b", 1)]
        pool.upcoming([B])  # A left the window: its target fell to 0
        assert backend.calls[2:] == [("/a", 0)]
        policy.in_flight({B: 1})
        pool.upcoming([B])  # B's next rollout will reuse the one in flight
        assert backend.calls[3:] == [("/b", 0)]
        assert backend.created == 0
    assert backend.calls[4:] == []  # nothing above 0 left to withdraw at close


@pytest.mark.filterwarnings("ignore:Broken.keep_warm raised:RuntimeWarning")
async def test_a_keep_warm_that_raises_leaves_warming_to_the_pool() -> None:
    class Broken(FakeBackend):
        def keep_warm(self, spec: SandboxSpec, count: int) -> bool:
            raise RuntimeError("boom")

    backend = Broken()
    async with Pool(backend, policy=StaticPoolPolicy(size=2)) as pool:
        with pytest.warns(RuntimeWarning, match="keep_warm raised"):
            pool.upcoming([A])
        await settle()
        assert not pool.delegated(A)
        assert pool.idle_count(A) == 2
        assert pool.metrics.counters["keep_warm_errors"] == 1


async def test_the_first_acquire_of_a_spec_is_told_before_it_creates() -> None:
    order: list[str] = []

    class Recording(WarmingBackend):
        def keep_warm(self, spec: SandboxSpec, count: int) -> bool:
            order.append(f"keep_warm {count}")
            return super().keep_warm(spec, count)

        async def create(self, spec: SandboxSpec) -> FakeSandbox:
            order.append("create")
            return await super().create(spec)

    async with Pool(Recording(), policy=StaticPoolPolicy(size=2)) as pool, pool.lease(A):
        pass
    assert order == ["keep_warm 2", "create", "keep_warm 0"]
