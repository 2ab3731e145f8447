"""One simulated training run per arm, with rollbox's real pool, policies and runner.

Arms:

* ``baseline`` — raw pods: a sandbox created for each rollout and deleted after it
  (``NoPoolPolicy``), placed by the default scheduler, its image pulled on demand;
* ``warm`` — a warm pool without image planning, upstream's naive strategy: a sandbox
  warmed for each upcoming rollout (the next step's included), deleted after use, placed
  by the default scheduler, its image pulled when the warm pod starts;
* ``rollbox`` — ``lookahead`` warming the next step's sandboxes while this step runs,
  reset in place between a task's rollouts, and the placement planner prepulling the
  next step's images onto nodes with room and placing each sandbox with its image.

The warm arms are told the next step as the current one starts (``Pool.expect``), and
the first step during the trainer's start-up (``startup_s``), as a training loop that
knows its next batch would; the baseline cannot use either.

**Accelerator idle.** A synchronous step's rollouts take ``wall`` seconds; with every
sandbox ready at once they would take ``ideal``, the longest task's work (its rollouts'
turns and commands). The GPU waits ``wall - ideal`` for sandboxes in that step;
``accelerator_idle_fraction`` is that wait summed over steps, over the run's whole time
(every step's ``wall`` and training phase).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rollbox.metrics import summarize
from rollbox.placement import PlacementPlanner
from rollbox.policies import LookaheadPolicy, NoPoolPolicy, PoolPolicy, StaticPoolPolicy
from rollbox.pool import Pool
from rollbox.runner import RetryPolicy, run_rollouts
from rollbox.spec import SandboxSpec

from rollbox_sim.backend import SimBackend
from rollbox_sim.clock import now, run_virtual
from rollbox_sim.model import Scenario
from rollbox_sim.workload import Corpus

ARMS = ("baseline", "warm", "rollbox")

Progress = Callable[[str, int, int], None]
"""``progress(arm, rollouts done, rollouts requested)``."""


class NaiveWarmPolicy(LookaheadPolicy):
    """Upstream's naive warm pool: a sandbox ready for each upcoming acquisition,
    deleted after use (no reuse), so in-flight sandboxes serve nothing."""

    name = "naive-warm"
    reuse = False

    def in_flight(self, counts: Mapping[SandboxSpec, int]) -> None:
        self._stale = True  # in-flight sandboxes serve nothing here: busy stays empty


@dataclass
class _Books:
    ttfc: list[float]
    requested: int = 0
    succeeded: int = 0
    failed: int = 0
    waited_s: float = 0.0
    run_s: float = 0.0


def run_scenario(scenario: Scenario, arms: Sequence[str] = ARMS,
                 progress: Progress | None = None, *, processes: int | None = None
                 ) -> dict[str, Any]:
    """Every arm in virtual time; the report ``rollbox simulate`` prints and writes.

    Arms are independent: with ``processes`` above 1 (default: one per arm, at most one
    per CPU) each runs in a process of its own, and ``progress`` hears of an arm only
    when it has finished."""
    corpus = Corpus(scenario.workload)
    report: dict[str, Any] = {"scenario": _describe(scenario, corpus), "arms": {}}
    workers = processes or min(len(arms), os.cpu_count() or 1)
    if workers <= 1 or len(arms) <= 1:
        for arm in arms:
            report["arms"][arm] = run_virtual(functools.partial(run_arm, arm, scenario, corpus,
                                                                progress))
        return report
    total = len(corpus.tasks) * scenario.workload.rollouts_per_task
    with concurrent.futures.ProcessPoolExecutor(workers) as pool:
        futures = {arm: pool.submit(_arm_in_process, arm, scenario) for arm in arms}
        for future in concurrent.futures.as_completed(futures.values()):
            arm = next(a for a, f in futures.items() if f is future)
            if progress is not None:
                progress(arm, total, total)
        for arm in arms:
            report["arms"][arm] = futures[arm].result()
    return report


def _arm_in_process(arm: str, scenario: Scenario) -> dict[str, Any]:
    corpus = Corpus(scenario.workload)
    return run_virtual(functools.partial(run_arm, arm, scenario, corpus, None))


async def run_arm(arm: str, scenario: Scenario, corpus: Corpus,
                  progress: Progress | None = None) -> dict[str, Any]:
    cluster, work = scenario.cluster, scenario.workload
    lead = scenario.lookahead_tasks or work.tasks_per_step
    planner = (PlacementPlanner(window=lead, gc_high=cluster.gc_high)
               if arm == "rollbox" else None)
    backend = SimBackend(cluster, image_sizes=corpus.sizes, planner=planner, seed=work.seed)
    policy = _policy(arm, lead, scenario.policy)
    steps = corpus.steps()
    books = _Books(ttfc=[])
    total = len(corpus.tasks) * work.rollouts_per_task
    retry = RetryPolicy(max_attempts=3, backoff_s=1.0)
    async with Pool(backend, policy=policy) as pool:
        if arm != "baseline":
            pool.expect([task.spec for task in steps[0]])
        await asyncio.sleep(work.startup_s)
        for k, tasks in enumerate(steps):
            if arm != "baseline":
                following = steps[k + 1] if k + 1 < len(steps) else []
                pool.expect([task.spec for task in following])
            started = now()
            step = await run_rollouts(
                pool, tasks, work.rollouts_per_task, corpus.rollout,
                concurrency=len(tasks), task_parallelism=1, retry=retry,
                rollout_timeout_s=None, lookahead=len(tasks) if arm != "baseline" else 0)
            wall = now() - started
            ideal = max(sum(corpus.plan(t.id, i).work_s for i in range(work.rollouts_per_task))
                        for t in tasks)
            books.waited_s += max(0.0, wall - ideal)
            books.run_s += wall + work.train_s
            books.requested += step.requested
            books.succeeded += step.succeeded
            books.failed += step.failed
            if progress is not None:
                progress(arm, books.requested, total)
            await asyncio.sleep(work.train_s)
        pool.expect([])
        books.ttfc = list(pool.metrics.samples.get("ttfc", []))
        counters = dict(pool.metrics.counters)
    await backend.aclose()
    nodes = backend.cluster.stats()
    writes = backend.cluster.api.writes
    ttfc = summarize(books.ttfc)
    return {
        "ttfc_s": {"mean": ttfc.mean, "p50": ttfc.p50, "p99": ttfc.p99, "max": ttfc.max},
        "ttfc_samples": sorted(books.ttfc),
        "creations": counters.get("creations", 0),
        "reuses": counters.get("reuses", 0),
        "api_writes": sum(writes.values()),
        "api_writes_by_verb": dict(sorted(writes.items())),
        "throttled": backend.cluster.api.throttled,
        "critical_path_pulls": nodes["critical_path_pulls"] + nodes["late_prepulls"],
        "prepulls": nodes["prepulls"],
        "bytes_pulled": nodes["bytes_pulled"],
        "evictions": nodes["evictions"],
        "placement_misses": backend.placement_misses,
        "slot_waits": backend.slot_waits,
        "accelerator_idle_fraction": books.waited_s / books.run_s if books.run_s else math.nan,
        "virtual_s": books.run_s,
        "rollouts": {"requested": books.requested, "succeeded": books.succeeded,
                     "failed": books.failed,
                     "accounted": books.requested == books.succeeded + books.failed},
    }


POLICIES: dict[str, Callable[[int], PoolPolicy]] = {
    "lookahead": lambda lead: LookaheadPolicy(budget=lead),
    "static": lambda lead: StaticPoolPolicy(size=1),
    "none": lambda lead: NoPoolPolicy(),
}
"""The rollbox arm's policies by name (``--policy``)."""


def _policy(arm: str, lead: int, name: str) -> PoolPolicy:
    if arm == "baseline":
        return NoPoolPolicy()
    if arm == "warm":
        return NaiveWarmPolicy(budget=lead)
    return POLICIES[name](lead)


def _describe(scenario: Scenario, corpus: Corpus) -> dict[str, Any]:
    cluster, work = scenario.cluster, scenario.workload
    return {
        "nodes": cluster.nodes, "slots_per_node": cluster.slots_per_node,
        "disk_gb_per_node": cluster.disk_gb, "pull_mbps": cluster.pull_mbps,
        "images": work.images, "rollouts_per_task": work.rollouts_per_task,
        "corpus_gb": round(corpus.total_bytes / 1e9, 1),
        "cluster_disk_gb": cluster.disk_gb * cluster.nodes,
        "tasks_per_step": work.tasks_per_step, "steps": len(corpus.steps()),
        "train_s": work.train_s, "seed": work.seed,
    }
