"""SandboxVectorEnv: concurrency over one loop, autoreset, per-env failures."""

from __future__ import annotations

import time

import gymnasium
import numpy as np
import pytest
from gym_support import fake_tasks
from rollbox.errors import UsageError
from rollbox.testing import FakeBackend
from rollbox_gymnasium import SandboxVectorEnv


def test_make_vec_uses_the_vector_entry_point(fake_backend: FakeBackend) -> None:
    envs = gymnasium.make_vec("rollbox/Shell-v0", num_envs=3, backend=fake_backend)
    assert isinstance(envs, SandboxVectorEnv)
    assert all(env.max_steps == 32 for env in envs.envs)  # from max_episode_steps
    obs, info = envs.reset(seed=1)
    assert len(obs) == 3 and envs.observation_space.contains(obs)
    assert info["_task_id"].all()
    envs.close()


def test_steps_run_concurrently(fake_backend: FakeBackend) -> None:
    fake_backend.exec_delay = 0.2
    envs = SandboxVectorEnv(8, task_source=fake_tasks(), backend=fake_backend)
    envs.reset(seed=0)
    started = time.perf_counter()
    _, rewards, terminated, truncated, info = envs.step(["true"] * 8)
    elapsed = time.perf_counter() - started
    # One after another this would take 8 x 0.2 s for the commands alone.
    assert elapsed < 0.8, elapsed
    assert rewards.dtype == np.float64 and not terminated.any() and not truncated.any()
    assert (info["exit_code"] == 0).all()
    envs.close()


def test_one_failure_does_not_fail_the_batch_and_autoresets(fake_backend: FakeBackend) -> None:
    envs = SandboxVectorEnv(3, task_source=fake_tasks(), backend=fake_backend)
    envs.reset(seed=[0, 1, 2])
    obs, rewards, terminated, truncated, info = envs.step(["touch done", "explode", "true"])
    assert terminated.tolist() == [True, False, False]
    assert truncated.tolist() == [False, True, False]
    assert rewards.tolist() == [1.0, 0.0, 0.0]
    assert info["_failure_kind"].tolist() == [False, True, False]
    assert info["failure_kind"][1] == "sandbox_lost" and info["retryable"][1]
    # NEXT_STEP autoreset: finished sub-envs reset now, their actions are ignored.
    obs, rewards, terminated, truncated, info = envs.step(["explode", "explode", "true"])
    assert rewards.tolist() == [0.0, 0.0, 0.0]
    assert not truncated.any() and not terminated.any()
    assert obs[0].startswith("Create the file done") and obs[1].startswith("Create the file")
    assert info["_task_id"].all() and info["_attempts"].tolist() == [True, True, False]
    envs.close()


def test_failed_reset_is_reported_per_env(fake_backend: FakeBackend) -> None:
    fake_backend.fail_creates = 1  # exactly one of the two resets fails, no retries
    envs = SandboxVectorEnv(2, task_source=fake_tasks(), backend=fake_backend,
                            reset_retries=0)
    _, info = envs.reset(seed=0)
    assert sorted(info["_failure_kind"].tolist()) == [False, True]
    failed = int(np.flatnonzero(info["_failure_kind"])[0])
    assert info["failure_kind"][failed] == "create_failed" and info["retryable"][failed]
    _, _, _, _, info = envs.step(["true", "true"])  # the failed one resets this step
    assert info["_attempts"][failed] and not info["_exit_code"][failed]
    envs.close()


def test_step_limit_and_validation(fake_backend: FakeBackend) -> None:
    envs = SandboxVectorEnv(2, task_source=fake_tasks(), backend=fake_backend,
                            max_episode_steps=1)
    envs.reset(seed=0)
    assert envs.step(["true", "true"])[3].all()
    with pytest.raises(UsageError):
        envs.step(["true"])
    with pytest.raises(UsageError):
        envs.reset(seed=[1])
    envs.close()
    with pytest.raises(UsageError):
        SandboxVectorEnv(0, backend=fake_backend)
