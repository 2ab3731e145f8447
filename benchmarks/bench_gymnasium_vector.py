"""Batch-step latency: rollbox's SandboxVectorEnv vs gymnasium's SyncVectorEnv.

Every sub-env's step runs one I/O-bound command (``sleep 0.1`` by default). SyncVectorEnv
steps its envs one after another; SandboxVectorEnv steps them all at once over the one
event loop. Reports the median seconds per batch step of each and their ratio.

    uv run python benchmarks/bench_gymnasium_vector.py                  # fake backend
    uv run python benchmarks/bench_gymnasium_vector.py --backend local  # real sandboxes
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Sequence

import gymnasium
import rollbox_gymnasium
from rollbox.envs import Judgement, StepOutcome, Task
from rollbox.sandbox import Sandbox
from rollbox.spec import SandboxSpec
from rollbox.testing import FakeBackend
from rollbox_gymnasium import SandboxEnv, SandboxVectorEnv


class IdleTask(Task):
    """A task whose verdict costs nothing, so a step is just the command."""

    async def judge(self, sandbox: Sandbox, step: StepOutcome | None) -> Judgement:
        return Judgement(0.0, False)


class IdleSource:
    name = "idle"

    def tasks(self) -> Sequence[IdleTask]:
        return [IdleTask(id="bench/idle", spec=SandboxSpec(workdir="/tmp"), prompt="Run commands.")]


def batch_times(envs: gymnasium.vector.VectorEnv, action: str, steps: int) -> list[float]:
    envs.reset(seed=0)
    envs.step((action,) * envs.num_envs)  # warm-up
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        _, _, terminated, truncated, _ = envs.step((action,) * envs.num_envs)
        times.append(time.perf_counter() - started)
        assert not (terminated.any() or truncated.any()), "an episode ended mid-benchmark"
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="fake", help="fake (default) or local")
    parser.add_argument("--envs", type=int, default=32)
    parser.add_argument("--sleep", type=float, default=0.1, help="seconds each step sleeps")
    parser.add_argument("--steps", type=int, default=10, help="measured batch steps each")
    args = parser.parse_args()

    backend: object = FakeBackend() if args.backend == "fake" else args.backend
    kwargs = {"task_source": IdleSource(), "backend": backend, "max_steps": args.steps + 10}
    action = f"sleep {args.sleep}"

    sync = gymnasium.vector.SyncVectorEnv(
        [lambda: SandboxEnv(**kwargs) for _ in range(args.envs)]  # type: ignore[arg-type]
    )
    sync_times = batch_times(sync, action, args.steps)
    sync.close()
    vector = SandboxVectorEnv(args.envs, **kwargs)
    vector_times = batch_times(vector, action, args.steps)
    vector.close()
    rollbox_gymnasium.shutdown()

    sync_median = statistics.median(sync_times)
    vector_median = statistics.median(vector_times)
    result = {
        "backend": args.backend,
        "envs": args.envs,
        "step_sleep_s": args.sleep,
        "batch_steps": args.steps,
        "sync_vector_env_median_s": round(sync_median, 4),
        "sandbox_vector_env_median_s": round(vector_median, 4),
        "speedup": round(sync_median / vector_median, 1),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}",
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
