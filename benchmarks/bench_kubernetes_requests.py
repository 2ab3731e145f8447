"""API requests per rollout against the emulator: raw pods (baseline) vs rollbox.

A burst of TASKS x ROLLOUTS rollouts through core's runner (``run_rollouts``), each
rollout running one command. Scenarios:

- ``pod`` (baseline): each task its own image; one bare pod per rollout
  (``NoPoolPolicy``: create per acquire, delete on release).
- ``rollbox``: each task its own image; core's ``LookaheadPolicy`` as ``rollbox bench``
  uses it (warm the next tasks within a budget, reuse a task's sandbox by reset). Its
  per-spec targets are 1, below ``warm_pool_min``, so the backend makes each task's
  sandbox as one direct ``Sandbox`` object and core warms it.
- ``shared``: every task the same image; ``StaticPoolPolicy(size)``: the backend takes
  the spec's warming over, one SandboxTemplate + SandboxWarmPool sized by the policy,
  one SandboxClaim per create.

Counts are the client's own (every request rollbox sends, by verb and resource), and the
highest number of requests that started within any one second, against the configured
QPS. Exec is counted apart from mutations (a read of a running pod, no object written).

    uv run python benchmarks/bench_kubernetes_requests.py --tasks 250 --rollouts 4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

from rollbox import NoPoolPolicy, Pool, PoolPolicy, Sandbox, StaticPoolPolicy
from rollbox.envs import Task
from rollbox.policies import LookaheadPolicy
from rollbox.results import RolloutOutput
from rollbox.runner import run_rollouts
from rollbox.spec import SandboxSpec, Timeouts
from rollbox_kubernetes import KubernetesBackend
from rollbox_kubernetes.client import MUTATING_VERBS
from rollbox_kubernetes.testing import ApiServerEmulator, ShellBackend

SCENARIOS = ("pod", "rollbox", "shared")


async def one_command(sandbox: Sandbox, task: Task, index: int) -> RolloutOutput:
    result = await sandbox.exec(["echo", "step"])
    return RolloutOutput(reward=1.0 if result.stdout == b"step\n" else 0.0)


def spec_for(i: int) -> SandboxSpec:
    return SandboxSpec(image=f"task-{i}:latest", workdir="/work", reset_command="true",
                       timeouts=Timeouts(create_s=600))


async def burst(scenario: str, args: argparse.Namespace) -> dict[str, Any]:
    concurrency, budget = args.concurrency, args.concurrency
    async with ApiServerEmulator(ShellBackend()) as emu:
        backend = KubernetesBackend(host=emu.url, mode="pod" if scenario == "pod" else "claim",
                                    run_id=f"bench-{scenario}", qps=args.qps,
                                    burst=args.burst)
        policy: PoolPolicy
        if scenario == "pod":
            policy, lookahead, cap = NoPoolPolicy(), 0, concurrency
            tasks = [Task(f"t{i}", spec_for(i), policy=one_command) for i in range(args.tasks)]
        elif scenario == "rollbox":  # as `rollbox bench` sets it up
            policy, lookahead = LookaheadPolicy(budget=budget), 2 * concurrency + budget
            cap = concurrency + budget
            tasks = [Task(f"t{i}", spec_for(i), policy=one_command) for i in range(args.tasks)]
        else:
            policy, lookahead, cap = StaticPoolPolicy(size=args.pool_size), 0, None
            tasks = [Task(f"t{i}", spec_for(0), policy=one_command) for i in range(args.tasks)]
        started = time.monotonic()
        async with backend:
            pool = Pool(backend, policy=policy, max_sandboxes=cap)
            try:
                report = await run_rollouts(pool, tasks, args.rollouts, concurrency=concurrency,
                                            lookahead=lookahead, rollout_timeout_s=600)
            finally:
                await pool.close()
        wall = time.monotonic() - started
        await asyncio.sleep(0.2)  # let the emulated controller finish its deletions
        stats = backend.stats
        n = len(tasks) * args.rollouts
        by_resource = {f"{v} {r}": c for (v, r), c in sorted(stats.by_resource.items())
                       if v != "exec"}
        creates = stats.by_verb["create"]
        return {
            "scenario": scenario, "policy": policy.name, "rollouts": n,
            "failures": report.failed, "wall_s": round(wall, 1),
            "creates_per_rollout": round(creates / n, 4),
            "mutations_per_rollout": round(stats.mutations / n, 4),
            "per_rollout": {v: round(c / n, 4) for v, c in sorted(stats.by_verb.items())},
            "requests": dict(sorted(stats.by_verb.items())),
            "requests_by_resource": by_resource,
            "max_requests_in_1s": stats.max_in_window(1.0),
            "qps": args.qps, "burst": args.burst,
            "pods_started": emu.cluster.pods_started,
            "leftover_objects": len(emu.store.objects),
            "mutating_verbs": sorted(MUTATING_VERBS),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=250)
    parser.add_argument("--rollouts", type=int, default=4)
    parser.add_argument("--qps", type=float, default=200.0)
    parser.add_argument("--burst", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--pool-size", type=int, default=64,
                        help="StaticPoolPolicy size of the shared-image scenario")
    parser.add_argument("--scenario", action="append", choices=SCENARIOS,
                        help="run only these (repeatable; default: all)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = [asyncio.run(burst(s, args)) for s in args.scenario or SCENARIOS]
    if args.json:
        print(json.dumps(results, indent=2))
        return
    verbs = sorted({v for r in results for v in r["requests"]})
    print("| scenario | policy | rollouts | creates/rollout | mutations/rollout | "
          + " | ".join(f"{v}/rollout" for v in verbs)
          + " | max req in 1 s (QPS) | pods started | failures | leftovers | wall s |")
    print("|" + "---|" * (len(verbs) + 10))
    for r in results:
        cells = [str(r["per_rollout"].get(v, 0)) for v in verbs]
        print(f"| {r['scenario']} | {r['policy']} | {r['rollouts']} | "
              f"{r['creates_per_rollout']} | {r['mutations_per_rollout']} | "
              + " | ".join(cells)
              + f" | {r['max_requests_in_1s']} ({r['qps']:g}) | {r['pods_started']}"
              f" | {r['failures']} | {r['leftover_objects']} | {r['wall_s']} |")
    for r in results:
        print(f"{r['scenario']}: {r['requests_by_resource']}")


if __name__ == "__main__":
    main()
