"""API requests per rollout against the emulator: raw pods (baseline) vs claims + reuse.

A burst of TASKS x ROLLOUTS rollouts, each task with its own image (so its own template
and warm pool), the rollouts of a task one after another. Each rollout runs one command.
Counts are the client's own (every request rollbox sends, by verb), and the highest
number of requests that started within any one second, against the configured QPS.

    uv run python benchmarks/bench_kubernetes_requests.py --tasks 250 --rollouts 4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

from rollbox import NoPoolPolicy, Pool, PoolPolicy, StaticPoolPolicy
from rollbox.spec import SandboxSpec, Timeouts
from rollbox_kubernetes import KubernetesBackend
from rollbox_kubernetes.client import MUTATING_VERBS
from rollbox_kubernetes.testing import ApiServerEmulator, ShellBackend


async def burst(mode: str, tasks: int, rollouts: int, qps: float, burst_size: int,
                concurrency: int) -> dict[str, Any]:
    async with ApiServerEmulator(ShellBackend()) as emu:
        backend = KubernetesBackend(host=emu.url, mode=mode, run_id=f"bench-{mode}",
                                    warm_replicas=1, qps=qps, burst=burst_size)
        policy: PoolPolicy = NoPoolPolicy() if mode == "pod" else StaticPoolPolicy(size=0)
        gate = asyncio.Semaphore(concurrency)
        failures = 0

        async def task(i: int) -> None:
            nonlocal failures
            spec = SandboxSpec(image=f"task-{i}:latest", workdir="/work", reset_command="true",
                               timeouts=Timeouts(create_s=600))
            async with gate:
                for _ in range(rollouts):
                    try:
                        async with pool.lease(spec) as sandbox:
                            result = await sandbox.exec(["echo", "step"])
                            assert result.stdout == b"step\n"
                    except Exception:
                        failures += 1

        started = time.monotonic()
        async with backend, Pool(backend, policy=policy) as pool:
            await asyncio.gather(*(task(i) for i in range(tasks)))
        wall = time.monotonic() - started
        stats = backend.stats
        n = tasks * rollouts
        verbs = dict(sorted(stats.by_verb.items()))
        setup = {f"{v} {r}": c for (v, r), c in sorted(stats.by_resource.items())
                 if r in ("sandboxtemplates", "sandboxwarmpools")}
        setup_mutations = sum(c for (v, r), c in stats.by_resource.items()
                              if r in ("sandboxtemplates", "sandboxwarmpools")
                              and v in MUTATING_VERBS)
        per_rollout_creates = sum(c for (v, r), c in stats.by_resource.items()
                                  if v == "create" and r in ("sandboxclaims", "pods"))
        return {
            "mode": mode, "rollouts": n, "failures": failures, "wall_s": round(wall, 1),
            "per_rollout": {v: round(c / n, 3) for v, c in verbs.items()},
            "mutations_per_rollout": round(stats.mutations / n, 3),
            "setup_requests": setup,
            "sandbox_creates_per_rollout": round(per_rollout_creates / n, 3),
            "mutations_per_rollout_excl_setup": round((stats.mutations - setup_mutations) / n,
                                                      3),
            "requests": verbs,
            "max_requests_in_1s": stats.max_in_window(1.0),
            "qps": qps, "burst": burst_size,
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
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = [asyncio.run(burst(mode, args.tasks, args.rollouts, args.qps, args.burst,
                                 args.concurrency)) for mode in ("pod", "claim")]
    if args.json:
        print(json.dumps(results, indent=2))
        return
    verbs = sorted({v for r in results for v in r["requests"]})
    print("| mode | rollouts | " + " | ".join(f"{v}/rollout" for v in verbs)
          + " | mutations/rollout | claim or pod creates/rollout | mutations/rollout excl."
          " template+pool setup | max req in 1 s (QPS) | pods started | failures | wall s |")
    print("|" + "---|" * (len(verbs) + 9))
    for r in results:
        cells = [str(r["per_rollout"].get(v, 0)) for v in verbs]
        print(f"| {r['mode']} | {r['rollouts']} | " + " | ".join(cells)
              + f" | {r['mutations_per_rollout']} | {r['sandbox_creates_per_rollout']}"
              f" | {r['mutations_per_rollout_excl_setup']}"
              f" | {r['max_requests_in_1s']} ({r['qps']:g})"
              f" | {r['pods_started']} | {r['failures']} | {r['wall_s']} |")
    for r in results:
        print(f"{r['mode']}: requests {r['requests']}, template/pool setup "
              f"{r['setup_requests']}, leftover objects {r['leftover_objects']}")


if __name__ == "__main__":
    main()
