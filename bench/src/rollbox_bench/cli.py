"""The ``rollbox bench`` command: arguments, progress on stderr, the table, JSON, PNG."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from rollbox import cli_args, settings
from rollbox.errors import MissingExtraError
from rollbox.plugins import DEFAULT_BACKEND, backend_class, get_plugin_manager
from rollbox.results import RolloutResult
from rollbox.spec import MiB

from rollbox_bench.bench import ARMS, BenchConfig, ChaosRates, run_bench

BENCH_HINTS = {"image_store_full": " (the bench sets its store's capacity: --capacity-mb)"}
"""What to change in the bench itself for a failure kind whose message names the
backend's own setting."""


def configure(parser: argparse.ArgumentParser) -> None:
    d = BenchConfig()
    parser.add_argument("--backend", type=cli_args.nonempty,
                        help=f"backend to run on (default: $ROLLBOX_BACKEND, else "
                             f"{DEFAULT_BACKEND!r}; 'fake' runs in memory: seconds with "
                             "--think-ms 0)")
    parser.add_argument("--images", type=cli_args.positive_count, default=d.images,
                        help="distinct task images")
    parser.add_argument("--rollouts", type=cli_args.positive_count,
                        default=d.rollouts_per_task, help="rollouts per task")
    parser.add_argument("--concurrency", type=cli_args.positive_count, default=d.concurrency,
                        help="rollouts in flight at once")
    parser.add_argument("--padding-mb", type=cli_args.non_negative,
                        default=d.padding_bytes / MiB, help="random bytes per image, MiB")
    parser.add_argument("--capacity-mb", type=cli_args.positive,
                        help="image store capacity, MiB (default: a third of the corpus)")
    parser.add_argument("--budget", type=cli_args.count,
                        help="warm sandboxes planned ahead by lookahead (default: concurrency)")
    parser.add_argument("--create-rate", type=cli_args.positive, default=d.create_rate,
                        help="creates per second in the rollbox arm")
    parser.add_argument("--p-correct", type=cli_args.fraction, default=d.p_correct,
                        help="probability the scripted patch is right")
    parser.add_argument("--think-ms", type=cli_args.non_negative, default=d.think_s * 1e3,
                        help="mean policy inference time between a rollout's actions, ms, "
                             "seeded log-normal; 0 = back to back")
    parser.add_argument("--seed", type=int, default=d.seed, help="workload seed")
    parser.add_argument("--chaos", metavar="SPEC", type=parse_chaos,
                        help="inject faults, e.g. 'kill=0.05,hang=0.01,create=0.02' "
                             "(rates from 0 to 1, per command / per create; default: none)")
    parser.add_argument("--exec-timeout", type=cli_args.positive, default=d.exec_timeout_s,
                        help="seconds before a command counts as hung")
    parser.add_argument("--arms", type=_arms, default=",".join(ARMS),
                        help="arms to run, comma-separated")
    parser.add_argument("--workdir", type=cli_args.nonempty,
                        help="directory for images and state (default: under ROLLBOX_HOME)")
    parser.add_argument("--json", metavar="PATH", type=_output_path,
                        help="write the report here")
    parser.add_argument("--plot", metavar="PATH", type=_output_path,
                        help="draw both TTFC distributions to a PNG (needs the plot extra)")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")


def parse_chaos(text: str | None) -> ChaosRates:
    if not text:
        return ChaosRates()
    names = {"kill": "kill", "hang": "hang", "create": "create_fail",
             "create_fail": "create_fail"}
    rates: dict[str, float] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or key not in names:
            raise argparse.ArgumentTypeError(
                f"cannot read {part!r}; use kill=R,hang=R,create=R with R from 0 to 1")
        try:
            rate = float(value)
        except ValueError:
            rate = math.nan
        if not 0 <= rate <= 1:
            raise argparse.ArgumentTypeError(f"{key} rate {value!r} is not a number from 0 to 1")
        rates[names[key]] = rate
    return ChaosRates(**rates)


def _arms(text: str) -> tuple[str, ...]:
    arms = tuple(a.strip() for a in text.split(",") if a.strip())
    if not arms or set(arms) - set(ARMS):
        raise argparse.ArgumentTypeError(f"must be {', '.join(ARMS)} or both, got {text!r}")
    return arms


def _output_path(text: str) -> Path:
    """A file the report can be written to, checked before the run rather than after."""
    path = Path(text).expanduser()
    parent = path.parent if str(path.parent) else Path(".")
    if not text.strip() or path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a directory, not a file path")
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"the directory {str(parent)!r} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"cannot write into {str(parent)!r}")
    return path


