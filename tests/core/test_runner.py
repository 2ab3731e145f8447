"""The runner: every rollout ends as one result, retries, group policy, cancellation."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pluggy
import pytest
from rollbox.envs import Task
from rollbox.errors import UsageError
from rollbox.hookspecs import hookimpl
from rollbox.plugins import get_plugin_manager
from rollbox.pool import NoPoolPolicy, Pool, StaticPoolPolicy
from rollbox.results import RolloutOutput, RolloutResult
from rollbox.runner import (
    GroupPolicy,
    RetryPolicy,
    RunCancelled,
    run_rollouts,
    run_rollouts_sync,
)
from rollbox.sandbox import Sandbox
from rollbox.spec import SandboxSpec
from rollbox.testing.fake import FakeBackend

FAST = RetryPolicy(max_attempts=3, backoff_s=0.001)


def make_tasks(n: int, image: str = "host") -> list[Task]:
    return [Task(id=f"t{i}", spec=SandboxSpec(image=image, labels={"i": str(i)}))
            for i in range(n)]


async def echo_reward(sandbox: Sandbox, task: Task, index: int) -> RolloutOutput:
    result = await sandbox.exec(["echo", task.id])
    return RolloutOutput(reward=float(index), info={"out": result.text.strip()})


async def test_every_rollout_succeeds_and_is_counted() -> None:
    backend = FakeBackend()
    async with Pool(backend) as pool:
        report = await run_rollouts(pool, make_tasks(3), 4, echo_reward, concurrency=2)
    assert (report.requested, report.succeeded, report.failed) == (12, 12, 0)
    assert report.accounted
    assert [(r.task_id, r.index) for r in report.results][:4] == [
        ("t0", 0), ("t0", 1), ("t0", 2), ("t0", 3)]
    assert {r.info["out"] for r in report.results} == {"t0", "t1", "t2"}
    assert [r.reward for r in report.results if r.task_id == "t1"] == [0.0, 1.0, 2.0, 3.0]
    assert report.masked_tasks == []
    assert backend.live == {}


async def test_concurrency_is_bounded() -> None:
    running = peak = 0

    async def slow(sandbox: Sandbox, task: Task, index: int) -> RolloutOutput:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.005)
        running -= 1
        return RolloutOutput(1.0)

    async with Pool(FakeBackend()) as pool:
        report = await run_rollouts(pool, make_tasks(10), 2, slow, concurrency=3)
    assert report.succeeded == 20
    assert peak == 3


async def test_lost_sandbox_is_retried_on_a_fresh_one() -> None:
    backend = FakeBackend()
    seen: list[str] = []

    async def dies_once(sandbox: Sandbox, task: Task, index: int) -> RolloutOutput:
        seen.append(sandbox.id)
        if len(seen) == 1:
            backend.kill(sandbox.id)
        await sandbox.exec("true")
        return RolloutOutput(1.0)

    async with Pool(backend, policy=StaticPoolPolicy(size=0)) as pool:
        report = await run_rollouts(pool, make_tasks(1), 1, dies_once, retry=FAST)
    (result,) = report.results
    assert result.ok and result.attempts == 2
    assert [f.kind for f in result.attempt_failures] == ["sandbox_lost"]
    assert seen[0] != seen[1] and result.sandbox_ids == tuple(seen)
    assert seen[0] not in backend.live  # the broken one was closed, not reused


async def test_retryable_failures_give_up_after_max_attempts() -> None:
    backend = FakeBackend(fail_creates=10)
    async with Pool(backend) as pool:
        report = await run_rollouts(pool, make_tasks(1), 1, echo_reward,
                                    retry=RetryPolicy(max_attempts=2, backoff_s=0.001))
    (result,) = report.results
    assert result.failure is not None
    assert (result.failure.kind, result.failure.retryable, result.attempts) == (
        "create_failed", True, 2)
    assert report.failed_by_kind == {"create_failed": 1}
    assert report.retried_by_kind == {"create_failed": 1}


async def test_create_failures_recover() -> None:
    async with Pool(FakeBackend(fail_creates=2)) as pool:
        report = await run_rollouts(pool, make_tasks(1), 1, echo_reward, retry=FAST)
    assert report.succeeded == 1 and report.results[0].attempts == 3


async def test_rollout_that_raises_is_a_non_retryable_rollout_error() -> None:
    calls = 0

    async def boom(sandbox: Sandbox, task: Task, index: int) -> RolloutOutput:
        nonlocal calls
        calls += 1
        raise ValueError("policy bug")

    async with Pool(FakeBackend()) as pool:
        report = await run_rollouts(pool, make_tasks(2), 2, boom, retry=FAST)
    assert calls == 4  # never retried
    assert report.failed_by_kind == {"rollout_error": 4}
    failure = report.results[0].failure
    assert failure is not None and not failure.retryable and "policy bug" in failure.message
    assert report.masked_tasks == ["t0", "t1"]
    assert report.accounted


async def test_hanging_rollout_times_out_and_its_sandbox_is_closed() -> None:
    backend = FakeBackend()

    async def hangs(sandbox: Sandbox, task: Task, index: int) -> RolloutOutput:
        await sandbox.exec("sleep 60")
        return RolloutOutput(1.0)

    async with Pool(backend, policy=StaticPoolPolicy(size=0)) as pool:
        report = await run_rollouts(pool, make_tasks(1), 2, hangs, rollout_timeout_s=0.02)
        assert pool.idle_count() == 0  # released as broken, not kept
    assert report.failed_by_kind == {"rollout_timeout": 2}
    assert backend.live == {}


@pytest.mark.parametrize("garbage", [None, 1.0, "1", RolloutOutput(math.nan),
                                     RolloutOutput(True), RolloutOutput(1.0, info=[])])  # type: ignore[arg-type]
async def test_garbage_output_is_invalid_output(garbage: Any) -> None:
    async def returns(sandbox: Sandbox, task: Task, index: int) -> Any:
        return garbage

    async with Pool(FakeBackend()) as pool:
        report = await run_rollouts(pool, make_tasks(1), 1, returns)
    assert report.failed_by_kind == {"invalid_output": 1}


async def test_missing_image_fails_fast_without_retry() -> None:
    async with Pool(FakeBackend()) as pool:
        report = await run_rollouts(pool, make_tasks(1, image="nope"), 3, echo_reward, retry=FAST)
    assert report.failed_by_kind == {"image_not_found": 3}
    assert all(r.attempts == 1 for r in report.results)


async def test_group_policy_retry_keeps_groups() -> None:
    async def odd_fails(sandbox: Sandbox, task: Task, index: int) -> RolloutOutput:
        if index % 2:
            raise RuntimeError("odd")
        return RolloutOutput(1.0)

    async with Pool(FakeBackend()) as pool:
        kept = await run_rollouts(pool, make_tasks(2), 2, odd_fails, group_policy="retry")
        masked = await run_rollouts(pool, make_tasks(2), 2, odd_fails, group_policy="mask")
    assert kept.masked_tasks == [] and masked.masked_tasks == ["t0", "t1"]
    assert masked.groups["t0"].succeeded == 1 and masked.groups["t0"].failed == 1


async def test_observers_see_every_result() -> None:
    seen: list[RolloutResult] = []

    class Recorder:
        @hookimpl
        def rollbox_rollout_finished(self, result: RolloutResult) -> None:
            seen.append(result)

    pm = get_plugin_manager(load_entrypoints=False)
    pm.register(Recorder())
    callbacks: list[RolloutResult] = []
    async with Pool(FakeBackend()) as pool:
        report = await run_rollouts(pool, make_tasks(3), 2, echo_reward, plugin_manager=pm,
                                    on_result=callbacks.append)
    assert sorted(seen, key=lambda r: (r.task_id, r.index)) == report.results
    assert len(callbacks) == 6


async def test_cancellation_gives_a_partial_report_and_releases_everything() -> None:
    backend = FakeBackend()
    started = asyncio.Event()

    async def slow(sandbox: Sandbox, task: Task, index: int) -> RolloutOutput:
        if task.id != "t0":
            started.set()
            await sandbox.exec("sleep 30")
        return RolloutOutput(1.0)

    async with Pool(backend) as pool:
        run = asyncio.ensure_future(
            run_rollouts(pool, make_tasks(5), 2, slow, concurrency=2))
        await started.wait()
        await asyncio.sleep(0.01)
        run.cancel()
        with pytest.raises(RunCancelled) as info:
            await run
        assert pool.live == pool.idle_count()  # nothing still leased
    report = info.value.report
    assert report.cancelled and report.accounted and report.requested == 10
    assert report.groups["t0"].succeeded == 2
    kinds = report.failed_by_kind
    assert kinds["cancelled"] == 10 - report.succeeded
    in_flight = [r for r in report.results if r.cancelled and "in flight" in r.failure.message]  # type: ignore[union-attr]
    assert in_flight and all(r.attempts == 1 for r in in_flight)
    assert backend.live == {}


def test_sync_facade_runs_and_closes_the_pool() -> None:
    backend = FakeBackend()
    pool = Pool(backend, policy=StaticPoolPolicy(size=1))
    report = run_rollouts_sync(pool, make_tasks(2), 2, echo_reward, concurrency=2)
    assert report.succeeded == 4 and report.accounted
    assert backend.live == {}


async def test_tasks_policy_is_the_default_rollout_fn() -> None:
    task = Task(id="own", spec=SandboxSpec(), policy=echo_reward)
    async with Pool(FakeBackend(), policy=NoPoolPolicy()) as pool:
        report = await run_rollouts(pool, [task], 2)
    assert report.succeeded == 2


@pytest.mark.parametrize("kwargs", [{"concurrency": 0}, {"rollouts_per_task": -1},
                                    {"rollout_timeout_s": 0}])
async def test_bad_arguments_are_usage_errors(kwargs: dict[str, Any]) -> None:
    args: dict[str, Any] = {"rollouts_per_task": 1, **kwargs}
    async with Pool(FakeBackend()) as pool:
        with pytest.raises(UsageError):
            await run_rollouts(pool, make_tasks(1), rollout_fn=echo_reward, **args)


async def test_duplicate_task_ids_and_missing_policy_are_refused() -> None:
    async with Pool(FakeBackend()) as pool:
        with pytest.raises(UsageError, match="unique"):
            await run_rollouts(pool, make_tasks(1) * 2, 1, echo_reward)
        with pytest.raises(UsageError, match="no rollout_fn"):
            await run_rollouts(pool, make_tasks(1), 1)


def test_retry_policy_backoff_is_bounded() -> None:
    policy = RetryPolicy(max_attempts=5, backoff_s=0.1, backoff_factor=3, max_backoff_s=0.5)
    assert [policy.delay(a) for a in (1, 2, 3)] == pytest.approx([0.1, 0.3, 0.5])
    with pytest.raises(UsageError):
        RetryPolicy(max_attempts=0)
    assert GroupPolicy("mask") is GroupPolicy.MASK


def test_hookspec_is_declared() -> None:
    pm = get_plugin_manager(load_entrypoints=False)
    assert isinstance(pm, pluggy.PluginManager)
    assert hasattr(pm.hook, "rollbox_rollout_finished")
