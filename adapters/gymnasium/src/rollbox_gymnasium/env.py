"""``SandboxEnv``: a gymnasium.Env whose actions are shell commands run in a sandbox.

    reset(seed)  ─► pick a task (env RNG, or options["task_id"]) ─► the held sandbox,
                    reset in place if its spec fits, else one leased from the shared pool
                    ─► task.setup ─► observation = the task's prompt
    step(cmd)    ─► sandbox.exec(cmd) ─► task.judge ─► (output text, reward, terminated,
                    truncated at max_steps, info: exit code, duration, truncation)
                    a SandboxError anywhere in it ─► truncated, reward 0.0,
                    info["failure_kind"], info["retryable"]; the sandbox goes back broken

The sync methods submit coroutines to the process's one loop thread
(``rollbox_gymnasium.runtime``); ``SandboxVectorEnv`` awaits the same coroutines
(``_areset``/``_astep``) for many envs at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, SupportsFloat

import gymnasium
from rollbox.backend import Backend
from rollbox.errors import (
    SANDBOX_SOUND_AFTER,
    ExecTimeoutError,
    RollboxError,
    SandboxError,
    UsageError,
)
from rollbox.pool import Lease, Outcome
from rollbox.sandbox import ExecResult, Sandbox

from rollbox_gymnasium.observation import clean, render_result, truncate
from rollbox_gymnasium.pools import SharedPool, registry
from rollbox_gymnasium.spaces import (
    DEFAULT_MAX_ACTION_CHARS,
    DEFAULT_MAX_OBSERVATION_CHARS,
    UnicodeText,
    is_sandbox_text,
)
from rollbox_gymnasium.tasks import EnvTask, EnvTaskSource, StepOutcome, resolve_task_source

StepReturn = tuple[str, SupportsFloat, bool, bool, dict[str, Any]]

# Failures after which the sandbox itself is still sound (a reset cleans up after them).


class SandboxEnv(gymnasium.Env[str, str]):
    """A sandboxed shell episode over one task.

    Args:
        task_source: a task source name (``"shell"``, or one registered through rollbox's
            ``rollbox_register_tasks`` hook) or an ``EnvTaskSource`` object.
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
        task_source: str | EnvTaskSource = "shell",
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
        self.source = resolve_task_source(task_source, task_options)
        self.tasks = self.source.tasks()
        self.max_steps = max_steps
        self.max_observation_chars = max_observation_chars
        self.step_timeout_s = step_timeout_s
        self.acquire_timeout_s = acquire_timeout_s
        self.reset_retries = reset_retries
        self.action_space = UnicodeText(max_action_chars)
        self.observation_space = UnicodeText(max_observation_chars)
        self._thread, pools = registry()
        self._shared: SharedPool | None = self._thread.run(
            pools.attach(backend, backend_options or {}, pool_options or {})
        )
        self._pools = pools
        self._lease: Lease | None = None
        self._dirty = False
        self._task: EnvTask | None = None
        self._steps = 0
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
        return self._lease.sandbox if self._lease is not None else None

    @property
    def task(self) -> EnvTask | None:
        return self._task

    def _prepare_reset(self, seed: int | None, options: dict[str, Any] | None) -> EnvTask:
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

    async def _areset(self, task: EnvTask) -> tuple[str, dict[str, Any]]:
        attempts = 0
        while True:
            attempts += 1
            try:
                reused = await self._obtain(task)
                assert self._lease is not None
                self._dirty = True
                await task.setup(self._lease.sandbox)
                break
            except RollboxError as error:
                if isinstance(error, SandboxError):
                    await self._drop(error)
                if not error.retryable or attempts > self.reset_retries:
                    raise
        self._task = task
        self._steps = 0
        text, _ = truncate(clean(task.prompt), self.max_observation_chars)
        self._last = text
        return text, {
            "task_id": task.id,
            "sandbox_id": self._lease.sandbox.id,
            "reused_sandbox": reused,
            "attempts": attempts,
        }

    async def _astep(self, action: str) -> StepReturn:
        if not isinstance(action, str) or not is_sandbox_text(action):
            raise UsageError("an action must be a str without NUL that encodes as UTF-8")
        if self._lease is None or self._task is None:
            raise UsageError("call reset() before step() (and after an episode ended)")
        task, sandbox = self._task, self._lease.sandbox
        self._steps += 1
        try:
            try:
                result = await sandbox.exec(action, timeout=self.step_timeout_s)
                timed_out = False
            except ExecTimeoutError as timeout:
                result = ExecResult(-9, timeout.stdout, timeout.stderr, timeout.timeout_s)
                timed_out = True
            self._dirty = True
            judgement = await task.judge(sandbox, StepOutcome(action, result, timed_out))
        except SandboxError as error:
            return await self._fail(error)
        rendered = render_result(result, self.max_observation_chars, timed_out=timed_out)
        self._last = rendered.text
        info: dict[str, Any] = {
            "exit_code": result.exit_code,
            "duration_s": result.duration_s,
            "timed_out": timed_out,
            "output_truncated": rendered.truncated,
            "output_chars": rendered.chars,
            "task_id": task.id,
            "sandbox_id": sandbox.id,
            "step": self._steps,
        }
        if judgement.info:
            info["verifier"] = dict(judgement.info)
        terminated = bool(judgement.terminated)
        truncated = (
            not terminated and self.max_steps is not None and self._steps >= self.max_steps
        )
        return rendered.text, float(judgement.reward), terminated, truncated, info

    async def _aclose(self) -> None:
        try:
            if self._lease is not None:
                lease, self._lease = self._lease, None
                await lease.release(Outcome.OK)
        finally:
            if self._shared is not None:
                await self._pools.detach(self._shared)

    # -- internals -------------------------------------------------------------------

    async def _obtain(self, task: EnvTask) -> bool:
        """Hold a clean sandbox of ``task.spec``; True when the held one was reused."""
        lease = self._lease
        if lease is not None and lease.spec == task.spec:
            if not self._dirty:
                return True
            try:
                await lease.sandbox.reset()
                return True
            except SandboxError:
                self._lease = None
                await lease.release(Outcome.BROKEN)
        elif lease is not None:
            self._lease = None
            await lease.release(Outcome.OK)
        if self._shared is None:
            raise UsageError("this env is closed; make a new one")
        self._lease = await self._shared.pool.acquire(task.spec, timeout=self.acquire_timeout_s)
        self._dirty = False
        return False

    async def _drop(self, error: SandboxError) -> None:
        if self._lease is not None:
            lease, self._lease = self._lease, None
            ok = isinstance(error, SANDBOX_SOUND_AFTER)
            await lease.release(Outcome.OK if ok else Outcome.BROKEN)

    async def _fail(self, error: SandboxError) -> StepReturn:
        """End the episode truncated: a failed sandbox is never a zero-reward outcome."""
        task_id = self._task.id if self._task is not None else None
        sandbox_id = error.sandbox_id or (self._lease.sandbox.id if self._lease else None)
        await self._drop(error)
        return self._failure(error, task_id, sandbox_id)

    def _failure(
        self, error: RollboxError, task_id: str | None, sandbox_id: str | None = None
    ) -> StepReturn:
        """The step tuple of an episode ended by ``error``: truncated, reward 0.0."""
        self._task = None
        text = clean(f"[rollbox: the sandbox failed ({error.kind}): {error.message}]")
        text, _ = truncate(text, self.max_observation_chars)
        self._last = text
        info: dict[str, Any] = {
            "failure_kind": error.kind,
            "retryable": error.retryable,
            "error": error.message,
            "task_id": task_id,
            "sandbox_id": sandbox_id,
            "step": self._steps,
        }
        return text, 0.0, False, True, info
