"""Reward integrity in the environment contract, on the fake backend: the final verdict is
sealed and sees only the answer, and a failure the rollout caused is its outcome (scored,
never retried, never masked), where any other sandbox failure stays retryable."""

from __future__ import annotations

import pytest
from rollbox.envs import SUBMIT, Judgement, Session, StepOutcome, Task
from rollbox.errors import ExecTimeoutError, SandboxLostError, UsageError, WorkloadError
from rollbox.pool import Pool
from rollbox.results import RolloutOutput
from rollbox.runner import RetryPolicy, run_rollouts
from rollbox.sandbox import ExecRequest, ExecResult, Sandbox
from rollbox.spec import SandboxSpec
from rollbox.testing.fake import FakeBackend, FakeSandbox, builtin_handler

SPEC = SandboxSpec(image="repo", workdir="/w")
IMAGE = {"/w/solution.py": b"wrong", "/usr/bin/judge": b"the image's own"}


async def shell(sandbox: FakeSandbox, request: ExecRequest) -> ExecResult:
    command = request.argv[-1]
    if command == "crash":  # what a rollout filling its memory does on a real backend
        raise WorkloadError("the sandbox's memory is exhausted", sandbox_id=sandbox.id,
                            cause="memory")
    if command == "hang":
        raise ExecTimeoutError("overran", sandbox_id=sandbox.id, timeout_s=1.0)
    if command == "lost":
        raise SandboxLostError("the node went away", sandbox_id=sandbox.id)
    if command in (SUBMIT, "slow-verdict"):
        return ExecResult(127, stderr=f"sh: {command}: not found\n".encode())
    if command == "judge":  # the hidden test: passes on the right solution
        if sandbox.files.get("/usr/bin/judge") != b"the image's own":
            return ExecResult(0, b"forged: all passed")
        ok = sandbox.files.get("/w/solution.py") == b"right" and "/w/hidden.py" in sandbox.files
        return ExecResult(0 if ok else 1)
    return await builtin_handler(sandbox, request)


async def hidden_test(sandbox: Sandbox, task: Task) -> float:
    return 1.0 if (await sandbox.exec("judge")).ok else 0.0


def backend() -> FakeBackend:
    return FakeBackend(shell, images={"repo": IMAGE})


def task(**options: object) -> Task:
    return Task(id="t", spec=SPEC, verifier=hidden_test,
                judge_files={"hidden.py": b"assert solve() == 'right'"}, **options)  # type: ignore[arg-type]


async def test_the_verdict_sees_the_answer_on_a_clean_sandbox_not_what_the_rollout_did() -> None:
    fake = backend()
    async with Pool(fake) as pool:
        session = Session(pool)
        await session.start(task(answer=("solution.py", "notes/missing.txt")))
        step = await session.step("true")
        assert (step.reward, step.terminated) == (0.0, False)  # the hidden test is not here
        assert session.sandbox is not None
        sandbox = fake.live[session.sandbox.id]
        assert "/w/hidden.py" not in sandbox.files
        await session.sandbox.write_file("solution.py", b"right")
        await session.sandbox.write_file("/usr/bin/judge", b"#!/bin/sh\necho forged")
        verdict = (await session.step(SUBMIT))
        assert (verdict.reward, verdict.terminated) == (1.0, True)  # the image's judge
        assert verdict.info["answer_missing"] == ["notes/missing.txt"]
        assert fake.seals == 1 and sandbox.files["/usr/bin/judge"] == b"the image's own"


async def test_without_an_answer_the_verdict_judges_the_sandbox_as_the_rollout_left_it() -> None:
    fake = backend()
    async with Pool(fake) as pool:
        session = Session(pool)
        await session.start(task())
        assert session.sandbox is not None
        await session.sandbox.write_file("solution.py", b"right")
        assert (await session.verify()).reward == 1.0
        assert fake.seals == 1


async def test_a_rollout_that_breaks_its_sandbox_is_scored_and_kept_in_its_group() -> None:
    async def policy(sandbox: Sandbox, task: Task, index: int) -> RolloutOutput:
        if index == 0:
            await sandbox.exec("crash")  # fails: crash the sandbox rather than be judged
        if index == 1:
            await sandbox.exec("hang")
        if index == 2:
            await sandbox.write_file("solution.py", b"right")
        return RolloutOutput(1.0)

    fake = backend()
    async with Pool(fake) as pool:
        report = await run_rollouts(pool, [task()], 3, policy)
    assert report.accounted and report.succeeded == 3 and report.failed == 0
    assert [r.reward for r in report.results] == [0.0, 0.0, 1.0]
    assert [r.attempts for r in report.results] == [1, 1, 1]  # never retried
    assert report.workload_failures_by_kind == {"exec_timeout": 1, "workload": 1}
    assert not report.masked_tasks
    crashed = report.results[0]
    assert crashed.workload_failure is not None and not crashed.workload_failure.retryable
    assert crashed.info["cause"] == "memory"
    assert report.as_dict()["rollouts"]["workload_failures_by_kind"]["workload"] == 1
    assert "broke their own sandbox" in report.summary()