def config_from(args: argparse.Namespace) -> BenchConfig:
    # An unknown backend fails here, before any work, naming $ROLLBOX_BACKEND if from it.
    backend_class(get_plugin_manager(), args.backend)
    return BenchConfig(
        backend=args.backend or settings.text("ROLLBOX_BACKEND", DEFAULT_BACKEND),
        images=args.images, rollouts_per_task=args.rollouts,
        concurrency=args.concurrency, padding_bytes=int(args.padding_mb * MiB),
        image_capacity_bytes=None if args.capacity_mb is None else int(args.capacity_mb * MiB),
        budget=args.budget, create_rate=args.create_rate, p_correct=args.p_correct,
        think_s=args.think_ms / 1e3, seed=args.seed, chaos=args.chaos or ChaosRates(),
        exec_timeout_s=args.exec_timeout, arms=args.arms, workdir=args.workdir,
    )


def run(args: argparse.Namespace) -> int:
    if args.plot:
        _require_matplotlib()
    config = config_from(args)
    progress = None if args.quiet else ProgressLine(sys.stderr)
    report = asyncio.run(run_bench(config, progress=progress))
    if progress is not None:
        progress.finish()
    print(render_table(report))
    if args.json:
        text = json.dumps(_finite(report), indent=2, allow_nan=False, default=_json_default)
        args.json.write_text(text + "\n")
        print(f"report written to {args.json}")
    if args.plot:
        plot_ttfc(report, args.plot)
        print(f"TTFC plot written to {args.plot}")
    problems = _problems(report, config.chaos)
    for problem in problems:
        print(f"rollbox bench: {problem}", file=sys.stderr)
    return 1 if problems else 0


CHAOS_KINDS = {"kill": "sandbox_lost", "hang": "exec_timeout", "create_fail": "create_failed"}
"""The failure kind each injected fault shows up as."""


def _problems(report: dict[str, Any], chaos: ChaosRates) -> list[str]:
    """What makes a run fail: rollouts unaccounted for, sandboxes left behind, and
    rollouts that failed for a reason the injected faults do not explain (each said with
    one example message, so a run that could not work says why)."""
    explained = {kind for fault, kind in CHAOS_KINDS.items() if getattr(chaos, fault) > 0}
    problems = []
    for arm, data in report["arms"].items():
        rollouts = data["rollouts"]
        if not rollouts["accounted"]:
            problems.append(f"the {arm} arm did not account for every rollout")
        if data["leaked_sandboxes"] or data.get("leftovers"):
            problems.append(f"the {arm} arm left sandboxes behind: "
                            f"{data['leaked_sandboxes']} open, {data.get('leftovers')}")
        for kind, count in sorted(rollouts["failed_by_kind"].items()):
            if kind not in explained:
                example = data.get("failure_examples", {}).get(kind, "")
                problems.append(f"{count} rollout(s) of the {arm} arm failed as {kind}: "
                                f"{example}{BENCH_HINTS.get(kind, '')}")
    return problems


