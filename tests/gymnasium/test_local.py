"""The adapter on real sandboxes (the local bubblewrap backend)."""

from __future__ import annotations

import warnings

import gymnasium
from gymnasium.utils.env_checker import check_env
from rollbox_gymnasium import SandboxVectorEnv


def test_shell_task_solved_in_a_real_sandbox(local_backend: str) -> None:
    env = gymnasium.make("rollbox/Shell-v0", backend=local_backend)
    obs, info = env.reset(options={"task_id": "shell/count-lines"})
    assert "words.txt" in obs
    obs, reward, terminated, _, info = env.step("echo été 😀; echo oops >&2; exit 3")
    assert obs == "été 😀\noops\n" and info["exit_code"] == 3 and reward == 0.0
    obs, reward, terminated, truncated, info = env.step("wc -l < words.txt > count.txt")
    assert (reward, terminated, truncated) == (1.0, True, False)
    # Reset in place: same sandbox, the agent's file is gone, the task's file is back.
    _, again = env.reset(options={"task_id": "shell/count-lines"})
    assert again["sandbox_id"] == info["sandbox_id"] and again["reused_sandbox"]
    assert env.step("ls")[0] == "words.txt\n"
    env.close()


def test_long_output_and_timeouts_on_real_commands(local_backend: str) -> None:
    env = gymnasium.make("rollbox/Shell-v0", backend=local_backend, max_observation_chars=500,
                         step_timeout_s=0.5)
    env.reset(seed=0)
    obs, _, _, _, info = env.step("seq 1 100000")
    assert len(obs) <= 500 and obs.startswith("1\n2\n") and obs.endswith("99999\n100000\n")
    assert info["output_truncated"] and info["output_chars"] > 500_000
    obs, _, terminated, truncated, info = env.step("echo before; sleep 30")
    assert info["timed_out"] and obs.startswith("before\n") and not (terminated or truncated)
    assert env.step("echo alive")[0] == "alive\n"
    env.close()


def test_shell_env_passes_check_env_on_real_sandboxes(local_backend: str) -> None:
    env = gymnasium.make("rollbox/Shell-v0", backend=local_backend)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped)
    env.close()


def test_vector_env_on_real_sandboxes(local_backend: str) -> None:
    envs = gymnasium.make_vec("rollbox/Shell-v0", num_envs=4, backend=local_backend)
    assert isinstance(envs, SandboxVectorEnv)
    envs.reset(seed=0, options={"task_id": "shell/hello-file"})
    _, rewards, terminated, _, _ = envs.step(
        ["echo hello world > hello.txt", "true", "echo hello > hello.txt", "cat /etc/hostname"]
    )
    assert rewards.tolist() == [1.0, 0.0, 0.0, 0.0] and terminated.tolist()[0]
    envs.close()
