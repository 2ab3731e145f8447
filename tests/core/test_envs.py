"""The environment contract on the fake backend: one task model, the registry, a Session
(what every adapter translates) and the runner honouring ``setup``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
from rollbox.envs import (
    SUBMIT,
    Judgement,
    Session,
    StepOutcome,
    Task,
    load_tasks,
)
from rollbox.envs.bridge import loop_thread
from rollbox.envs.pools import registry
from rollbox.errors import SandboxFileNotFoundError, SandboxLostError, UsageError
from rollbox.hookspecs import hookimpl
from rollbox.plugins import get_plugin_manager
from rollbox.pool import Pool
from rollbox.results import RolloutOutput
from rollbox.runner import run_rollouts
from rollbox.sandbox import ExecRequest, ExecResult, Sandbox
from rollbox.spec import SandboxSpec
from rollbox.testing.fake import FakeBackend, FakeSandbox, builtin_handler

SPEC = SandboxSpec(workdir="/w")


@dataclass(frozen=True, kw_only=True)
class NoteTask(Task):
    """setup writes a note; solved once ``solved`` exists; ``boom`` kills the sandbox."""

    note: str = "hello"

    async def setup(self, sandbox: Sandbox) -> None:
        await sandbox.write_file("note.txt", self.note.encode())

    async def judge(self, sandbox: Sandbox, step: StepOutcome | None) -> Judgement:
        try:
            await sandbox.read_file("solved")
        except SandboxFileNotFoundError:
            return Judgement(0.0, step is None, {"solved": False})
        return Judgement(1.0, True, {"solved": True})


async def shell(sandbox: FakeSandbox, request: ExecRequest) -> ExecResult:
    command = request.argv[-1]
    if command == "solve":
        sandbox.files["/w/solved"] = b""
        return ExecResult(0)
    if command == "boom":
        raise SandboxLostError("the fake sandbox died", sandbox_id=sandbox.id)
    if command == SUBMIT:
        return ExecResult(127, stderr=b"sh: submit: not found\n")  # as a real shell says
    return await builtin_handler(sandbox, request)


async def test_a_session_runs_episodes_and_reuses_its_sandbox() -> None:
    backend = FakeBackend(shell)
    task = NoteTask(id="note", spec=SPEC, prompt="Solve it.")
    async with Pool(backend) as pool:
        session = Session(pool, max_steps=3)
        started = await session.start(task)
        assert (started.prompt, started.reused_sandbox, started.attempts) == ("Solve it.", False, 1)
        sandbox = backend.live[started.sandbox_id]
        assert sandbox.files["/w/note.txt"] == b"hello"  # setup ran
        first = await session.step("cat note.txt")
        assert first.step is not None and first.step.result.stdout == b"hello"
        assert (first.reward, first.terminated, first.truncated) == (0.0, False, False)
        solved = await session.step("solve")
        assert (solved.reward, solved.terminated, solved.info) == (1.0, True, {"solved": True})
        again = await session.start(task)  # same spec: reset in place, setup again
        assert again.sandbox_id == started.sandbox_id and again.reused_sandbox
        assert "/w/solved" not in sandbox.files and "/w/note.txt" in sandbox.files
        for _ in range(2):
            await session.step("true")
        assert (await session.step("true")).truncated  # max_steps
        await session.start(task)
        assert backend.seals == 0
        verdict = await session.verify()  # the final verdict: sealed, the episode over
        assert verdict.terminated and backend.seals == 1
        with pytest.raises(UsageError, match="start an episode"):
            await session.step("true")
        await session.close()
        await session.close()
        assert pool.idle_count(SPEC) == 1  # given back, reset and warm
    assert not backend.live


async def test_a_sandbox_failure_ends_the_episode_without_a_reward() -> None:
    backend = FakeBackend(shell)
    async with Pool(backend) as pool:
        session = Session(pool)
        started = await session.start(NoteTask(id="note", spec=SPEC))
        failed = await session.step("boom")
        assert failed.truncated and not failed.terminated and failed.reward == 0.0
        assert failed.failure is not None and failed.failure.kind == "sandbox_lost"
        assert started.sandbox_id not in backend.live  # given back broken: closed
        with pytest.raises(UsageError, match="start an episode"):
            await session.step("true")
        with pytest.raises(UsageError, match="NUL"):
            await session.step("ls\0")
        await session.close()


async def test_start_retries_retryable_failures_on_fresh_sandboxes() -> None:
    backend = FakeBackend(shell, fail_creates=2)
    async with Pool(backend) as pool:
        started = await Session(pool, reset_retries=2).start(NoteTask(id="n", spec=SPEC))
        assert started.attempts == 3


async def verifier(sandbox: Sandbox, task: Task) -> float:
    return 1.0 if (await sandbox.exec("cat score")).text == "1" else 0.25


async def test_a_task_from_data_is_judged_by_its_verifier() -> None:
    task = Task(id="data", spec=SPEC, verifier=verifier)
    backend = FakeBackend(shell)
    async with Pool(backend) as pool:
        session = Session(pool)
        await session.start(task)
        step = await session.step("true")
        assert (step.reward, step.terminated, step.info["score"]) == (0.0, False, 0.25)
        submitted = await session.step(SUBMIT)  # ends with whatever the score is
        assert (submitted.reward, submitted.terminated) == (0.25, True)
        assert backend.seals == 1  # a submit is the final verdict
        await session.start(task)
        assert session.sandbox is not None
        await session.sandbox.write_file("score", b"1")
        assert (await session.verify()).reward == 1.0
        await session.close()
    assert "submit" in Task(id="x", spec=SPEC).instruction


class Source:
    name = "notes"

    def __init__(self, count: int = 2) -> None:
        self.count = count

    def tasks(self) -> list[Task]:
        return [NoteTask(id=f"note/{i}", spec=SPEC) for i in range(self.count)]


class Plugin:
    @hookimpl
    def rollbox_register_tasks(self, register: Callable[[str, object], None]) -> None:
        register("notes", Source)


def test_load_tasks_by_name_or_object_and_refuses_bad_sources() -> None:
    pm = get_plugin_manager(load_entrypoints=False)
    pm.register(Plugin())
    assert len(load_tasks("notes", {"count": 3}, plugin_manager=pm)) == 3
    assert [t.id for t in load_tasks(Source())] == ["note/0", "note/1"]
    with pytest.raises(UsageError, match="no task source named"):
        load_tasks("nope", plugin_manager=pm)
    with pytest.raises(UsageError, match="has no tasks"):
        load_tasks(Source(0))
    with pytest.raises(UsageError, match="only when the task source is given by name"):
        load_tasks(Source(), {"count": 1})

    class Duplicates(Source):
        def tasks(self) -> list[Task]:
            return [Task(id="same", spec=SPEC)] * 2

    with pytest.raises(UsageError, match="repeats task ids"):
        load_tasks(Duplicates())


async def test_the_runner_runs_setup_before_each_rollout_and_pays_the_verdict() -> None:
    async def rollout(sandbox: Sandbox, task: Task, index: int) -> RolloutOutput:
        if index < 2 and await sandbox.read_file("note.txt") == b"hi":  # setup ran
            await sandbox.exec("solve")
        return RolloutOutput(1.0)  # what it claims: never paid for a judged task

    backend = FakeBackend(shell)
    async with Pool(backend) as pool:
        report = await run_rollouts(pool, [NoteTask(id="n", spec=SPEC, note="hi")], 3, rollout)
    assert report.succeeded == 3 and [r.reward for r in report.results] == [1.0, 1.0, 0.0]
    assert [r.info["claimed_reward"] for r in report.results] == [1.0] * 3
    assert backend.seals == 3  # each verdict on a sealed sandbox


def test_shared_pools_live_on_the_bridge_thread() -> None:
    backend = FakeBackend(shell)
    thread, pools = registry()
    first = thread.run(pools.attach(backend, {}, {}))
    second = thread.run(pools.attach(backend, {}, {}))
    assert first is second and first.refs == 2 and thread is loop_thread()
    thread.run(pools.detach(first))
    assert not first.closed
    thread.run(pools.detach(second))
    assert first.closed and len(pools) == 0
