"""SandboxEnv on core's fake backend: episodes, rewards, limits, failures, pool sharing."""

from __future__ import annotations

import pytest
from gym_support import fake_tasks
from rollbox.envs.pools import registry
from rollbox.errors import ImageNotFoundError, UsageError
from rollbox.spec import SandboxSpec
from rollbox.testing import FakeBackend
from rollbox_bench.shell import ShellTask, ShellTaskSource
from rollbox_gymnasium import SandboxEnv


def make(backend: FakeBackend, **kwargs: object) -> SandboxEnv:
    return SandboxEnv(fake_tasks(), backend=backend, **kwargs)  # type: ignore[arg-type]


def test_episode_reward_and_termination(fake_backend: FakeBackend) -> None:
    env = make(fake_backend)
    obs, info = env.reset(options={"task_id": "fake/a"})
    assert obs == "Create the file done."
    assert info["task_id"] == "fake/a"
    obs, reward, terminated, truncated, info = env.step("echo still working")
    assert (obs, reward, terminated, truncated) == ("still working\n", 0.0, False, False)
    assert info["exit_code"] == 0 and info["step"] == 1 and not info["output_truncated"]
    assert info["verifier"] == {"check_exit_code": 1}
    obs, reward, terminated, truncated, info = env.step("touch done")
    assert (reward, terminated, truncated) == (1.0, True, False)
    env.close()


def test_exit_code_duration_and_output_truncation_in_info(fake_backend: FakeBackend) -> None:
    env = make(fake_backend, max_observation_chars=200)
    env.reset(seed=0)
    obs, _, _, _, info = env.step("big 5000")
    assert len(obs) <= 200 and "characters truncated" in obs
    assert info["output_truncated"] and info["output_chars"] == 5000
    _, _, _, _, info = env.step("no-such-program --flag")
    assert info["exit_code"] == 127 and info["duration_s"] >= 0
    env.close()


def test_step_limit_truncates(fake_backend: FakeBackend) -> None:
    env = make(fake_backend, max_steps=2)
    env.reset(seed=0)
    assert env.step("true")[3] is False
    _, reward, terminated, truncated, _ = env.step("true")
    assert (reward, terminated, truncated) == (0.0, False, True)
    env.close()


def test_sandbox_failure_truncates_without_fake_reward(fake_backend: FakeBackend) -> None:
    env = make(fake_backend)
    _, info = env.reset(seed=0)
    dead = info["sandbox_id"]
    obs, reward, terminated, truncated, info = env.step("explode")
    assert (reward, terminated, truncated) == (0.0, False, True)
    assert info["failure_kind"] == "sandbox_lost" and info["retryable"] is True
    assert "exit_code" not in info and "sandbox_lost" in obs
    assert dead not in fake_backend.live  # returned broken: closed, not reused
    with pytest.raises(UsageError, match="reset"):
        env.step("true")
    _, info = env.reset(seed=0)
    assert info["sandbox_id"] != dead
    env.close()


def test_a_sandbox_the_episode_broke_ends_it_scored(fake_backend: FakeBackend) -> None:
    """The episode's own command broke its sandbox (its memory): that is how it ended,
    scored as the task says (0.0), terminated rather than truncated as infrastructure."""
    env = make(fake_backend)
    _, info = env.reset(seed=0)
    broken = info["sandbox_id"]
    obs, reward, terminated, truncated, info = env.step("crash")
    assert (reward, terminated, truncated) == (0.0, True, False)
    assert info["workload_failure"] == "workload" and "failure_kind" not in info
    assert info["verifier"]["cause"] == "memory"
    assert "broke its sandbox" in obs
    assert broken not in fake_backend.live  # closed, never reused
    env.close()


def test_verifier_failure_is_a_failure_too(fake_backend: FakeBackend) -> None:
    source = ShellTaskSource([ShellTask(id="t", prompt="p", check="explode")])
    env = SandboxEnv(source, backend=fake_backend)
    env.reset()
    _, reward, _, truncated, info = env.step("true")
    assert (reward, truncated, info["failure_kind"]) == (0.0, True, "sandbox_lost")
    env.close()


