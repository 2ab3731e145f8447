"""``rollbox bench``: the same burst of rollouts under two arms, compared.

* ``baseline``: policy ``none`` (create per rollout, close after, hydrate on demand),
  no pacing, no hints to the image store.
* ``rollbox``: policy ``lookahead`` (warm the next tasks within a budget, reuse a
  task's sandbox by reset for its next rollout), image hydration ahead of need through
  ``pool.upcoming`` → ``backend.hint_upcoming``, and paced creates (token bucket).

Each arm gets a fresh backend (and so a cold image store of the same capacity). The
workload is the synthetic SWE-style source (docs/bench.md). ``run_bench`` returns the
report as a JSON-able dict; the CLI (``bench_cli``) prints it as a table.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import inspect
import math
import os
import resource
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rollbox.backend import Backend
from rollbox.envs import Task
from rollbox.errors import UsageError
from rollbox.metrics import Metrics
from rollbox.paths import default_home
from rollbox.plugins import backend_class, get_plugin_manager
from rollbox.policies import LookaheadPolicy
from rollbox.pool import NoPoolPolicy, Pool
from rollbox.results import RolloutResult
from rollbox.runner import RetryPolicy, run_rollouts
from rollbox.spec import MiB

from rollbox_bench.chaos import ChaosBackend
from rollbox_bench.synthetic import SyntheticSource

ARMS = ("baseline", "rollbox")
Progress = Callable[[str, int, int, RolloutResult], None]


@dataclass(frozen=True)
class ChaosRates:
    kill: float = 0.0
    hang: float = 0.0
    create_fail: float = 0.0

    @property
    def active(self) -> bool:
        return self.kill > 0 or self.hang > 0 or self.create_fail > 0


@dataclass(frozen=True)
class BenchConfig:
    """The workload and both arms' settings. Defaults are the documented default run."""

    backend: str = "local"
    images: int = 48
    rollouts_per_task: int = 4
    concurrency: int = 8
    padding_bytes: int = 4 * MiB
    image_capacity_bytes: int | None = None
    """Image store capacity; default: a third of the corpus (at least what the rollbox
    arm keeps in use at once), so the corpus never fits."""
    p_correct: float = 0.5
    think_s: float = 0.25
    """Mean policy "thinking" time between a rollout's actions (``ThinkTime``). Real
    agent turns wait seconds for the model; 250 ms understates that (docs/bench.md)."""
    seed: int = 0
    budget: int | None = None
    """Warm sandboxes the lookahead policy may plan ahead (default: ``concurrency``)."""
    create_rate: float = 50.0
    create_burst: int = 8
    exec_timeout_s: float = 20.0
    rollout_timeout_s: float = 120.0
    max_attempts: int = 3
    chaos: ChaosRates = field(default_factory=ChaosRates)
    workdir: str | None = None
    """Where local images and per-arm state go (default: under the backend's home)."""
    fake_create_delay_s: float = 0.05
    fake_exec_delay_s: float = 0.001
    fake_reset_delay_s: float = 0.001
    arms: tuple[str, ...] = ARMS

    def __post_init__(self) -> None:
        if self.images < 1 or self.rollouts_per_task < 1 or self.concurrency < 1:
            raise UsageError("bench needs images, rollouts per task and concurrency >= 1")
        unknown = set(self.arms) - set(ARMS)
        if unknown or not self.arms:
            raise UsageError(f"bench arms must be among {ARMS}, got {self.arms}")
        checks = [
            ("padding_bytes", self.padding_bytes >= 0), ("think_s", self.think_s >= 0),
            ("p_correct", 0 <= self.p_correct <= 1), ("create_rate", self.create_rate > 0),
            ("exec_timeout_s", self.exec_timeout_s > 0), ("budget", (self.budget or 0) >= 0),
            ("image_capacity_bytes", (self.image_capacity_bytes or 1) > 0),
            *((f"chaos.{k}", 0 <= v <= 1) for k, v in asdict(self.chaos).items()),
        ]
        bad = [name for name, ok in checks if not ok]
        if bad:
            raise UsageError(f"bench settings out of range: {', '.join(bad)}")

    def image_bytes(self) -> int:
        """About what one task image takes in the store (its padding dominates)."""
        return self.padding_bytes + 64 * 1024

    @property
    def warm_budget(self) -> int:
        return self.concurrency if self.budget is None else self.budget

    @property
    def fake(self) -> bool:
        return self.backend == "fake"

    def capacity(self, source: SyntheticSource) -> int:
        if self.image_capacity_bytes is not None:
            return self.image_capacity_bytes
        floor = (self.concurrency + self.warm_budget + 2) * self.image_bytes()
        return max(floor, source.corpus_bytes // 3)


async def run_bench(config: BenchConfig, *, progress: Progress | None = None) -> dict[str, Any]:
    """Run every arm of ``config`` and return the report (see docs/bench.md)."""
    with _workspace(config) as (images_dir, state_root):
        source = SyntheticSource(
            config.images, seed=config.seed, padding_bytes=config.padding_bytes,
            p_correct=config.p_correct, kind="fake" if config.fake else "local",
            root=None if config.fake else images_dir, test_timeout_s=config.exec_timeout_s,
            think_s=config.think_s,
        )
        capacity = config.capacity(source)
        held = config.concurrency + config.warm_budget
        if not config.fake and capacity < config.image_bytes():
            raise UsageError(
                f"an image store of {capacity / MiB:.1f} MiB cannot hold one task image "
                f"(about {config.image_bytes() / MiB:.1f} MiB): raise --capacity-mb to at "
                f"least {math.ceil(config.image_bytes() * held / MiB)} (the {held} images "
                "the rollbox arm holds at once: --concurrency and its warm budget), or "
                "lower --padding-mb")
        if not config.fake:
            await asyncio.to_thread(source.build)
        tasks = list(source.tasks())
        arms: dict[str, Any] = {}
        for arm in config.arms:
            # No reference to the arm's backend outlives it: the next arm's peak memory
            # is its own, not both backends' at once.
            arms[arm] = await _run_arm(
                arm, config, _make_backend(config, source, state_root / arm, capacity),
                tasks, progress)
    return {
        "workload": {
            "backend": config.backend, "images": config.images,
            "rollouts_per_task": config.rollouts_per_task,
            "rollouts": config.images * config.rollouts_per_task,
            "concurrency": config.concurrency, "padding_bytes": config.padding_bytes,
            "corpus_bytes": source.corpus_bytes, "image_capacity_bytes": capacity,
            "p_correct": config.p_correct, "think_s": config.think_s, "seed": config.seed,
            "warm_budget": config.warm_budget, "create_rate": config.create_rate,
            "chaos": asdict(config.chaos),
        },
        "arms": arms,
        "ratios": _ratios(arms),
    }


async def _run_arm(
    arm: str, config: BenchConfig, backend: Backend, tasks: list[Task],
    progress: Progress | None,
) -> dict[str, Any]:
    chaos = None
    if config.chaos.active:
        chaos = backend = ChaosBackend(
            backend, kill_rate=config.chaos.kill, hang_rate=config.chaos.hang,
            create_fail_rate=config.chaos.create_fail, seed=config.seed,
        )
    metrics = Metrics()
    if arm == "baseline":
        pool = Pool(backend, policy=NoPoolPolicy(), max_sandboxes=config.concurrency,
                    metrics=metrics)
        lookahead = 0
    else:
        pool = Pool(backend, policy=LookaheadPolicy(budget=config.warm_budget),
                    max_sandboxes=config.concurrency + config.warm_budget,
                    create_rate=config.create_rate, create_burst=config.create_burst,
                    metrics=metrics)
        lookahead = 2 * config.concurrency + config.warm_budget
    total = len(tasks) * config.rollouts_per_task
    done = 0

    def on_result(result: RolloutResult) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(arm, done, total, result)

    retry = RetryPolicy(max_attempts=config.max_attempts, retry_kinds=frozenset({"exec_timeout"}))
    loop = asyncio.get_running_loop()
    gc.collect()  # what the previous arm left is not this arm's memory
    peak_scope = "arm" if _reset_peak_rss() else "process"
    rss_start = _rss_bytes()
    async with backend:
        started = loop.time()
        try:
            if arm == "rollbox":
                await _warm_up(pool, tasks, config)
            warmup_s = loop.time() - started
            report = await run_rollouts(
                pool, tasks, config.rollouts_per_task, concurrency=config.concurrency,
                retry=retry, rollout_timeout_s=config.rollout_timeout_s,
                lookahead=lookahead, on_result=on_result,
            )
        finally:
            await pool.close()
        leaked = pool.live
        inner = chaos.inner if chaos is not None else backend
        leftovers = await _leftovers(inner)
    ttfc = metrics.summary("ttfc")
    rollouts = report.as_dict()["rollouts"]
    return {
        "policy": pool.policy.name,
        "rollouts": rollouts,
        "ttfc_s": {"count": ttfc.count, "mean": ttfc.mean, "p50": ttfc.p50,
                   "p90": ttfc.p90, "p99": ttfc.p99, "max": ttfc.max},
        "ttfc_samples_s": sorted(metrics.samples.get("ttfc", [])),
        "latency_s": metrics.as_dict()["latency_s"],
        "creations": metrics.counters["creations"],
        "creations_per_rollout": metrics.counters["creations"] / max(1, total),
        "resets": metrics.counters["resets"],
        "reuses": metrics.counters["reuses"],
        "evictions": metrics.counters["evictions"],
        "quarantined": metrics.counters["quarantined"],
        "pool_failures_by_kind": metrics.failures_by_kind(),
        "chaos_injected": dict(chaos.injected) if chaos is not None else {},
        "attempts": sum(r.attempts for r in report.results),
        "masked_groups": len(report.masked_tasks),
        "mean_reward": report.as_dict()["mean_reward"],
        "leaked_sandboxes": leaked,
        "leftovers": leftovers,
        "image_store": _image_store_stats(inner),
        "rss_bytes": {"start": rss_start, "end": _rss_bytes(), "peak": _peak_rss_bytes(),
                      "peak_scope": peak_scope},
        "failure_examples": _failure_examples(report.results),
        "warmup_s": warmup_s,
        "wall_s": warmup_s + report.wall_s,
    }


async def _warm_up(pool: Pool, tasks: list[Task], config: BenchConfig) -> None:
    """The warm pool before the burst: hydrate the first images, then one sandbox for
    each task the burst starts with plus the lookahead budget (paced like any create)."""
    first = tasks[: config.concurrency + config.warm_budget]
    pool.backend.hint_upcoming([t.spec.image for t in first])
    await asyncio.gather(*(pool.prewarm(t.spec, 1) for t in first))


async def _leftovers(backend: Backend) -> list[str] | None:
    """What the backend still holds once the pool has closed everything (sandboxes,
    their directories, processes): must be empty. None if the backend cannot tell."""
    check = getattr(backend, "leftovers", None)
    if not callable(check):
        return None
    found = check()
    if inspect.isawaitable(found):
        found = await found
    return [str(item) for item in found]


def _image_store_stats(backend: Backend) -> dict[str, int] | None:
    """Hydrations and evictions of the backend's image store, if it keeps such counts
    (the local backend does): shows that a corpus larger than the store cycles."""
    stats = getattr(getattr(backend, "images", None), "stats", None)
    counts = {k: getattr(stats, k, None) for k in ("hydrations", "evictions")}
    if any(not isinstance(v, int) for v in counts.values()):
        return None
    return {k: int(v) for k, v in counts.items() if v is not None}


def _rss_bytes() -> int:
    """Resident set size of this process now (0 where /proc is not available)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE")


def _reset_peak_rss() -> bool:
    """Start measuring this process's peak resident set size afresh (Linux 4.0+: writing
    5 to clear_refs resets VmHWM), so each arm reports its own peak. False where that is
    not possible: the peak is then the process's since it started."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def _peak_rss_bytes() -> int:
    """Peak resident set size of this process (bench and backend; the sandboxes' own
    processes are not counted): since the last ``_reset_peak_rss``, where it worked."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def _failure_examples(results: Sequence[RolloutResult]) -> dict[str, str]:
    """One message per failure kind: a count says that rollouts failed, this says why."""
    examples: dict[str, str] = {}
    for result in results:
        if result.failure is not None:
            examples.setdefault(result.failure.kind, result.failure.message)
    return examples


def _ratios(arms: dict[str, Any]) -> dict[str, float | None]:
    if set(ARMS) - set(arms):
        return {}
    base, ours = arms["baseline"], arms["rollbox"]

    def ratio(a: float, b: float) -> float | None:
        return a / b if b and a == a and b == b else None

    out = {f"ttfc_{k}": ratio(base["ttfc_s"][k], ours["ttfc_s"][k])
           for k in ("mean", "p50", "p99", "max")}
    out["creations"] = ratio(base["creations"], ours["creations"])
    out["wall"] = ratio(base["wall_s"], ours["wall_s"])
    return out


def _make_backend(config: BenchConfig, source: SyntheticSource, state: Path,
                  capacity: int) -> Backend:
    if config.fake:
        return source.fake_backend(create_delay=config.fake_create_delay_s,
                                   exec_delay=config.fake_exec_delay_s,
                                   reset_delay=config.fake_reset_delay_s)
    cls = backend_class(get_plugin_manager(), config.backend)
    params = inspect.signature(cls).parameters
    options: dict[str, Any] = {}
    if "image_capacity_bytes" in params:
        options["image_capacity_bytes"] = capacity
    if "state_dir" in params:
        state.mkdir(parents=True, exist_ok=True)
        os.chmod(state, 0o755)
        options["state_dir"] = state
    return cls(**options)


@contextlib.contextmanager
def _workspace(config: BenchConfig) -> Any:
    """(images dir, per-run state root). Images are cached by seed and size; state is
    removed at the end."""
    if config.fake:
        yield Path("/nonexistent"), Path("/nonexistent")
        return
    root = Path(config.workdir) if config.workdir else _default_root()
    images = root / f"images-s{config.seed}-n{config.images}-p{config.padding_bytes}"
    images.mkdir(parents=True, exist_ok=True)
    for directory in (root, images):
        os.chmod(directory, 0o755)
    state = Path(tempfile.mkdtemp(prefix="run-", dir=root))
    os.chmod(state, 0o755)
    try:
        yield images, state
    finally:
        shutil.rmtree(state, ignore_errors=True)


def _default_root() -> Path:
    return default_home() / "bench"
