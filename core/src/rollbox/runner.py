"""Run tasks x rollouts over a pool with bounded concurrency; account for every rollout.

Data flow::

    tasks x rollouts_per_task ─► scheduler (task order, ≤ task_parallelism in flight per task)
        │  each dispatch: policy.in_flight(...) + pool.upcoming(next pending specs)  (lookahead)
        ▼
    attempt: pool.acquire ─► task.setup ─► rollout_fn(sandbox, task, index) ─► validate
             ─► task.verdict (a judged task: sealed, the reward) ─► pool.release
        │  retryable failure ─► release BROKEN, back off (asyncio.sleep), fresh sandbox
        │  failure the rollout caused (WorkloadError, a command's timeout) ─► scored by
        │      task.judge_failure, never retried, never masked
        ▼
    RolloutResult (success | failure kind/message/retryable, attempts) ─► group policy,
    observers (on_result, hook ``rollbox_rollout_finished``) ─► RunReport

The reward of a task that judges itself (``Task.judged``: a verifier, or its own
``judge``) is its ``verdict``, taken by the runner after the rollout function returns,
on the sealed sandbox: what the rollout function says it earned is kept in ``info`` as
``claimed_reward``, never paid.

A task's rollouts start in order and, by default, one at a time per task when there are
more tasks than slots, so a task's next rollout gets the sandbox its previous rollout
released, reset in place. Time comes only from the running loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import numbers
import random
import warnings
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from rollbox.envs import Judgement, RolloutFn, Task
from rollbox.envs.task import WORKLOAD_OUTCOMES
from rollbox.errors import (
    SANDBOX_SOUND_AFTER,
    RollboxError,
    SandboxError,
    UsageError,
)
from rollbox.plugins import notify
from rollbox.pool import Lease, Outcome, Pool
from rollbox.results import (
    CANCELLED,
    INTERNAL_ERROR,
    INVALID_OUTPUT,
    ROLLOUT_ERROR,
    ROLLOUT_TIMEOUT,
    Failure,
    RolloutOutput,
    RolloutResult,
    RunReport,
)
from rollbox.spec import SandboxSpec

if TYPE_CHECKING:
    import pluggy

ResultObserver = Callable[[RolloutResult], None]

@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries of retryable failures, each on a fresh sandbox, with backoff.

    ``retry_kinds`` adds failure kinds to retry although they are not marked retryable
    (e.g. ``{"exec_timeout"}`` when hung commands are an infrastructure fault for you).
    """

    max_attempts: int = 3
    backoff_s: float = 0.05
    backoff_factor: float = 2.0
    max_backoff_s: float = 2.0
    retry_kinds: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise UsageError("RetryPolicy.max_attempts must be at least 1")
        if self.backoff_s < 0 or self.backoff_factor < 1 or self.max_backoff_s < 0:
            raise UsageError("RetryPolicy backoff values must be >= 0 (factor >= 1)")
        object.__setattr__(self, "retry_kinds", frozenset(self.retry_kinds))

    def should_retry(self, failure: Failure, attempt: int) -> bool:
        return attempt < self.max_attempts and (
            failure.retryable or failure.kind in self.retry_kinds
        )

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        return min(self.max_backoff_s, self.backoff_s * self.backoff_factor ** (attempt - 1))


class GroupPolicy(StrEnum):
    """What a rollout's final failure means for the rest of its task's group.

    ``retry``: retryable failures were retried; the group is kept as it is.
    ``mask``: the group is marked ``masked`` so the trainer can drop it whole.
    """

    RETRY = "retry"
    MASK = "mask"


