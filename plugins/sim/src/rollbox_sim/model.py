"""The parameters of a simulated cluster and of its workload, with their defaults.

Every duration is in (virtual) seconds, every size in bytes unless its name says
otherwise. Where a default comes from a measurement, its docstring says which; the rest
are the seed's published setup (a 10-node pool, 1.2-3 GB SWE images, 4 rollouts per
task) or stated assumptions, and every one can be set (``rollbox simulate --set``).
"""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass, field
from typing import Any

from rollbox.errors import UsageError

GB = 10**9
MB = 10**6


@dataclass(frozen=True)
class Spread:
    """A log-normal duration: ``median`` seconds, ``sigma`` its log-space spread (0 is
    always the median)."""

    median: float
    sigma: float = 0.0

    def draw(self, rng: random.Random) -> float:
        if self.sigma <= 0:
            return self.median
        return self.median * math.exp(rng.gauss(0.0, self.sigma))


@dataclass(frozen=True)
class ClusterModel:
    """Nodes, the API server and the controller."""

    nodes: int = 10
    """The seed's pool size."""
    slots_per_node: int = 64
    """Sandboxes a node runs at once (its CPU and memory, at a sandbox's requests)."""
    disk_gb: float = 500.0
    """Each node's image filesystem: 10 nodes hold about half of the R2E corpus."""
    pull_mbps: float = 4000.0
    """A node's image pull bandwidth, megabits per second, shared by its pulls."""
    parallel_pulls: int = 1
    """Pulls a node runs at once (the kubelet's ``serializeImagePulls: true`` is 1;
    ``maxParallelImagePulls`` otherwise); they share ``pull_mbps``."""
    gc_high: float = 0.85
    """Image GC starts above this share of the disk (``imageGCHighThresholdPercent``)."""
    gc_low: float = 0.80
    """... and deletes unused images, least recently used first, down to this share."""
    start: Spread = Spread(1.5, 0.3)
    """A pod's start once its image is there (scheduling, sandbox runtime, readiness):
    the test cluster's node agent starts a warm-imaged pod in 1-2 s (docs/benchmarks.md,
    the real control plane's raw-pod request→ready at low load)."""
    reset: Spread = Spread(0.4, 0.3)
    """An in-place reset (kill, restore the scratch tar, git reset): 0.3-0.5 s through
    pod exec on the test cluster (docs/benchmarks.md)."""
    exec_latency: Spread = Spread(0.05, 0.3)
    """Round trip of one command through pod exec, without the command itself."""
    api_qps: float = 200.0
    """Writes per second the API server admits (its APF seats and etcd together)."""
    api_burst: int = 100
    """Writes admitted at once above that rate before it answers 429."""
    retry_after_s: float = 1.0
    """The ``Retry-After`` of a 429."""
    client_qps: float = 20.0
    """The client's own pace (``KubeClient``'s default ``qps``)."""
    client_burst: int = 40
    create_fail_rate: float = 0.0
    """Share of pod starts that fail (a retryable ``CreateFailedError``)."""
    loss_rate: float = 0.0
    """Share of commands during which the sandbox is lost (its node, its pod)."""

    @property
    def disk_bytes(self) -> int:
        return int(self.disk_gb * GB)

    @property
    def pull_bytes_per_s(self) -> float:
        return self.pull_mbps * MB / 8


@dataclass(frozen=True)
class WorkloadModel:
    """The corpus and the RL loop around it.

    A synchronous RL step takes ``tasks_per_step`` tasks; each runs
    ``rollouts_per_task`` rollouts one after another on one sandbox (reset in place in
    between, as the seed's git reset), all tasks of the step at once. A rollout is
    ``actions`` turns of the policy (``think``, on the GPU) and a command (``command``,
    in the sandbox). Between steps the GPU trains for ``train_s``: the step after is
    known then, and may be prepared."""

    images: int = 500
    rollouts_per_task: int = 4
    image_gb_min: float = 1.2
    image_gb_max: float = 3.0
    """Image sizes, uniform in this range: SWE-bench and R2E images are over 1.2 GB."""
    tasks_per_step: int = 128
    actions_min: int = 8
    actions_max: int = 24
    think: Spread = Spread(1.5, 0.4)
    """The policy's turn per action (inference on the GPU)."""
    command: Spread = Spread(0.8, 0.8)
    """A command's own run time in the sandbox."""
    train_s: float = 20.0
    """The GPU's training phase after each step's rollouts."""
    startup_s: float = 120.0
    """The trainer's start-up before the first step (loading the policy onto the GPUs):
    the first step is known then, and may be prepared (0: a cold first step)."""
    seed: int = 0


@dataclass(frozen=True)
class Scenario:
    """What ``rollbox simulate`` runs: a cluster, a workload, and the rollbox arm's
    settings."""

    cluster: ClusterModel = field(default_factory=ClusterModel)
    workload: WorkloadModel = field(default_factory=WorkloadModel)
    lookahead_tasks: int | None = None
    """Tasks the rollbox arm warms and prepulls ahead (default: one step's)."""
    policy: str = "lookahead"
    """The rollbox arm's pool policy: ``lookahead`` (warm what comes next), ``static``
    (one sandbox per task asked for, kept) or ``none`` (create and delete)."""

    def with_settings(self, settings: dict[str, str]) -> Scenario:
        """This scenario with ``cluster.x=...`` / ``workload.y=...`` fields set from
        text (``--set``). Raises UsageError for an unknown field or a bad value."""
        scenario = self
        for key, text in settings.items():
            part, _, name = key.partition(".")
            target: ClusterModel | WorkloadModel
            if part == "cluster":
                target = scenario.cluster
            elif part == "workload":
                target = scenario.workload
            else:
                raise UsageError(f"--set {key}: no such parameter (cluster.<name> or "
                                 f"workload.<name>, see docs/simulate.md)")
            if name not in {f.name for f in dataclasses.fields(target)}:
                raise UsageError(f"--set {key}: {part} has no parameter {name!r} "
                                 f"(see docs/simulate.md)")
            changed = dataclasses.replace(target, **{name: _parse(key, text,
                                                                  getattr(target, name))})
            if isinstance(changed, ClusterModel):
                scenario = dataclasses.replace(scenario, cluster=changed)
            else:
                scenario = dataclasses.replace(scenario, workload=changed)
        return scenario


def _parse(key: str, text: str, current: Any) -> Any:
    try:
        if isinstance(current, Spread):
            median, _, sigma = text.partition(",")
            return Spread(float(median), float(sigma) if sigma else current.sigma)
        if isinstance(current, bool):
            return text.lower() in ("1", "true", "yes")
        if isinstance(current, int):
            return int(text)
        return float(text)
    except ValueError:
        raise UsageError(f"--set {key}={text}: not a number") from None


PRESETS: dict[str, Scenario] = {
    "swebench-500x4": Scenario(workload=WorkloadModel(images=500, rollouts_per_task=4)),
    "r2e-4578x4": Scenario(workload=WorkloadModel(images=4578, rollouts_per_task=4,
                                                  tasks_per_step=256)),
}
"""The seed's two workloads on its 10-node pool: 500 SWE-bench images, and 4,578 R2E
images (more than the nodes' disks hold together), 4 rollouts each."""
