"""rollbox/SWE-v0 over core's synthetic task source."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import gymnasium
import pytest
import rollbox_gymnasium
from gymnasium.utils.env_checker import check_env
from rollbox.errors import CommandNotFoundError
from rollbox.sandbox import ExecRequest, ExecResult
from rollbox.testing import FakeBackend, FakeSandbox
from rollbox_bench import synthetic as swe

FAKE = {"kind": "fake", "n_images": 3}


@pytest.fixture
def swe_fake() -> Iterator[FakeBackend]:
    """The synthetic fake backend, tolerant of random text (check_env sends some): what
    the fake's tiny shell cannot parse or run exits 127 as a real shell would."""
    backend = swe.fake_backend(n_images=3)
    inner = backend.handler

    async def handler(sandbox: FakeSandbox, request: ExecRequest) -> ExecResult:
        try:
            return await inner(sandbox, request)
        except (ValueError, CommandNotFoundError):
            return ExecResult(127, stderr=b"sh: not found\n")

    backend.handler = handler
    yield backend
    rollbox_gymnasium.shutdown()
    assert not backend.live


def test_swe_episode_on_fake(swe_fake: FakeBackend) -> None:
    env = gymnasium.make("rollbox/SWE-v0", backend=swe_fake, task_options=FAKE)
    obs, info = env.reset(seed=0)
    assert info["task_id"].startswith("synthetic-") and "/repo" in obs and "submit" in obs
    obs, reward, terminated, _, info = env.step("python3 -B test_solution.py")
    assert obs == "0/4 passed\n" and info["exit_code"] == 1 and reward == 0.0
    # the hidden tests decide, and they come only with the final verdict
    assert info["verifier"] == {"verified": False} and not terminated
    _, reward, terminated, _, info = env.step("submit")
    assert (reward, terminated, info["verifier"]["submitted"]) == (0.0, True, True)
    env.close()


def test_swe_env_passes_check_env_on_fake(swe_fake: FakeBackend) -> None:
    env = gymnasium.make("rollbox/SWE-v0", backend=swe_fake, task_options=FAKE)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped)
    env.close()


def test_swe_solved_in_a_real_sandbox(
    local_backend: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    root = tmp_path_factory.mktemp("swe-images")
    env = gymnasium.make("rollbox/SWE-v0", backend=local_backend,
                         task_options={"n_images": 2, "root": str(root)})
    env.reset(seed=0)
    obs, reward, terminated, _, _ = env.step("python3 -B test_solution.py")
    assert "0/4 passed" in obs and (reward, terminated) == (0.0, False)
    # the bug is "+ (b + 1)": take the 1 away, as an agent would after reading the failures
    env.step(r"sed -i -E 's/(\+ [0-9]+)$/\1 - 1/' solution.py")
    obs, reward, terminated, _, _ = env.step("python3 -B test_solution.py")
    assert "4/4 passed" in obs and (reward, terminated) == (0.0, False)  # paid at the end
    _, reward, terminated, _, info = env.step("submit")
    assert (reward, terminated, info["verifier"]["score"]) == (1.0, True, 1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(env.unwrapped)
    env.close()