def test_command_timeout_is_shown_and_episode_goes_on(fake_backend: FakeBackend) -> None:
    env = make(fake_backend, step_timeout_s=0.05)
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step("sleep 5")
    assert info["timed_out"] is True and "timed out" in obs
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert env.step("touch done")[2] is True
    env.close()


def test_reset_in_place_keeps_the_sandbox_and_cleans_it(fake_backend: FakeBackend) -> None:
    env = make(fake_backend)
    _, first = env.reset(options={"task_id": "fake/b"})
    sandbox = fake_backend.live[first["sandbox_id"]]
    assert sandbox.files["/w/notes.txt"] == b"hello\n"  # task setup ran
    env.step("touch done")
    _, again = env.reset(options={"task_id": "fake/b"})
    assert again["sandbox_id"] == first["sandbox_id"] and again["reused_sandbox"]
    assert "/w/done" not in sandbox.files and "/w/notes.txt" in sandbox.files
    _, other = env.reset(options={"task_id": "fake/a"})  # another spec: another sandbox
    assert other["sandbox_id"] != first["sandbox_id"]
    env.close()


def test_seeds_pick_tasks_reproducibly(fake_backend: FakeBackend) -> None:
    env = make(fake_backend)
    picks = [env.reset(seed=s)[1]["task_id"] for s in range(12)]
    assert picks == [env.reset(seed=s)[1]["task_id"] for s in range(12)]
    assert set(picks) == {"fake/a", "fake/b"}
    env.close()


def test_envs_share_one_pool_and_last_close_closes_it(fake_backend: FakeBackend) -> None:
    first, second = make(fake_backend), make(fake_backend)
    assert first._shared is second._shared
    pool = first._shared.pool if first._shared else None
    first.reset(options={"task_id": "fake/a"})
    first.close()  # its sandbox goes back to the pool, reset and warm
    _, info = second.reset(options={"task_id": "fake/a"})
    assert fake_backend.created == 1 and info["sandbox_id"] in fake_backend.live
    second.close()
    second.close()  # idempotent
    assert pool is not None and not fake_backend.live
    _, pools = registry()
    assert len(pools) == 0


def test_retryable_reset_failures_are_retried(fake_backend: FakeBackend) -> None:
    fake_backend.fail_creates = 2
    env = make(fake_backend, reset_retries=2)
    _, info = env.reset(seed=0)
    assert info["attempts"] == 3
    env.close()
    fake_backend.fail_creates = 5
    env = make(fake_backend, reset_retries=1)
    with pytest.raises(Exception, match="injected create failure"):
        env.reset(seed=0)
    env.close()


def test_non_retryable_reset_failure_raises(fake_backend: FakeBackend) -> None:
    source = ShellTaskSource([ShellTask(id="t", prompt="p", check="true",
                                        spec=SandboxSpec(image="missing"))])
    env = SandboxEnv(source, backend=fake_backend)
    with pytest.raises(ImageNotFoundError):
        env.reset()
    env.close()


def test_bad_actions_and_usage(fake_backend: FakeBackend) -> None:
    env = make(fake_backend)
    with pytest.raises(UsageError, match="reset"):
        env.step("true")
    env.reset(seed=0)
    with pytest.raises(UsageError, match="NUL"):
        env.step("ls\0")
    with pytest.raises(UsageError, match="no task with id"):
        env.reset(options={"task_id": "nope"})
    env.close()
    with pytest.raises(UsageError, match="no task source named"):
        SandboxEnv("no-such-source", backend=fake_backend)


def test_render_ansi_shows_the_last_observation(fake_backend: FakeBackend) -> None:
    env = make(fake_backend, render_mode="ansi")
    env.reset(seed=0)
    env.step("echo shown")
    assert env.render() == "shown\n"
    env.close()
