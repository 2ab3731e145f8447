"""``rollbox simulate``: a preset (or a scenario of your own) on a simulated cluster, every
arm side by side; ``rollbox simulate plan``: the cheapest cluster that meets a TTFC
target."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from rollbox import cli_args
from rollbox.errors import MissingExtraError, UsageError

from rollbox_sim import planning
from rollbox_sim.experiment import ARMS, POLICIES, run_scenario
from rollbox_sim.model import PRESETS, Scenario

TTFC = "time to first command: sandbox asked for → first command's result"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", choices=sorted(PRESETS), default="swebench-500x4",
                        help="the seed's workloads on its 10-node pool")
    _cluster_options(parser)
    parser.add_argument("--images", type=cli_args.positive_count,
                        help="task images (default: the preset's)")
    parser.add_argument("--seed", type=int, help="workload seed (default: the preset's)")
    parser.add_argument("--policy", choices=sorted(POLICIES), default="lookahead",
                        help="the rollbox arm's pool policy")
    parser.add_argument("--arms", default=",".join(ARMS), type=_arms,
                        help="arms to run, comma-separated")
    parser.add_argument("--set", metavar="NAME=VALUE", action="append", default=[],
                        dest="settings", help="any model parameter, e.g. cluster.api_qps=50 "
                        "or workload.think=2.0,0.5 (docs/simulate.md lists them)")
    parser.add_argument("--json", metavar="PATH", type=Path, help="write the report here")
    parser.add_argument("--plot", metavar="PATH", type=Path,
                        help="draw each arm's TTFC distribution to a PNG (needs matplotlib)")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    modes = parser.add_subparsers(dest="mode", metavar="plan")
    plan = modes.add_parser("plan", help="search the cheapest cluster meeting a TTFC target",
                            description=planning.__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    planning.configure(plan)


def _cluster_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=cli_args.positive_count, help="nodes (default: 10)")
    parser.add_argument("--disk-gb", type=cli_args.positive,
                        help="each node's image disk, GB (default: 500)")
    parser.add_argument("--pull-mbps", type=cli_args.positive,
                        help="each node's pull bandwidth, Mbit/s (default: 4000)")


def _arms(text: str) -> tuple[str, ...]:
    arms = tuple(a.strip() for a in text.split(",") if a.strip())
    unknown = [a for a in arms if a not in ARMS]
    if unknown or not arms:
        raise argparse.ArgumentTypeError(f"arms are {', '.join(ARMS)}; got {text!r}")
    return arms


def scenario_from(args: argparse.Namespace) -> Scenario:
    """The preset with the command line's changes."""
    scenario = PRESETS[args.preset]
    cluster = {k: v for k, v in (("nodes", args.nodes), ("disk_gb", args.disk_gb),
                                 ("pull_mbps", args.pull_mbps)) if v is not None}
    work = {k: v for k, v in (("images", args.images), ("seed", args.seed)) if v is not None}
    scenario = dataclasses.replace(
        scenario, policy=args.policy,
        cluster=dataclasses.replace(scenario.cluster, **cluster),
        workload=dataclasses.replace(scenario.workload, **work))
    settings: dict[str, str] = {}
    for item in args.settings:
        key, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"--set {item}: write NAME=VALUE")
        settings[key.strip()] = value.strip()
    return scenario.with_settings(settings)


def run(args: argparse.Namespace) -> int:
    if args.mode == "plan":
        return planning.run(args)
    if args.plot:
        _require_matplotlib()
    scenario = scenario_from(args)
    started = time.monotonic()
    progress = None if args.quiet else _progress
    report = run_scenario(scenario, args.arms, progress=progress)
    report["wall_s"] = time.monotonic() - started
    print(render(report))
    if args.json:
        args.json.write_text(json.dumps(_finite(report), indent=2) + "\n")
        print(f"report written to {args.json}")
    if args.plot:
        plot(report, args.plot)
        print(f"TTFC plot written to {args.plot}")
    lost = [arm for arm, r in report["arms"].items() if not r["rollouts"]["accounted"]]
    for arm in lost:
        print(f"rollbox simulate: arm {arm} did not account for every rollout",
              file=sys.stderr)
    return 1 if lost else 0


def _progress(arm: str, done: int, total: int) -> None:
    end = "\n" if done == total else ""
    print(f"\r{arm}: {done}/{total} rollouts", end=end, file=sys.stderr, flush=True)


def render(report: dict[str, Any]) -> str:
    s = report["scenario"]
    lines = [
        f"{s['images']} task images x {s['rollouts_per_task']} rollouts "
        f"({s['corpus_gb']:.0f} GB of images) on {s['nodes']} nodes "
        f"({s['disk_gb_per_node']:.0f} GB image disk each, {s['cluster_disk_gb']:.0f} GB in "
        f"all; {s['pull_mbps']:.0f} Mbit/s pulls), {s['steps']} synchronous steps of "
        f"{s['tasks_per_step']} tasks; virtual time",
        f"TTFC = {TTFC}; seconds, lower is better",
        "",
        f"{'arm':<9} {'TTFC mean':>9} {'p50':>7} {'p99':>8} {'max':>8} {'creations':>9} "
        f"{'API writes':>10} {'crit. pulls':>11} {'GPU idle':>8}  rollouts ok/failed",
    ]
    for arm, r in report["arms"].items():
        t, n = r["ttfc_s"], r["rollouts"]
        per = n["requested"] or 1
        lines.append(
            f"{arm:<9} {t['mean']:>9.2f} {t['p50']:>7.2f} {t['p99']:>8.2f} {t['max']:>8.2f} "
            f"{r['creations'] / per:>9.2f} {r['api_writes'] / per:>10.2f} "
            f"{r['critical_path_pulls']:>11} {r['accelerator_idle_fraction']:>8.1%}  "
            f"{n['succeeded']}/{n['failed']}")
    lines.append("(creations and API writes are per rollout; crit. pulls: rollouts that "
                 "waited for an image pull; GPU idle: the share of the run the accelerators "
                 "waited for a step's slowest sandbox)")
    arms = report["arms"]
    if "baseline" in arms and "rollbox" in arms:
        base, ours = arms["baseline"]["ttfc_s"], arms["rollbox"]["ttfc_s"]
        if ours["max"] > 0 and ours["mean"] > 0:
            lines.append(
                f"rollbox's slowest first command came {base['max'] / ours['max']:.0f}x "
                f"sooner than the baseline's ({ours['max']:.1f} s vs {base['max']:.1f} s), "
                f"its mean {base['mean'] / ours['mean']:.0f}x sooner.")
    if "wall_s" in report:
        lines.append(f"simulated in {report['wall_s']:.1f} s of wall time")
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 4.5))
    for arm, r in report["arms"].items():
        samples = r["ttfc_samples"]
        if samples:
            fraction = [(i + 1) / len(samples) for i in range(len(samples))]
            axes.plot(samples, fraction, label=f"{arm} (max {samples[-1]:.1f} s)")
    s = report["scenario"]
    axes.set_xscale("symlog", linthresh=1.0)
    axes.set_xlabel("TTFC, seconds (lower is better)")
    axes.set_ylabel("share of rollouts")
    axes.set_title(f"rollbox simulate: {s['images']} images x {s['rollouts_per_task']} "
                   f"rollouts on {s['nodes']} nodes")
    axes.legend(loc="lower right")
    axes.grid(True, alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def _require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise MissingExtraError("rollbox simulate --plot", extra="plot") from None


def _finite(value: Any) -> Any:
    """NaN and infinities as null (JSON has neither)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value
