"""``SandboxVectorEnv``: N sandbox envs stepped concurrently over one event loop.

``SyncVectorEnv`` steps its envs one after another, so a batch of commands that each
wait on I/O takes the sum of their times; ``AsyncVectorEnv`` buys concurrency with a
process per env. Sandbox commands are I/O for the Python process, so one coroutine that
``gather``s every sub-env's step on the loop thread is enough: a batch takes about as
long as its slowest command. Registered as the ``vector_entry_point`` of every rollbox
env id, so ``gymnasium.make_vec("rollbox/Shell-v0", num_envs=32)`` returns one.

Autoreset follows gymnasium's default, ``AutoresetMode.NEXT_STEP``: the step after a
sub-env terminated or truncated resets it (its action is ignored, reward 0.0).
Observations are tuples of ``str`` (the batched space of a text space is a ``Tuple``).

One sub-env's failure never fails the batch: a step failure ends that episode truncated
(see ``SandboxEnv``), and a reset that fails even after its retries reports
``info["failure_kind"]`` and ``info["retryable"]`` with ``truncated`` set, so the next
step resets that sub-env again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space
from rollbox.envs import Task
from rollbox.errors import RollboxError, UsageError

from rollbox_gymnasium.env import SandboxEnv, StepReturn

Obs = tuple[str, ...]


class SandboxVectorEnv(VectorEnv[Obs, Obs, np.ndarray]):
    """``num_envs`` ``SandboxEnv``s sharing one pool; keyword arguments go to each.

    ``max_episode_steps`` (what ``gymnasium.make_vec`` passes from the registration) is
    each sub-env's step limit.
    """

    metadata: dict[str, Any] = {  # noqa: RUF012  (gymnasium declares it per instance)
        "autoreset_mode": AutoresetMode.NEXT_STEP,
        "render_modes": [],
    }

    def __init__(
        self,
        num_envs: int = 1,
        *,
        max_episode_steps: int | None = None,
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        **env_kwargs: Any,
    ) -> None:
        if num_envs < 1:
            raise UsageError(f"num_envs must be at least 1, got {num_envs}")
        if AutoresetMode(autoreset_mode) is not AutoresetMode.NEXT_STEP:
            raise UsageError("SandboxVectorEnv supports only AutoresetMode.NEXT_STEP")
        env_kwargs.setdefault("max_steps", max_episode_steps)
        self.envs: list[SandboxEnv] = []
        try:
            for _ in range(num_envs):
                self.envs.append(SandboxEnv(**env_kwargs))
        except BaseException:
            for env in self.envs:
                env.close()
            raise
        self.num_envs = num_envs
        first = self.envs[0]
        self._thread = first._thread
        self.single_action_space = first.action_space
        self.single_observation_space = first.observation_space
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self._autoreset = np.zeros(num_envs, dtype=np.bool_)

    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[Obs, dict[str, Any]]:
        seeds = self._seeds(seed)
        tasks = [env._prepare_reset(s, options) for env, s in zip(self.envs, seeds, strict=True)]
        results = self._thread.run(
            _gather([_reset(env, t) for env, t in zip(self.envs, tasks, strict=True)])
        )
        self._autoreset = np.array([r[3] for r in results], dtype=np.bool_)
        infos: dict[str, Any] = {}
        for i, result in enumerate(results):
            infos = self._add_info(infos, result[4], i)
        return tuple(r[0] for r in results), infos

    def step(
        self, actions: Sequence[str]
    ) -> tuple[Obs, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        if len(actions) != self.num_envs:
            raise UsageError(f"expected {self.num_envs} actions, got {len(actions)}")
        pending: list[Awaitable[StepReturn]] = []
        for i, (env, action) in enumerate(zip(self.envs, actions, strict=True)):
            if self._autoreset[i]:
                pending.append(_reset(env, env._prepare_reset(None, None)))
            else:
                pending.append(env._astep(action))
        results = self._thread.run(_gather(pending))
        rewards = np.array([float(r[1]) for r in results], dtype=np.float64)
        terminated = np.array([r[2] for r in results], dtype=np.bool_)
        truncated = np.array([r[3] for r in results], dtype=np.bool_)
        infos: dict[str, Any] = {}
        for i, result in enumerate(results):
            infos = self._add_info(infos, result[4], i)
        self._autoreset = terminated | truncated
        return tuple(r[0] for r in results), rewards, terminated, truncated, infos

    def close_extras(self, **kwargs: Any) -> None:
        for env in self.envs:
            env.close()

    def _seeds(self, seed: int | Sequence[int | None] | None) -> list[int | None]:
        if seed is None:
            return [None] * self.num_envs
        if isinstance(seed, int | np.integer):
            return [int(seed) + i for i in range(self.num_envs)]
        seeds = list(seed)
        if len(seeds) != self.num_envs:
            raise UsageError(f"expected {self.num_envs} seeds, got {len(seeds)}")
        return seeds

    @property
    def tasks(self) -> list[Task | None]:
        """The current task of each sub-env."""
        return [env.task for env in self.envs]


async def _reset(env: SandboxEnv, task: Task) -> StepReturn:
    """Reset one sub-env, shaped as a step; a failure is reported, not raised."""
    try:
        obs, info = await env._areset(task)
    except RollboxError as error:
        if isinstance(error, UsageError):
            raise
        return await env._afail(error, task.id)
    return obs, 0.0, False, False, info


async def _gather(pending: Sequence[Awaitable[Any]]) -> list[Any]:
    return list(await asyncio.gather(*pending))
