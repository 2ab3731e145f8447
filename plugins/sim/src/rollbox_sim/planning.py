"""rollbox simulate plan: the cheapest cluster whose rollbox arm meets a TTFC target.

Searches, with the rollbox arm in virtual time on the first ``--steps`` steps of the
workload (steps are alike, so a few tell the steady state): the fewest nodes (each at
the largest disk) that meet ``--target-max-ttfc``; then the smallest image disk per node
at that count; then the smallest warm pool (tasks warmed and prepulled ahead). It says
which constraint binds: what goes wrong with one node, one disk step or one warm-pool
step less.

    rollbox simulate plan --images 4578 --image-gb 2.1 --rollouts-per-task 4 \\
        --target-max-ttfc 10
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rollbox import cli_args
from rollbox.errors import UsageError

from rollbox_sim.clock import run_virtual
from rollbox_sim.experiment import run_arm
from rollbox_sim.model import ClusterModel, Scenario, WorkloadModel
from rollbox_sim.workload import Corpus


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--images", type=cli_args.positive_count, required=True,
                        help="task images in the corpus")
    parser.add_argument("--image-gb", type=cli_args.positive, required=True,
                        help="an image's size, GB (each is drawn within ±25 %% of it)")
    parser.add_argument("--rollouts-per-task", type=cli_args.positive_count, default=4,
                        help="rollouts of each task, one after another on its sandbox")
    parser.add_argument("--target-max-ttfc", type=cli_args.positive, required=True,
                        help="seconds the slowest first command may take")
    parser.add_argument("--tasks-per-step", type=cli_args.positive_count, default=256,
                        help="tasks in one synchronous RL step")
    parser.add_argument("--steps", type=cli_args.positive_count, default=4,
                        help="steps simulated per candidate")
    parser.add_argument("--pull-mbps", type=cli_args.positive, default=4000.0,
                        help="each node's pull bandwidth, Mbit/s")
    parser.add_argument("--slots-per-node", type=cli_args.positive_count, default=64,
                        help="sandboxes a node runs at once")
    parser.add_argument("--max-nodes", type=cli_args.positive_count, default=128,
                        help="the most nodes tried")
    parser.add_argument("--max-disk-gb", type=cli_args.positive, default=2000.0,
                        help="the largest image disk per node tried, GB")
    parser.add_argument("--disk-step-gb", type=cli_args.positive, default=50.0,
                        help="the disk sizes tried differ by this, GB")
    parser.add_argument("--json", metavar="PATH", type=Path, help="write the plan here")


Evaluate = Callable[[int, float, int], dict[str, Any]]


def run(args: argparse.Namespace) -> int:
    _check(args)
    work = WorkloadModel(
        images=min(args.images, args.steps * args.tasks_per_step),
        rollouts_per_task=args.rollouts_per_task, tasks_per_step=args.tasks_per_step,
        image_gb_min=args.image_gb * 0.75, image_gb_max=args.image_gb * 1.25)
    base = ClusterModel(pull_mbps=args.pull_mbps, slots_per_node=args.slots_per_node)

    def evaluate(nodes: int, disk_gb: float, lead: int) -> dict[str, Any]:
        scenario = Scenario(cluster=dataclasses.replace(base, nodes=nodes, disk_gb=disk_gb),
                           workload=work, lookahead_tasks=lead)
        result = run_virtual(lambda: run_arm("rollbox", scenario, Corpus(work)))
        print(f"  {nodes:>4} nodes x {disk_gb:>6.0f} GB, warm {lead:>4}: TTFC max "
              f"{result['ttfc_s']['max']:.1f} s", file=sys.stderr)
        return result

    plan = search(evaluate, target=args.target_max_ttfc, max_nodes=args.max_nodes,
                  max_disk_gb=args.max_disk_gb, disk_step_gb=args.disk_step_gb,
                  min_disk_gb=args.image_gb * 1.25 / 0.85, lead=args.tasks_per_step)
    print(render(plan, args))
    if args.json:
        args.json.write_text(json.dumps(plan, indent=2, default=str) + "\n")
        print(f"plan written to {args.json}")
    return 0 if plan["met"] else 1


def search(evaluate: Evaluate, *, target: float, max_nodes: int, max_disk_gb: float,
           disk_step_gb: float, min_disk_gb: float, lead: int) -> dict[str, Any]:
    """Nodes first (binary search at the largest disk), then disk, then the warm pool."""
    def meets(result: dict[str, Any]) -> bool:
        return bool(result["ttfc_s"]["max"] <= target and result["rollouts"]["accounted"])

    top = evaluate(max_nodes, max_disk_gb, lead)
    if not meets(top):
        return {"met": False, "nodes": max_nodes, "disk_gb": max_disk_gb, "warm": lead,
                "result": _brief(top),
                "binding": f"even {max_nodes} nodes of {max_disk_gb:.0f} GB miss it: "
                           + _why(top)}
    lo, hi, best = 1, max_nodes, top
    while lo < hi:
        mid = (lo + hi) // 2
        result = evaluate(mid, max_disk_gb, lead)
        if meets(result):
            hi, best = mid, result
        else:
            lo = mid + 1
    nodes = hi
    below_nodes = evaluate(nodes - 1, max_disk_gb, lead) if nodes > 1 else None
    steps = max(1, int((max_disk_gb - min_disk_gb) // disk_step_gb))
    lo_s, hi_s = 0, steps  # disk = max_disk_gb - k * disk_step_gb, k in [0, steps]
    while lo_s < hi_s:
        mid = (lo_s + hi_s + 1) // 2
        result = evaluate(nodes, max_disk_gb - mid * disk_step_gb, lead)
        if meets(result):
            lo_s, best = mid, result
        else:
            hi_s = mid - 1
    disk = max_disk_gb - lo_s * disk_step_gb
    below_disk = (evaluate(nodes, disk - disk_step_gb, lead)
                  if disk - disk_step_gb >= min_disk_gb else None)
    warm, below_warm = lead, None
    for smaller in (lead // 2, lead // 4):
        if smaller < 1:
            break
        result = evaluate(nodes, disk, smaller)
        if not meets(result):
            below_warm = result
            break
        warm, best = smaller, result
    binding = []
    if below_nodes is not None:
        binding.append(f"with {nodes - 1} nodes: {_why(below_nodes)}")
    if below_disk is not None:
        binding.append(f"with {disk - disk_step_gb:.0f} GB: {_why(below_disk)}")
    if below_warm is not None:
        binding.append(f"with a warm pool of {warm // 2}: {_why(below_warm)}")
    return {"met": True, "nodes": nodes, "disk_gb": disk, "warm": warm,
            "result": _brief(best), "binding": "; ".join(binding) or "nothing smaller tried"}


def _why(result: dict[str, Any]) -> str:
    """What went wrong in a run that missed the target."""
    t = result["ttfc_s"]["max"]
    if result.get("slot_waits"):
        return (f"sandboxes waited for a free slot {result['slot_waits']} times (CPU and "
                f"memory bind), TTFC max {t:.1f} s")
    if result["critical_path_pulls"]:
        return (f"{result['critical_path_pulls']} rollouts waited for an image pull (pull "
                f"bandwidth or disk binds: a step's images are not all there in time), "
                f"TTFC max {t:.1f} s")
    return f"TTFC max {t:.1f} s"


def _brief(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if k != "ttfc_samples"}


def render(plan: dict[str, Any], args: argparse.Namespace) -> str:
    r = plan["result"]
    head = (f"{args.images} images of ~{args.image_gb:g} GB x {args.rollouts_per_task} "
            f"rollouts, steps of {args.tasks_per_step} tasks, target TTFC max "
            f"{args.target_max_ttfc:g} s (simulated on {args.steps} steps)")
    if not plan["met"]:
        return f"{head}\nno cluster up to the limits meets it: {plan['binding']}"
    return (f"{head}\n"
            f"cheapest: {plan['nodes']} nodes x {plan['disk_gb']:.0f} GB image disk, a warm "
            f"pool of {plan['warm']} tasks ahead: TTFC mean {r['ttfc_s']['mean']:.2f} s, "
            f"max {r['ttfc_s']['max']:.2f} s, GPU idle {r['accelerator_idle_fraction']:.1%}\n"
            f"binding: {plan['binding']}")


def _check(args: argparse.Namespace) -> None:
    if args.max_disk_gb < args.image_gb * 1.25 / 0.85:
        raise UsageError(f"--max-disk-gb {args.max_disk_gb:g} cannot hold one image of "
                         f"{args.image_gb * 1.25:g} GB under the GC threshold")
