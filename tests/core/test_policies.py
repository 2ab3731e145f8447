"""Pool policies: none, static, lookahead (warming ahead, reuse by reset, budget)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from rollbox.errors import UsageError
from rollbox.plugins import get_plugin_manager, pool_policies
from rollbox.policies import InFlightAware, LookaheadPolicy
from rollbox.pool import NoPoolPolicy, Pool
from rollbox.runner import run_rollouts
from rollbox.spec import SandboxSpec
from rollbox.testing.fake import FakeBackend
from rollbox_bench.synthetic import SyntheticSource


class HintedBackend(FakeBackend):
    def __init__(self, **kw: object) -> None:
        src = SyntheticSource(8, kind="fake", padding_bytes=0)
        inner = src.fake_backend()
        super().__init__(inner.handler, images=inner.images, **kw)  # type: ignore[arg-type]
        self.hints: list[list[str]] = []

    def hint_upcoming(self, images: Sequence[str]) -> None:
        self.hints.append(list(images))


def specs(n: int) -> list[SandboxSpec]:
    return [SandboxSpec(image=f"img{i}") for i in range(n)]


def test_registered_policies() -> None:
    found = pool_policies(get_plugin_manager(load_entrypoints=False))
    assert {"none", "static", "lookahead"} <= set(found)
    assert found["lookahead"] is LookaheadPolicy


def test_lookahead_plans_within_budget_and_skips_in_flight() -> None:
    a, b, c, d = specs(4)
    policy = LookaheadPolicy(budget=2)
    assert isinstance(policy, InFlightAware)
    policy.in_flight({a: 1})
    policy.upcoming([a, a, b, b, c, d])
    assert [policy.warm_target(s) for s in (a, b, c, d)] == [0, 1, 1, 0]
    assert policy.planned == 2
    assert policy.max_idle(a) == 1 and policy.max_idle(d) == 1
    policy.upcoming([c])
    assert policy.max_idle(a) == 0  # a is done: close, do not keep
    assert [policy.warm_target(s) for s in (a, b, c)] == [0, 0, 1]


def test_lookahead_rejects_bad_budget() -> None:
    with pytest.raises(UsageError):
        LookaheadPolicy(budget=-1)
    with pytest.raises(UsageError):
        LookaheadPolicy(per_spec=0)


async def test_lookahead_reuses_one_sandbox_per_task() -> None:
    backend = HintedBackend(create_delay=0.002)
    src = SyntheticSource(8, kind="fake", padding_bytes=0)
    tasks = list(src.tasks())
    async with Pool(backend, policy=LookaheadPolicy(budget=2), max_sandboxes=4) as pool:
        report = await run_rollouts(pool, tasks, 4, concurrency=2)
        counters = pool.metrics.counters
    assert report.succeeded == 32
    assert backend.created == 8 and counters["creations"] == 8
    assert counters["resets"] == 24
    for task in tasks:
        ids = {sid for r in report.results if r.task_id == task.id for sid in r.sandbox_ids}
        assert len(ids) == 1
    # the image store heard about what comes next, beyond the running tasks
    assert any(tasks[5].spec.image in hint for hint in backend.hints)
    assert backend.hints[-1] == []  # cleared at the end


async def test_lookahead_warms_the_next_tasks_before_they_start() -> None:
    backend = HintedBackend(create_delay=0.01, exec_delay=0.005)
    tasks = list(SyntheticSource(8, kind="fake", padding_bytes=0).tasks())
    async with Pool(backend, policy=LookaheadPolicy(budget=2), max_sandboxes=4) as pool:
        await run_rollouts(pool, tasks, 2, concurrency=2)
        queue_wait = pool.metrics.samples["queue_wait"]
    first_of_task = queue_wait  # every acquire; warm ones wait ~0
    fast = [w for w in first_of_task if w < 0.005]
    assert len(fast) >= 12  # 8 reuses by reset + warm hand-outs for later tasks


async def test_none_policy_creates_per_rollout() -> None:
    backend = HintedBackend()
    tasks = list(SyntheticSource(3, kind="fake", padding_bytes=0).tasks())
    async with Pool(backend, policy=NoPoolPolicy()) as pool:
        report = await run_rollouts(pool, tasks, 4, concurrency=2, lookahead=0)
        assert pool.metrics.counters["resets"] == 0
    assert backend.created == 12 and report.succeeded == 12
    assert backend.hints == []


async def test_acquire_waits_for_a_warm_create_in_progress() -> None:
    backend = FakeBackend(create_delay=0.02)
    spec = SandboxSpec()
    policy = LookaheadPolicy(budget=1)
    async with Pool(backend, policy=policy) as pool:
        pool.upcoming([spec])  # the filler starts creating
        lease = await pool.acquire(spec)
        await lease.release()
    assert backend.created == 1
