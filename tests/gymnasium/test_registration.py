"""Env ids: the built-in ones, one per rollbox task source, and the entry point."""

from __future__ import annotations

from importlib.metadata import entry_points

import gymnasium
from rollbox.testing import FakeBackend
from rollbox_gymnasium import register_envs
from rollbox_gymnasium.registration import env_name


def test_builtin_ids_are_registered_on_import() -> None:
    for id_ in ("rollbox/Shell-v0", "rollbox/SWE-v0"):
        spec = gymnasium.spec(id_)
        assert spec.nondeterministic is True
        assert spec.vector_entry_point == "rollbox_gymnasium.vector:SandboxVectorEnv"
        assert spec.max_episode_steps == 32


def test_entry_point_registers_the_ids() -> None:
    (ep,) = [e for e in entry_points(group="gymnasium.envs") if e.name == "rollbox"]
    ids = ep.load()()
    assert {"rollbox/Shell-v0", "rollbox/SWE-v0"} <= set(ids)


def test_env_names() -> None:
    assert env_name("shell") == "Shell"
    assert env_name("synthetic") == "SWE"
    assert env_name("my-tasks_v2") == "MyTasksV2"


def test_plugin_task_source_becomes_a_playable_env(
    task_plugin: str, fake_backend: FakeBackend
) -> None:
    assert task_plugin not in gymnasium.registry
    assert task_plugin in register_envs()
    env = gymnasium.make(task_plugin, backend=fake_backend)
    obs, info = env.reset(options={"task_id": "done/1"})
    assert obs == "Task 1: create the file done."
    assert env.step("true")[1:3] == (0.0, False)
    _, reward, terminated, _, info = env.step("touch done")
    assert (reward, terminated) == (1.0, True) and info["verifier"]["score"] == 1.0
    env.reset(options={"task_id": "done/0"})
    _, reward, terminated, _, info = env.step("submit")  # submitting unsolved: 0, ends
    assert (reward, terminated, info["verifier"]["submitted"]) == (0.0, True, True)
    env.close()


def test_task_options_reach_the_plugin_factory(
    task_plugin: str, fake_backend: FakeBackend
) -> None:
    register_envs()
    env = gymnasium.make(task_plugin, backend=fake_backend, task_options={"count": 5})
    assert len(env.unwrapped.tasks) == 5  # type: ignore[attr-defined]
    env.close()
