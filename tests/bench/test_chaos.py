"""Chaos: injected faults are all accounted, and retried where retryable."""

from __future__ import annotations

import pytest
from rollbox.errors import SandboxLostError, UsageError
from rollbox.policies import LookaheadPolicy
from rollbox.pool import NoPoolPolicy, Pool
from rollbox.runner import RetryPolicy, run_rollouts
from rollbox.spec import SandboxSpec
from rollbox.testing.fake import FakeBackend
from rollbox_bench.chaos import CREATE_FAILED, HUNG, KILLED, ChaosBackend
from rollbox_bench.synthetic import SyntheticSource

RETRY = RetryPolicy(max_attempts=4, backoff_s=0.0005, retry_kinds=frozenset({"exec_timeout"}))


async def test_every_injected_fault_is_accounted() -> None:
    src = SyntheticSource(20, kind="fake", padding_bytes=0, test_timeout_s=0.1)
    chaos = ChaosBackend(src.fake_backend(), kill_rate=0.1, hang_rate=0.05,
                         create_fail_rate=0.1, seed=3)
    async with Pool(chaos, policy=NoPoolPolicy()) as pool:
        report = await run_rollouts(pool, list(src.tasks()), 4, concurrency=4, retry=RETRY)
    assert report.accounted and report.requested == 80
    assert chaos.injected[KILLED] and chaos.injected[HUNG] and chaos.injected[CREATE_FAILED]
    seen = {k: report.retried_by_kind.get(k, 0) + report.failed_by_kind.get(k, 0)
            for k in ("sandbox_lost", "exec_timeout", "create_failed")}
    assert seen == {"sandbox_lost": chaos.injected[KILLED],
                    "exec_timeout": chaos.injected[HUNG],
                    "create_failed": chaos.injected[CREATE_FAILED]}
    assert report.succeeded + report.failed == 80
    assert report.retried_by_kind  # retryable faults were retried
    assert chaos.inner.live == {}  # type: ignore[attr-defined]


async def test_chaos_with_a_warm_pool_finishes_and_accounts() -> None:
    src = SyntheticSource(12, kind="fake", padding_bytes=0, test_timeout_s=0.01)
    chaos = ChaosBackend(src.fake_backend(), kill_rate=0.05, hang_rate=0.01,
                         create_fail_rate=0.05, seed=1)
    async with Pool(chaos, policy=LookaheadPolicy(budget=2), max_sandboxes=6) as pool:
        report = await run_rollouts(pool, list(src.tasks()), 4, concurrency=3, retry=RETRY)
    assert report.accounted and report.requested == 48


async def test_killed_sandbox_stays_dead() -> None:
    chaos = ChaosBackend(FakeBackend(), kill_rate=1.0)
    sandbox = await chaos.create(SandboxSpec())
    with pytest.raises(SandboxLostError):
        await sandbox.exec("true")
    assert not await sandbox.ping()
    with pytest.raises(SandboxLostError):
        await sandbox.reset()
    await chaos.aclose()


def test_rates_are_validated() -> None:
    with pytest.raises(UsageError):
        ChaosBackend(FakeBackend(), kill_rate=1.5)
    assert ChaosBackend(FakeBackend()).capabilities == FakeBackend.capabilities