class RunCancelled(asyncio.CancelledError):
    """The run was cancelled; ``report`` accounts for every rollout (unfinished ones
    are failures of kind ``cancelled``). A CancelledError, so structured concurrency
    keeps working."""

    def __init__(self, report: RunReport) -> None:
        super().__init__(report.summary())
        self.report = report


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during ``run_rollouts_sync``; ``report`` is the partial report."""

    def __init__(self, report: RunReport) -> None:
        super().__init__(report.summary())
        self.report = report


async def run_rollouts(
    pool: Pool,
    tasks: Iterable[Task],
    rollouts_per_task: int,
    rollout_fn: RolloutFn | None = None,
    *,
    concurrency: int = 8,
    retry: RetryPolicy | None = None,
    group_policy: GroupPolicy | str = GroupPolicy.MASK,
    rollout_timeout_s: float | None = 900.0,
    acquire_timeout_s: float | None = None,
    lookahead: int | None = None,
    task_parallelism: int | None = None,
    plugin_manager: pluggy.PluginManager | None = None,
    on_result: ResultObserver | None = None,
    canary_rate: float = 0.0,
) -> RunReport:
    """Run ``rollouts_per_task`` rollouts of every task and return the report.

    Each attempt runs ``task.setup`` on its sandbox, then ``rollout_fn`` (default: each
    task's own ``policy``). ``lookahead`` is how many pending tasks the pool hears about
    ahead of need (default ``2 * concurrency``; 0 disables hints). ``task_parallelism``
    caps a task's rollouts in flight at once (default: spread ``concurrency`` over the
    tasks, at least 1). ``canary_rate``: the share of judged rollouts (of tasks with an
    ``answer``) whose answer is judged twice, the determinism canary (``Task.verdict``);
    the report counts them and names those whose two rewards differ. The sample is
    fixed by task id and index. On cancellation, outstanding rollouts are cancelled,
    their sandboxes released, and ``RunCancelled`` carrying the partial report is raised.
    """
    runner = _Runner(
        pool, list(tasks), rollouts_per_task, rollout_fn,
        concurrency=concurrency, retry=retry or RetryPolicy(),
        group_policy=GroupPolicy(group_policy), rollout_timeout_s=rollout_timeout_s,
        acquire_timeout_s=acquire_timeout_s, lookahead=lookahead,
        task_parallelism=task_parallelism, plugin_manager=plugin_manager, on_result=on_result,
        canary_rate=canary_rate,
    )
    return await runner.run()


def run_rollouts_sync(
    pool: Pool,
    tasks: Iterable[Task],
    rollouts_per_task: int,
    rollout_fn: RolloutFn | None = None,
    **options: Any,
) -> RunReport:
    """``run_rollouts`` for callers without an event loop.

    Runs on a new loop, then closes the pool and its backend, whose sandboxes belong to
    that loop. Ctrl-C raises ``RunInterrupted`` (a KeyboardInterrupt) with the partial
    report.
    """
    partial: list[RunReport] = []

    async def main() -> RunReport:
        try:
            return await run_rollouts(pool, tasks, rollouts_per_task, rollout_fn, **options)
        except RunCancelled as exc:
            partial.append(exc.report)
            raise
        finally:
            await pool.close()
            await pool.backend.aclose()

    try:
        return asyncio.run(main())
    except (KeyboardInterrupt, asyncio.CancelledError):
        if partial:
            raise RunInterrupted(partial[0]) from None
        raise


class _Scheduler:
    """Pending rollouts per task in task order; picks the next one a slot may start."""

    def __init__(self, tasks: list[Task], rollouts: int, cap: int) -> None:
        self.tasks = tasks
        self.cap = cap
        self.pending: OrderedDict[int, deque[int]] = OrderedDict(
            (t, deque(range(rollouts))) for t in range(len(tasks)) if rollouts > 0
        )
        self.in_flight: Counter[int] = Counter()

    def next(self) -> tuple[int, int] | None:
        for t, queue in self.pending.items():
            if self.in_flight[t] < self.cap:
                index = queue.popleft()
                if not queue:
                    del self.pending[t]
                self.in_flight[t] += 1
                return t, index
        return None

    def finish(self, t: int) -> None:
        self.in_flight[t] -= 1
        if not self.in_flight[t]:
            del self.in_flight[t]

    def window(self, n_tasks: int) -> list[SandboxSpec]:
        """Specs of pending rollouts, soonest first, over the next ``n_tasks`` tasks."""
        specs: list[SandboxSpec] = []
        for i, (t, queue) in enumerate(self.pending.items()):
            if i >= n_tasks:
                break
            specs.extend([self.tasks[t].spec] * len(queue))
        return specs

    def busy(self) -> dict[SandboxSpec, int]:
        counts: Counter[SandboxSpec] = Counter()
        for t, n in self.in_flight.items():
            counts[self.tasks[t].spec] += n
        return dict(counts)


class _Runner:
    def __init__(
        self,
        pool: Pool,
        tasks: list[Task],
        rollouts_per_task: int,
        rollout_fn: RolloutFn | None,
        *,
        concurrency: int,
        retry: RetryPolicy,
        group_policy: GroupPolicy,
        rollout_timeout_s: float | None,
        acquire_timeout_s: float | None,
        lookahead: int | None,
        task_parallelism: int | None,
        plugin_manager: pluggy.PluginManager | None,
        on_result: ResultObserver | None,
        canary_rate: float = 0.0,
    ) -> None:
        if not 0.0 <= canary_rate <= 1.0:
            raise UsageError(f"canary_rate must be between 0 and 1, got {canary_rate!r}")
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise UsageError(f"concurrency must be a positive int, got {concurrency!r}")
        if (
            isinstance(rollouts_per_task, bool)
            or not isinstance(rollouts_per_task, int)
            or rollouts_per_task < 0
        ):
            raise UsageError(f"rollouts_per_task must be an int >= 0, got {rollouts_per_task!r}")
        if rollout_timeout_s is not None and not rollout_timeout_s > 0:
            raise UsageError("rollout_timeout_s must be positive (or None for no limit)")
        ids = [t.id for t in tasks]
        dupes = sorted({i for i in ids if ids.count(i) > 1}) if len(set(ids)) < len(ids) else []
        if dupes:
            raise UsageError(f"task ids must be unique; repeated: {dupes[:5]}")
        if rollout_fn is None:
            missing = [t.id for t in tasks if t.policy is None]
            if missing:
                raise UsageError(
                    f"no rollout_fn given and tasks {missing[:5]} have no policy of their own"
                )
        self.pool = pool
        self.tasks = tasks
        self.rollouts_per_task = rollouts_per_task
        self.rollout_fn = rollout_fn
        self.concurrency = concurrency
        self.retry = retry
        self.group_policy = group_policy
        self.rollout_timeout_s = rollout_timeout_s
        self.acquire_timeout_s = acquire_timeout_s
        self.lookahead = 2 * concurrency if lookahead is None else max(0, lookahead)
        cap = task_parallelism or max(1, concurrency // max(1, len(tasks)))
        self.scheduler = _Scheduler(tasks, rollouts_per_task, cap)
        self.plugin_manager = plugin_manager or pool.plugin_manager
        self.on_result = on_result
        self.canary_rate = canary_rate
        self.results: dict[tuple[int, int], RolloutResult] = {}
        self.attempts: Counter[tuple[int, int]] = Counter()
        self.masked: set[str] = set()
        self.releases: set[asyncio.Task[None]] = set()

    @property
    def requested(self) -> int:
        return len(self.tasks) * self.rollouts_per_task

    async def run(self) -> RunReport:
        loop = asyncio.get_running_loop()
        started = loop.time()
        running: dict[asyncio.Task[RolloutResult], tuple[int, int]] = {}
        try:
            while True:
                dispatched = False
                while len(running) < self.concurrency:
                    job = self.scheduler.next()
                    if job is None:
                        break
                    running[asyncio.ensure_future(self._rollout(*job))] = job
                    dispatched = True
                if dispatched:
                    self._hint()
                if not running:
                    break
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for finished in done:
                    t, index = running.pop(finished)
                    self.scheduler.finish(t)
                    self._record(t, index, finished.result())
        except asyncio.CancelledError:
            for pending in running:
                pending.cancel()
            await asyncio.gather(*running, return_exceptions=True)
            for finished, (t, index) in running.items():
                if not finished.cancelled() and finished.exception() is None:
                    self._record(t, index, finished.result())
            await self._drain_releases()
            self._cancel_rest()
            raise RunCancelled(self._report(loop.time() - started, cancelled=True)) from None
        except BaseException:  # e.g. SystemExit from a rollout function: clean up, re-raise
            for pending in running:
                pending.cancel()
            await asyncio.gather(*running, return_exceptions=True)
            await self._drain_releases()
            raise
        finally:
            self._clear_hints()
        await self._drain_releases()
        return self._report(loop.time() - started)

    # -- one rollout -------------------------------------------------------------------

    async def _rollout(self, t: int, index: int) -> RolloutResult:
        task = self.tasks[t]
        loop = asyncio.get_running_loop()
        started = loop.time()
        earlier: list[Failure] = []
        sandboxes: list[str] = []
        attempt = 0
        while True:
            attempt += 1
            self.attempts[(t, index)] = attempt
            output, failure = await self._attempt(task, index, sandboxes)
            if output is not None:  # scored (the rollout may have broken its sandbox)
                return RolloutResult(
                    task.id, index, reward=float(output.reward), info=dict(output.info),
                    attempts=attempt, duration_s=loop.time() - started,
                    sandbox_ids=tuple(sandboxes), attempt_failures=tuple(earlier),
                    workload_failure=failure,
                )
            assert failure is not None
            if not self.retry.should_retry(failure, attempt):
                return RolloutResult(
                    task.id, index, failure=failure, attempts=attempt,
                    duration_s=loop.time() - started, sandbox_ids=tuple(sandboxes),
                    attempt_failures=tuple(earlier),
                )
            earlier.append(failure)
            await asyncio.sleep(self.retry.delay(attempt))

    def _canary(self, task: Task, index: int) -> bool:
        """Whether rollout ``index`` of ``task`` is in the canary's sample (fixed by
        task id and index, so a retry and a rerun sample the same)."""
        if not self.canary_rate or task.answer is None:
            return False
        return random.Random(f"rollbox-canary:{task.id}#{index}").random() < self.canary_rate

    async def _attempt(
        self, task: Task, index: int, sandboxes: list[str]
    ) -> tuple[RolloutOutput | None, Failure | None]:
        """(output, None) when it succeeded; (None, failure) when it failed; (output,
        failure) when the rollout broke its own sandbox and ``output`` scores that."""
        try:
            lease = await self.pool.acquire(task.spec, timeout=self.acquire_timeout_s)
        except RollboxError as exc:
            return None, Failure(exc.kind, exc.message, exc.retryable)
        except Exception as exc:  # a backend bug: account for it, do not crash the run
            return None, Failure(INTERNAL_ERROR, f"acquire raised {exc!r}", False)
        sandboxes.append(lease.raw.id)
        fn = self.rollout_fn or task.policy
        assert fn is not None
        outcome = Outcome.BROKEN  # until the rollout function returns or fails soundly
        try:
            try:
                async with asyncio.timeout(self.rollout_timeout_s) as deadline:
                    await task.setup(lease.sandbox)
                    raw = await fn(lease.sandbox, task, index)
                    problem = _invalid(raw)
                    if problem:
                        outcome = Outcome.OK
                        return None, Failure(INVALID_OUTPUT, problem, False)
                    assert isinstance(raw, RolloutOutput)
                    if task.judged:
                        raw = _judged(raw, await task.verdict(
                            lease.sandbox, canary=self._canary(task, index)))
                        problem = _invalid(raw)
                        if problem:
                            outcome = Outcome.OK
                            return None, Failure(INVALID_OUTPUT, f"the verdict: {problem}",
                                                 False)
            except TimeoutError as exc:
                if deadline.expired():
                    return None, Failure(
                        ROLLOUT_TIMEOUT,
                        f"rollout {task.id}#{index} ran past {self.rollout_timeout_s}s",
                        False,
                    )
                outcome = Outcome.OK
                return None, Failure(ROLLOUT_ERROR, _describe(exc), False)
            except SandboxError as exc:
                if isinstance(exc, SANDBOX_SOUND_AFTER):
                    outcome = Outcome.OK
                failure = Failure(exc.kind, exc.message, exc.retryable)
                if isinstance(exc, WORKLOAD_OUTCOMES) and exc.kind not in self.retry.retry_kinds:
                    verdict = task.judge_failure(exc)
                    return RolloutOutput(verdict.reward, dict(verdict.info)), failure
                return None, failure
            except RollboxError as exc:
                outcome = Outcome.OK
                return None, Failure(exc.kind, exc.message, exc.retryable)
            except Exception as exc:
                outcome = Outcome.OK
                return None, Failure(ROLLOUT_ERROR, _describe(exc), False)
            outcome = Outcome.OK
            return raw, None
        finally:
            await self._release(lease, outcome)

    async def _release(self, lease: Lease, outcome: Outcome) -> None:
        """Release even if this rollout is being cancelled: the release runs in its own
        task, and the run waits for every such task before it returns."""
        release = asyncio.ensure_future(self.pool.release(lease, outcome))
        self.releases.add(release)
        release.add_done_callback(self.releases.discard)
        await asyncio.shield(release)

    async def _drain_releases(self) -> None:
        while self.releases:
            await asyncio.gather(*list(self.releases), return_exceptions=True)

    # -- bookkeeping -------------------------------------------------------------------

    def _hint(self) -> None:
        if not self.lookahead:
            return
        in_flight = getattr(self.pool.policy, "in_flight", None)
        if callable(in_flight):
            in_flight(self.scheduler.busy())
        self.pool.upcoming(self.scheduler.window(self.lookahead))

    def _clear_hints(self) -> None:
        if not self.lookahead:
            return
        with contextlib.suppress(Exception):
            in_flight = getattr(self.pool.policy, "in_flight", None)
            if callable(in_flight):
                in_flight({})
            self.pool.upcoming([])

    def _record(self, t: int, index: int, result: RolloutResult) -> None:
        self.results[(t, index)] = result
        if result.failure is not None and self.group_policy is GroupPolicy.MASK:
            self.masked.add(result.task_id)
        if self.on_result is not None:
            self.on_result(result)
        notify(self.plugin_manager, "rollbox_rollout_finished", self.pool.metrics,
               result=result)

    def _cancel_rest(self) -> None:
        """Every rollout without a result becomes a failure of kind ``cancelled``."""
        for t, task in enumerate(self.tasks):
            for index in range(self.rollouts_per_task):
                if (t, index) not in self.results:
                    attempts = self.attempts[(t, index)]
                    state = "in flight" if attempts else "not started"
                    self._record(t, index, RolloutResult(
                        task.id, index, attempts=attempts,
                        failure=Failure(CANCELLED, f"run cancelled ({state})", True),
                    ))

    def _report(self, wall_s: float, *, cancelled: bool = False) -> RunReport:
        report = RunReport.build(
            self.requested, list(self.results.values()), masked=self.masked,
            wall_s=wall_s, cancelled=cancelled, metrics=self.pool.metrics.as_dict(),
        )
        if not report.accounted:  # a runner bug; surface it loudly but keep the data
            warnings.warn(f"rollbox runner lost track of rollouts: {report.summary()}",
                          RuntimeWarning, stacklevel=2)
        return report


def _judged(claimed: RolloutOutput, verdict: Judgement) -> RolloutOutput:
    """The output a judged task pays: the verdict's reward; the rollout's own claim and
    the verdict's info kept beside the rollout's info."""
    info = {**claimed.info, **verdict.info, "claimed_reward": claimed.reward}
    return RolloutOutput(float(verdict.reward), info)


def _invalid(raw: object) -> str | None:
    """Why a rollout function's return value is not a valid RolloutOutput, or None."""
    if not isinstance(raw, RolloutOutput):
        return f"rollout function returned {type(raw).__name__}, expected RolloutOutput"
    reward = raw.reward
    if isinstance(reward, bool) or not isinstance(reward, numbers.Real):
        return f"reward must be a real number, got {type(reward).__name__}"
    if not math.isfinite(float(reward)):
        return f"reward must be finite, got {reward!r}"
    if not isinstance(raw.info, Mapping):
        return f"info must be a mapping, got {type(raw.info).__name__}"
    return None


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
