"""A ``Session``: episodes of tasks, one after another, on sandboxes leased from a pool.

Every adapter is a translation of these four calls onto its own API:

    start(task)   ─► the held sandbox, reset in place if its spec fits, else one leased
                     from the pool ─► task.setup ─► Started (the prompt; retryable
                     failures retried on a fresh sandbox, ``reset_retries`` times)
    step(action)  ─► task.act ─► task.judge ─► Transition (reward, terminated, truncated
                     at ``max_steps``); ``submit`` ─► task.act ─► task.verdict (sealed:
                     see ``Task``). A SandboxError anywhere in it ends the episode
                     truncated, reward 0.0, with ``failure`` set, and the sandbox goes
                     back broken: a failed sandbox is never a zero-reward outcome. One
                     the rollout caused (``WORKLOAD_OUTCOMES``) ends it terminated,
                     scored by ``task.judge_failure``, ``failure`` unset: an outcome
    verify()      ─► task.verdict: the final verdict without an action (sealed)
    close()       ─► the sandbox back to the pool (reset in place, kept warm)

Gymnasium: ``reset`` → start, ``step`` → step. A NeMo Gym resources server:
``seed_session`` → start, a tool call → step, ``verify`` → verify, ``close_session`` →
close. An agent that acts inside the sandbox by itself (OpenHands' agent-server): start,
then ``sandbox`` for the agent, then verify.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rollbox.envs.task import (
    SUBMIT,
    WORKLOAD_OUTCOMES,
    Judgement,
    StepOutcome,
    Task,
    is_sandbox_text,
)
from rollbox.errors import SANDBOX_SOUND_AFTER, RollboxError, SandboxError, UsageError
from rollbox.pool import Lease, Outcome, Pool
from rollbox.sandbox import Sandbox


@dataclass(frozen=True)
class Started:
    """An episode ready for its first action."""

    task: Task
    prompt: str
    sandbox_id: str
    reused_sandbox: bool
    attempts: int


@dataclass(frozen=True)
class Transition:
    """What one action did. ``failure`` set: the sandbox failed, the episode is over
    (``truncated``), and ``reward`` 0.0 is no outcome: drop it from training. A failure
    the rollout caused is an outcome instead (``terminated``, ``failure`` unset, the
    reason in ``info["workload_failure"]``): train on it."""

    step: StepOutcome | None
    reward: float
    terminated: bool
    truncated: bool
    steps: int
    info: Mapping[str, Any] = field(default_factory=dict)
    failure: RollboxError | None = None


class Session:
    """Episodes on one sandbox at a time, from ``pool`` (see the module docstring).

    ``max_steps`` truncates an episode (None: never); ``step_timeout_s`` kills an action
    running longer (the agent sees a timed-out outcome); ``acquire_timeout_s`` bounds the
    wait for a sandbox; ``reset_retries`` retries retryable failures of ``start``.
    """

    def __init__(self, pool: Pool, *, max_steps: int | None = None,
                 step_timeout_s: float | None = 60.0, acquire_timeout_s: float | None = 300.0,
                 reset_retries: int = 2) -> None:
        if max_steps is not None and max_steps < 1:
            raise UsageError(f"max_steps must be at least 1, got {max_steps}")
        self.pool = pool
        self.max_steps = max_steps
        self.step_timeout_s = step_timeout_s
        self.acquire_timeout_s = acquire_timeout_s
        self.reset_retries = reset_retries
        self.task: Task | None = None
        self.steps = 0
        self._lease: Lease | None = None
        self._dirty = False
        self._closed = False

    @property
    def sandbox(self) -> Sandbox | None:
        """The sandbox of the current episode, if any."""
        return self._lease.sandbox if self._lease is not None else None

    async def start(self, task: Task) -> Started:
        """Begin an episode of ``task``; raises what failed after the retries."""
        self.task = None
        attempts = 0
        while True:
            attempts += 1
            try:
                reused = await self._hold(task)
                assert self._lease is not None
                self._dirty = True
                await task.setup(self._lease.sandbox)
                break
            except RollboxError as error:
                if isinstance(error, SandboxError):
                    await self._drop(error)
                if not error.retryable or attempts > self.reset_retries:
                    raise
        self.task, self.steps = task, 0
        return Started(task, task.instruction, self._lease.sandbox.id, reused, attempts)

    async def step(self, action: str) -> Transition:
        """Run ``action`` in the episode's sandbox and judge it."""
        if not isinstance(action, str) or not is_sandbox_text(action):
            raise UsageError("an action must be a str without NUL that encodes as UTF-8")
        task, lease = self.task, self._lease
        if task is None or lease is None:
            raise UsageError("start an episode before stepping it (and after one ended)")
        self.steps += 1
        try:
            outcome = await task.act(lease.sandbox, action, timeout=self.step_timeout_s)
            if action.strip() == SUBMIT:
                self.task = None  # the verdict ends the episode, whatever it says
                judgement = await task.verdict(lease.sandbox)
                return Transition(outcome, float(judgement.reward), True, False, self.steps,
                                  judgement.info)
            judgement = await task.judge(lease.sandbox, outcome)
        except SandboxError as error:
            if isinstance(error, WORKLOAD_OUTCOMES):
                return await self._workload_outcome(task, error)
            return await self.fail(error)
        done = bool(judgement.terminated)
        truncated = not done and self.max_steps is not None and self.steps >= self.max_steps
        return Transition(outcome, float(judgement.reward), done, truncated, self.steps,
                          judgement.info)

    async def verify(self) -> Judgement:
        """The current episode's final verdict (``task.verdict``: sealed, so it ends the
        episode). A failure the rollout caused is scored as ``task.judge_failure`` says;
        any other sandbox failure raises (the sandbox goes back broken)."""
        task, lease = self.task, self._lease
        if task is None or lease is None:
            raise UsageError("start an episode before verifying it")
        self.task = None
        try:
            return await task.verdict(lease.sandbox)
        except SandboxError as error:
            await self._drop(error)
            if isinstance(error, WORKLOAD_OUTCOMES):
                return task.judge_failure(error)
            raise

    async def _workload_outcome(self, task: Task, error: SandboxError) -> Transition:
        """End the episode as its workload broke it: scored, ``failure`` unset."""
        self.task = None
        await self._drop(error)
        judgement = task.judge_failure(error)
        return Transition(None, float(judgement.reward), True, False, self.steps,
                          judgement.info)

    async def fail(self, error: RollboxError) -> Transition:
        """End the episode because of ``error``: truncated, reward 0.0, the sandbox
        given back (broken unless the error leaves it sound)."""
        self.task = None
        if isinstance(error, SandboxError):
            await self._drop(error)
        return Transition(None, 0.0, False, True, self.steps, failure=error)

    async def close(self) -> None:
        """Give the sandbox back to the pool (reset, kept warm). Idempotent."""
        self.task, self._closed = None, True
        if self._lease is not None:
            lease, self._lease = self._lease, None
            await lease.release(Outcome.OK)

    async def _hold(self, task: Task) -> bool:
        """Hold a clean sandbox of ``task.spec``; True when the held one was reused."""
        lease = self._lease
        if lease is not None and lease.spec == task.spec:
            if not self._dirty:
                return True
            try:
                await lease.sandbox.reset()
                self._dirty = False
                return True
            except SandboxError:
                self._lease = None
                await lease.release(Outcome.BROKEN)
        elif lease is not None:
            self._lease = None
            await lease.release(Outcome.OK)
        if self._closed:
            raise UsageError("this session is closed; make a new one")
        self._lease = await self.pool.acquire(task.spec, timeout=self.acquire_timeout_s)
        self._dirty = False
        return False

    async def _drop(self, error: SandboxError) -> None:
        if self._lease is not None:
            lease, self._lease = self._lease, None
            ok = isinstance(error, SANDBOX_SOUND_AFTER)
            await lease.release(Outcome.OK if ok else Outcome.BROKEN)
