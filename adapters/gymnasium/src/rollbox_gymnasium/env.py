"""``SandboxEnv``: a gymnasium.Env over rollbox's environment contract.

A translation of ``rollbox.envs.Session`` onto gymnasium's API:

    reset(seed)  ─► pick a task (env RNG, or options["task_id"]) ─► session.start(task)
                    ─► observation = the task's prompt
    step(cmd)    ─► session.step(cmd) ─► (output text, reward, terminated, truncated,
                    info: exit code, duration, truncation; on a sandbox failure
                    info["failure_kind"], info["retryable"], truncated, reward 0.0)

The sync methods submit coroutines to the process's one loop thread
(``rollbox.envs.bridge``); ``SandboxVectorEnv`` awaits the same coroutines
(``_areset``/``_astep``) for many envs at once. Envs of one process with equal backend
and options share one pool (``rollbox.envs.pools``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, SupportsFloat

import gymnasium
from rollbox.backend import Backend
from rollbox.envs import Session, Task, TaskSource, Transition, load_tasks
from rollbox.envs.pools import SharedPool, registry
from rollbox.errors import RollboxError, UsageError
from rollbox.sandbox import Sandbox

from rollbox_gymnasium.observation import clean, render_result, truncate
from rollbox_gymnasium.spaces import (
    DEFAULT_MAX_ACTION_CHARS,
    DEFAULT_MAX_OBSERVATION_CHARS,
    UnicodeText,
)

StepReturn = tuple[str, SupportsFloat, bool, bool, dict[str, Any]]


class SandboxEnv(gymnasium.Env[str, str]):
    """A sandboxed shell episode over one task.

    Args:
        task_source: the name of an environment registered through rollbox's
            ``rollbox_register_tasks`` hook (``"shell"``, ``"synthetic"``, a plugin's), or
            a ``rollbox.envs.TaskSource`` object.
        task_options: keyword arguments for the named task source's factory.
        backend: a backend name or instance; ``None`` opens ``$ROLLBOX_BACKEND``, else
            ``local`` (bubblewrap on this machine). ``"fake"`` is core's in-memory backend.
        backend_options / pool_options: passed to the backend / ``rollbox.Pool``. Envs of
            one process with equal backend and options share one pool.
        max_steps: truncate after this many steps (``gymnasium.make`` adds its own
            ``TimeLimit`` from the registered ``max_episode_steps`` as well).
        max_action_chars / max_observation_chars: text space lengths; output longer than
            ``max_observation_chars`` is cut in the middle (``info["output_truncated"]``).
        step_timeout_s: a command running longer is killed; the agent sees what it printed
            and a note, and the episode goes on (``info["timed_out"]``).
        acquire_timeout_s: how long ``reset`` waits for a sandbox from the pool.
        reset_retries: retryable sandbox failures during ``reset`` are retried this often
            on a fresh sandbox before the error is raised.
    """

    metadata: dict[str, Any] = {"render_modes": ["ansi"], "render_fps": 1}  # noqa: RUF012

    def __init__(
        self,
        task_source: str | TaskSource = "shell",
        *,
        task_options: Mapping[str, Any] | None = None,
        backend: str | Backend | None = None,
        backend_options: Mapping[str, Any] | None = None,
        pool_options: Mapping[str, Any] | None = None,
        max_steps: int | None = None,
        max_action_chars: int = DEFAULT_MAX_ACTION_CHARS,
        max_observation_chars: int = DEFAULT_MAX_OBSERVATION_CHARS,
        step_timeout_s: float | None = 60.0,
        acquire_timeout_s: float | None = 300.0,
        reset_retries: int = 2,
        render_mode: str | None = None,
    ) -> None:
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise UsageError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        if max_steps is not None and max_steps < 1:
            raise UsageError(f"max_steps must be at least 1, got {max_steps}")
        self.render_mode = render_mode
        self.tasks: list[Task] = load_tasks(task_source, task_options)
        self.max_observation_chars = max_observation_chars
        self.action_space = UnicodeText(max_action_chars)
        self.observation_space = UnicodeText(max_observation_chars)
        self._thread, pools = registry()
        self._shared: SharedPool | None = self._thread.run(
            pools.attach(backend, backend_options or {}, pool_options or {})
        )
        self._pools = pools
        self._session = Session(self._shared.pool, max_steps=max_steps,
                                step_timeout_s=step_timeout_s,
                                acquire_timeout_s=acquire_timeout_s, reset_retries=reset_retries)
        self._last = ""

    # -- gymnasium API ---------------------------------------------------------------

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        task = self._prepare_reset(seed, options)
        return self._thread.run(self._areset(task))

    def step(self, action: str) -> StepReturn:
        return self._thread.run(self._astep(action))

    def render(self) -> str | None:
        return self._last if self.render_mode == "ansi" else None

    def close(self) -> None:
        """Give the sandbox back to the pool (reset, kept warm) and leave the pool."""
        if self._shared is None:
            return
        if self._thread.alive:
            self._thread.run(self._aclose())
        self._shared = None

    # -- what the vector env awaits --------------------------------------------------

    @property
    def sandbox(self) -> Sandbox | None:
        """The sandbox of the current episode, if any."""
        return self._session.sandbox

    @property
    def task(self) -> Task | None:
        return self._session.task

    @property
    def max_steps(self) -> int | None:
        return self._session.max_steps

    def _prepare_reset(self, seed: int | None, options: dict[str, Any] | None) -> Task:
        """Seed the RNG and pick the task (synchronous, so RNG use stays in order)."""
        super().reset(seed=seed)
        options = options or {}
        if "task_id" in options:
            for task in self.tasks:
                if task.id == options["task_id"]:
                    return task
            raise UsageError(f"no task with id {options['task_id']!r} in this task source")
        if "task_index" in options:
            return self.tasks[int(options["task_index"])]
        return self.tasks[int(self.np_random.integers(len(self.tasks)))]

    async def _areset(self, task: Task) -> tuple[str, dict[str, Any]]:
        if self._shared is None:
            raise UsageError("this env is closed; make a new one")
        started = await self._session.start(task)
        text, _ = truncate(clean(started.prompt), self.max_observation_chars)
        self._last = text
        return text, {
            "task_id": task.id,
            "sandbox_id": started.sandbox_id,
            "reused_sandbox": started.reused_sandbox,
            "attempts": started.attempts,
        }

    async def _astep(self, action: str) -> StepReturn:
        task, sandbox = self._session.task, self._session.sandbox
        if task is None or sandbox is None:
            raise UsageError("call reset() before step() (and after an episode ended)")
        return self._translate(await self._session.step(action), task.id, sandbox.id)

    async def _afail(self, error: RollboxError, task_id: str | None) -> StepReturn:
        """The step tuple of an episode ended by ``error`` (a reset that failed)."""
        return self._translate(await self._session.fail(error), task_id, None)

    async def _aclose(self) -> None:
        try:
            await self._session.close()
        finally:
            if self._shared is not None:
                await self._pools.detach(self._shared)

    def _translate(self, transition: Transition, task_id: str | None,
                   sandbox_id: str | None) -> StepReturn:
        error, outcome = transition.failure, transition.step
        if error is None and outcome is None:  # the rollout broke its sandbox: an outcome
            broke = transition.info.get("workload_failure", "workload")
            text = clean(f"[rollbox: the episode's own commands broke its sandbox ({broke}): "
                         f"{transition.info.get('message', '')}]")
            self._last, _ = truncate(text, self.max_observation_chars)
            return self._last, transition.reward, True, False, {
                "workload_failure": broke, "verifier": dict(transition.info),
                "task_id": task_id, "sandbox_id": sandbox_id, "step": transition.steps,
            }
        if error is not None or outcome is None:
            assert error is not None
            text = clean(f"[rollbox: the sandbox failed ({error.kind}): {error.message}]")
            self._last, _ = truncate(text, self.max_observation_chars)
            return self._last, 0.0, False, True, {
                "failure_kind": error.kind,
                "retryable": error.retryable,
                "error": error.message,
                "task_id": task_id,
                "sandbox_id": getattr(error, "sandbox_id", None) or sandbox_id,
                "step": transition.steps,
            }
        result = outcome.result
        rendered = render_result(result, self.max_observation_chars, timed_out=outcome.timed_out)
        self._last = rendered.text
        info: dict[str, Any] = {
            "exit_code": result.exit_code,
            "duration_s": result.duration_s,
            "timed_out": outcome.timed_out,
            "output_truncated": rendered.truncated,
            "output_chars": rendered.chars,
            "task_id": task_id,
            "sandbox_id": sandbox_id,
            "step": transition.steps,
        }
        if transition.info:
            info["verifier"] = dict(transition.info)
        return (rendered.text, transition.reward, transition.terminated, transition.truncated,
                info)