class ProgressLine:
    """One updating line per arm on a terminal; a line every 10% otherwise."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.tty = out.isatty()
        self.last = 0.0
        self.failed: dict[str, int] = {}
        self.started: dict[str, float] = {}
        self.step = -1

    def __call__(self, arm: str, done: int, total: int, result: RolloutResult) -> None:
        now = time.monotonic()
        start = self.started.setdefault(arm, now)
        if not result.ok:
            self.failed[arm] = self.failed.get(arm, 0) + 1
        line = (f"[{arm}] {done}/{total} rollouts, {self.failed.get(arm, 0)} failed, "
                f"{now - start:.1f}s")
        if self.tty:
            if now - self.last > 0.1 or done == total:
                self.last = now
                self.out.write("\r\033[K" + line + ("\n" if done == total else ""))
                self.out.flush()
        else:
            step = done * 10 // max(1, total)
            if step != self.step or done == total:
                self.step = step
                print(line, file=self.out, flush=True)

    def finish(self) -> None:
        self.out.flush()


def render_table(report: dict[str, Any]) -> str:
    arms = report["arms"]
    names = [a for a in ARMS if a in arms]
    w = report["workload"]
    lines = [
        f"workload: {w['images']} images x {w['rollouts_per_task']} rollouts = "
        f"{w['rollouts']} rollouts on {w['backend']!r}, concurrency {w['concurrency']}, "
        f"corpus {w['corpus_bytes'] / MiB:.0f} MiB, store {w['image_capacity_bytes'] / MiB:.0f}"
        f" MiB, think {w.get('think_s', 0.0) * 1e3:.0f} ms between actions",
    ]
    lines.append("TTFC = time to first command: a sandbox asked for → its first command's "
                 "result; lower is better")
    header = f"{'':<22}" + "".join(f"{n:>14}" for n in names)
    both = len(names) == 2
    if both:
        header += f"{f'{names[0]}/{names[1]}':>20}"
    lines.append(header)

    def row(label: str, values: list[float], fmt: str, ratio: float | None = None) -> None:
        text = f"{label:<22}" + "".join(f"{_fmt(v, fmt):>14}" for v in values)
        if both:
            text += f"{'' if ratio is None else f'{ratio:.1f}x':>20}"
        lines.append(text)

    ratios = report.get("ratios", {})
    for key in ("mean", "p50", "p99", "max"):
        row(f"TTFC {key} (ms)", [arms[n]["ttfc_s"][key] * 1e3 for n in names], ".1f",
            ratios.get(f"ttfc_{key}"))
    row("creations", [arms[n]["creations"] for n in names], "d", ratios.get("creations"))
    row("creations/rollout", [arms[n]["creations_per_rollout"] for n in names], ".2f")
    row("resets", [arms[n]["resets"] for n in names], "d")
    row("succeeded", [arms[n]["rollouts"]["succeeded"] for n in names], "d")
    row("failed", [arms[n]["rollouts"]["failed"] for n in names], "d")
    kinds = sorted({k for n in names for k in arms[n]["rollouts"]["failed_by_kind"]})
    for kind in kinds:
        row(f"  {kind}", [arms[n]["rollouts"]["failed_by_kind"].get(kind, 0) for n in names],
            "d")
    retried = sorted({k for n in names for k in arms[n]["rollouts"]["retried_by_kind"]})
    for kind in retried:
        row(f"retried {kind}",
            [arms[n]["rollouts"]["retried_by_kind"].get(kind, 0) for n in names], "d")
    injected = sorted({k for n in names for k in arms[n]["chaos_injected"]})
    for kind in injected:
        row(f"chaos {kind}", [arms[n]["chaos_injected"].get(kind, 0) for n in names], "d")
    row("wall (s)", [arms[n]["wall_s"] for n in names], ".2f", ratios.get("wall"))
    scope = {arms[n]["rss_bytes"].get("peak_scope", "process") for n in names}
    row("peak RSS (MiB)" if scope == {"arm"} else "peak RSS, process (MiB)",
        [arms[n]["rss_bytes"]["peak"] / MiB for n in names], ".0f")
    accounted = all(arms[n]["rollouts"]["accounted"] for n in names)
    lines.append(f"every rollout accounted: {'yes' if accounted else 'NO'}")
    conclusion = _conclusion(arms, names, ratios)
    if conclusion:
        lines.append(conclusion)
    left = {n: arms[n].get("leftovers") for n in names}
    if any(v is not None for v in left.values()):
        text = ", ".join(f"{n} {len(v)}" for n, v in left.items() if v is not None)
        clean = not any(left.values())
        lines.append(f"left behind on the backend: {'nothing' if clean else text}")
    return "\n".join(lines)


def _conclusion(arms: dict[str, Any], names: list[str], ratios: dict[str, float]
                ) -> str:
    """One sentence on what the run shows (both arms ran)."""
    if names != ["baseline", "rollbox"] or not ratios.get("ttfc_mean"):
        return ""
    base, ours = arms["baseline"], arms["rollbox"]
    return (f"rollbox's first commands came {_sooner(ratios['ttfc_mean'])} on average "
            f"(the slowest {_sooner(ratios.get('ttfc_max', math.nan))}), with "
            f"{ours['creations_per_rollout']:.2f} sandbox creations per rollout against the "
            f"baseline's {base['creations_per_rollout']:.2f}.")


def _sooner(ratio: float) -> str:
    """`baseline/rollbox` as words: "2.8x sooner", "2.5x later", "no sooner"."""
    if math.isnan(ratio) or ratio <= 0:
        return "-"
    if ratio >= 1.05:
        return f"{ratio:.1f}x sooner"
    if ratio <= 1 / 1.05:
        return f"{1 / ratio:.1f}x later"
    return "no sooner"


def _fmt(value: float, fmt: str) -> str:
    if isinstance(value, float) and math.isnan(value):
        return "-"
    return format(value, fmt)


def _finite(value: Any) -> Any:
    """NaN (e.g. a TTFC of an arm without samples) becomes null: strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _json_default(value: object) -> object:
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise MissingExtraError("rollbox bench --plot", "plot") from None


def plot_ttfc(report: dict[str, Any], path: Path) -> None:
    """Both arms' TTFC as empirical CDFs on a log time axis."""
    _require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for arm, data in report["arms"].items():
        samples = [s * 1e3 for s in data["ttfc_samples_s"]]
        if not samples:
            continue
        ys = [(i + 1) / len(samples) for i in range(len(samples))]
        ax.step(samples, ys, where="post", label=f"{arm} (max {max(samples):.0f} ms)")
    w = report["workload"]
    ax.set_xscale("log")
    ax.set_xlabel("time to first command, ms (lower is better)")
    ax.set_ylabel("share of rollouts")
    ax.set_title(f"rollbox bench: {w['images']} images x {w['rollouts_per_task']} rollouts "
                 f"on {w['backend']!r}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