async def test_infrastructure_failures_stay_retryable_and_masked() -> None:
    async def policy(sandbox: Sandbox, task: Task, index: int) -> RolloutOutput:
        await sandbox.exec("lost")
        return RolloutOutput(1.0)

    async with Pool(backend()) as pool:
        report = await run_rollouts(pool, [task()], 1, policy,
                                    retry=RetryPolicy(max_attempts=2, backoff_s=0))
    (result,) = report.results
    assert result.failure is not None and result.failure.kind == "sandbox_lost"
    assert result.attempts == 2 and report.masked_tasks == ["t"]


async def test_a_timeout_kind_the_user_retries_is_retried_not_scored() -> None:
    async def policy(sandbox: Sandbox, task: Task, index: int) -> RolloutOutput:
        await sandbox.exec("hang")
        return RolloutOutput(1.0)

    retry = RetryPolicy(max_attempts=2, backoff_s=0, retry_kinds=frozenset({"exec_timeout"}))
    async with Pool(backend()) as pool:
        report = await run_rollouts(pool, [task()], 1, policy, retry=retry)
    (result,) = report.results
    assert result.failure is not None and result.attempts == 2


class Custom(Task):
    async def judge(self, sandbox: Sandbox, step: StepOutcome | None) -> Judgement:
        if step is not None and step.action == "slow-verdict":
            raise ExecTimeoutError("the tests hung", sandbox_id=sandbox.id, timeout_s=1.0)
        return Judgement(0.5, step is None)

    def judge_failure(self, error: object) -> Judgement:
        return Judgement(-1.0, True, {"penalty": True})


async def test_a_session_scores_what_the_workload_broke_and_a_task_may_say_how() -> None:
    async with Pool(backend()) as pool:
        session = Session(pool)
        await session.start(Custom(id="c", spec=SPEC))
        crashed = await session.step("crash")
        assert crashed.failure is None and crashed.terminated and not crashed.truncated
        assert (crashed.reward, crashed.info) == (-1.0, {"penalty": True})
        await session.start(Custom(id="c", spec=SPEC))
        hung = await session.step("slow-verdict")  # the judge's own command overran
        assert hung.failure is None and hung.reward == -1.0
        await session.start(Task(id="d", spec=SPEC))
        lost = await session.step("lost")
        assert lost.failure is not None and lost.failure.retryable and lost.truncated
        await session.close()


def test_task_checks_its_integrity_fields() -> None:
    with pytest.raises(Exception, match="judge_files"):
        Task(id="x", spec=SPEC, judge_files={"a": "text"})  # type: ignore[dict-item]
    with pytest.raises(Exception, match="answer"):
        Task(id="x", spec=SPEC, answer="solution.py")  # type: ignore[arg-type]
    assert not Task(id="x", spec=SPEC).judged and Custom(id="c", spec=SPEC).judged


async def test_the_determinism_canary_names_a_judge_with_two_rewards_for_one_answer() -> None:
    """With ``canary_rate=1`` every judged rollout's answer is judged twice, each time on
    the sandbox reset to its image: a deterministic judge agrees with itself, a judge
    that flips a coin is named; the paid reward is always the first verdict's."""
    flips = iter([1.0, 0.0] * 10)
    seen: list[bool] = []

    async def coin(sandbox: Sandbox, task: Task) -> float:
        # each judgement starts from the image: the last one's scratch file is gone
        seen.append("/w/scratch" in sandbox.files)  # type: ignore[attr-defined]
        await sandbox.write_file("scratch", b"left by the judge")
        return next(flips)

    async def policy(sandbox: Sandbox, task: Task, index: int) -> RolloutOutput:
        await sandbox.write_file("solution.py", b"right")
        return RolloutOutput(1.0)

    steady = task(answer=("solution.py",))
    flaky = Task(id="flaky", spec=SPEC, verifier=coin, answer=("solution.py",))
    async with Pool(backend()) as pool:
        report = await run_rollouts(pool, [steady, flaky], 2, policy, canary_rate=1.0)
    assert report.accounted and report.canary_rejudged == 4
    assert report.canary_mismatches == ["flaky#0", "flaky#1"]
    assert [r.reward for r in report.results if r.task_id == "flaky"] == [1.0, 1.0]
    assert seen == [False] * 4
    assert "canary: 4 judged twice, 2 with two rewards (flaky#0, flaky#1)" in report.summary()
    assert report.as_dict()["canary"] == {"rejudged": 4, "mismatched": ["flaky#0", "flaky#1"]}


async def test_the_canary_samples_by_rate_and_skips_tasks_without_an_answer() -> None:
    async def policy(sandbox: Sandbox, task: Task, index: int) -> RolloutOutput:
        return RolloutOutput(1.0)

    async with Pool(backend()) as pool:
        none = await run_rollouts(pool, [task(answer=("solution.py",))], 8, policy)
        half = await run_rollouts(pool, [task(answer=("solution.py",))], 40, policy,
                                  canary_rate=0.5)
        unanswered = await run_rollouts(pool, [task()], 4, policy, canary_rate=1.0)
    assert none.canary_rejudged == 0 and "canary" not in none.summary()
    assert 10 <= half.canary_rejudged <= 30 and half.canary_mismatches == []
    assert unanswered.canary_rejudged == 0
    with pytest.raises(UsageError, match="canary_rate"):
        async with Pool(backend()) as pool:
            await run_rollouts(pool, [task()], 1, policy, canary_rate=2.0)
