"""What a run of rollouts produces: one ``RolloutResult`` per rollout and a ``RunReport``.

Nothing is dropped silently: a rollout either succeeded (it has a reward) or failed
(it has a ``Failure`` with a kind, a message and ``retryable``). A rollout that never
finished because the run was cancelled is a failure of kind ``cancelled``. The report
checks ``requested == succeeded + failed`` and says so.

A rollout whose own workload broke its sandbox (``WorkloadError``: its memory, rollbox's
helpers) or overran a command's timeout succeeded in this sense: it is scored (by the
task's ``judge_failure``, 0.0 by default), counted apart as ``workload_failure``, never
retried and never masked. Retrying it would let a policy that crashes its sandbox
whenever it is failing make those failures vanish from the reward.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# Failure kinds the runner itself assigns (the others come from ``RollboxError.kind``).
ROLLOUT_ERROR = "rollout_error"
ROLLOUT_TIMEOUT = "rollout_timeout"
INVALID_OUTPUT = "invalid_output"
CANCELLED = "cancelled"
INTERNAL_ERROR = "internal_error"


@dataclass(frozen=True)
class RolloutOutput:
    """What a rollout function returns: a finite reward and free-form info."""

    reward: float
    info: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Failure:
    """Why a rollout failed, as the trainer needs to know it."""

    kind: str
    message: str
    retryable: bool


@dataclass(frozen=True)
class RolloutResult:
    """How one rollout (task x index) ended, after all its attempts."""

    task_id: str
    index: int
    reward: float | None = None
    info: Mapping[str, Any] = field(default_factory=dict)
    failure: Failure | None = None
    attempts: int = 0
    duration_s: float = 0.0
    sandbox_ids: tuple[str, ...] = ()
    attempt_failures: tuple[Failure, ...] = ()
    """Failures of earlier attempts that were retried (the last one is ``failure``)."""
    workload_failure: Failure | None = None
    """What the rollout's own workload broke (its sandbox's limits, rollbox's helpers,
    a command's timeout): the rollout is scored all the same (``reward``)."""

    @property
    def ok(self) -> bool:
        return self.failure is None

    @property
    def cancelled(self) -> bool:
        return self.failure is not None and self.failure.kind == CANCELLED

    def as_dict(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "index": self.index,
            "ok": self.ok,
            "reward": self.reward,
            "failure": None if self.failure is None else vars(self.failure).copy(),
            "attempts": self.attempts,
            "duration_s": self.duration_s,
            "retried_kinds": [f.kind for f in self.attempt_failures],
            "workload_failure": (None if self.workload_failure is None
                                 else vars(self.workload_failure).copy()),
        }


@dataclass(frozen=True)
class GroupOutcome:
    """A task's rollouts taken together. ``masked``: the trainer should drop the group."""

    task_id: str
    requested: int
    succeeded: int
    failed: int
    masked: bool


@dataclass
class RunReport:
    """Every rollout of a run, counted. Build with ``RunReport.build``."""

    requested: int
    results: list[RolloutResult]
    groups: dict[str, GroupOutcome]
    wall_s: float
    cancelled: bool = False
    metrics: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        requested: int,
        results: Sequence[RolloutResult],
        *,
        masked: set[str],
        wall_s: float,
        cancelled: bool = False,
        metrics: dict[str, Any] | None = None,
    ) -> RunReport:
        ordered = sorted(results, key=lambda r: (r.task_id, r.index))
        by_task: dict[str, list[RolloutResult]] = {}
        for result in ordered:
            by_task.setdefault(result.task_id, []).append(result)
        groups = {
            task_id: GroupOutcome(
                task_id=task_id,
                requested=len(rs),
                succeeded=sum(r.ok for r in rs),
                failed=sum(not r.ok for r in rs),
                masked=task_id in masked,
            )
            for task_id, rs in by_task.items()
        }
        return cls(requested, ordered, groups, wall_s, cancelled, metrics or {})

    @property
    def succeeded(self) -> int:
        return sum(r.ok for r in self.results)

    @property
    def failed(self) -> int:
        return sum(not r.ok for r in self.results)

    @property
    def accounted(self) -> bool:
        """The invariant: every requested rollout ended as exactly one result."""
        keys = {(r.task_id, r.index) for r in self.results}
        return (
            self.requested == self.succeeded + self.failed
            and len(keys) == len(self.results)
        )

    @property
    def failed_by_kind(self) -> dict[str, int]:
        return dict(sorted(Counter(r.failure.kind for r in self.results if r.failure).items()))

    @property
    def workload_failures_by_kind(self) -> dict[str, int]:
        """Scored rollouts whose own workload broke their sandbox, by kind."""
        counts = Counter(r.workload_failure.kind for r in self.results if r.workload_failure)
        return dict(sorted(counts.items()))

    @property
    def retried_by_kind(self) -> dict[str, int]:
        """Failures that were retried (and so did not end their rollout), by kind."""
        counts = Counter(f.kind for r in self.results for f in r.attempt_failures)
        return dict(sorted(counts.items()))

    @property
    def masked_tasks(self) -> list[str]:
        return sorted(t for t, g in self.groups.items() if g.masked)

    @property
    def canary_rejudged(self) -> int:
        """Rollouts whose answer the determinism canary judged a second time."""
        return sum("canary_reward" in r.info for r in self.results)

    @property
    def canary_mismatches(self) -> list[str]:
        """``task#index`` of the rollouts whose second verdict differed from the first:
        their task's judge is not deterministic."""
        return [f"{r.task_id}#{r.index}" for r in self.results
                if "canary_reward" in r.info and r.info["canary_reward"] != r.reward]

    @property
    def mean_reward(self) -> float:
        rewards = [r.reward for r in self.results if r.reward is not None]
        return sum(rewards) / len(rewards) if rewards else math.nan

    def as_dict(self, *, results: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rollouts": {
                "requested": self.requested,
                "succeeded": self.succeeded,
                "failed": self.failed,
                "failed_by_kind": self.failed_by_kind,
                "retried_by_kind": self.retried_by_kind,
                "workload_failures_by_kind": self.workload_failures_by_kind,
                "accounted": self.accounted,
            },
            "attempts": sum(r.attempts for r in self.results),
            "masked_groups": len(self.masked_tasks),
            "canary": {"rejudged": self.canary_rejudged,
                       "mismatched": self.canary_mismatches},
            "mean_reward": None if math.isnan(self.mean_reward) else self.mean_reward,
            "cancelled": self.cancelled,
            "wall_s": self.wall_s,
            "metrics": self.metrics,
        }
        if results:
            out["results"] = [r.as_dict() for r in self.results]
        return out

    def summary(self) -> str:
        kinds = ", ".join(f"{k}={v}" for k, v in self.failed_by_kind.items()) or "none"
        state = "cancelled, partial" if self.cancelled else "complete"
        workload = sum(self.workload_failures_by_kind.values())
        broke = f" ({workload} broke their own sandbox, scored)" if workload else ""
        canary = ""
        if self.canary_rejudged:
            mismatched = self.canary_mismatches
            canary = (f"; canary: {self.canary_rejudged} judged twice, {len(mismatched)} "
                      "with two rewards" + (f" ({', '.join(mismatched[:5])})"
                                            if mismatched else ""))
        return (
            f"{self.requested} rollouts ({state}): {self.succeeded} succeeded{broke}, "
            f"{self.failed} failed ({kinds}); {len(self.masked_tasks)} groups masked; "
            f"accounted={self.accounted}{canary}; {self.wall_s:.2f}s"
        )
