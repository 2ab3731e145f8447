"""The shared loop thread: one per process, refuses re-entry, shuts pools down."""

from __future__ import annotations

import asyncio

import pytest
import rollbox_gymnasium
from gym_support import fake_tasks
from rollbox.envs.bridge import loop_thread
from rollbox.errors import UsageError
from rollbox.testing import FakeBackend


def test_one_loop_thread_per_process() -> None:
    assert loop_thread() is loop_thread()


def test_calling_an_env_from_the_loop_thread_raises(fake_backend: FakeBackend) -> None:
    env = rollbox_gymnasium.SandboxEnv(fake_tasks(), backend=fake_backend)

    async def inside() -> None:
        env.reset(seed=0)

    with pytest.raises(UsageError, match="inside its own event loop"):
        loop_thread().run(inside())
    env.close()


def test_shutdown_closes_sandboxes_of_open_envs(fake_backend: FakeBackend) -> None:
    env = rollbox_gymnasium.SandboxEnv(fake_tasks(), backend=fake_backend)
    env.reset(seed=0)
    assert fake_backend.live
    first = loop_thread()
    rollbox_gymnasium.shutdown()
    assert not fake_backend.live and not first.alive
    assert loop_thread() is not first  # a new env would start a fresh loop
    env.close()  # after shutdown: a no-op, not a hang


def test_envs_run_their_coroutines_on_the_shared_loop(fake_backend: FakeBackend) -> None:
    seen: list[asyncio.AbstractEventLoop] = []

    async def handler(sandbox, request):  # type: ignore[no-untyped-def]
        seen.append(asyncio.get_running_loop())
        from rollbox.sandbox import ExecResult

        return ExecResult(0)

    fake_backend.handler = handler
    envs = [rollbox_gymnasium.SandboxEnv(fake_tasks(), backend=fake_backend) for _ in range(3)]
    for env in envs:
        env.reset(seed=0)
        env.step("anything")
    assert len(seen) >= 3 and all(loop is loop_thread().loop for loop in seen)
    for env in envs:
        env.close()
