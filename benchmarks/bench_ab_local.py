"""The local backend now against an older checkout of it, side by side in one run.

Runs ``benchmarks/bench_local.py`` (warm TTFC, cold create, exec, reset) and ``rollbox
bench`` (both arms, the rollbox/baseline ratios) alternately from this checkout and from
``--before`` (another checkout of rollbox with its own ``.venv``, e.g. a ``git worktree``
of the commit before a change), ``--rounds`` times each, and prints each measure's median
over the rounds with the ratio after/before. Interleaving the rounds spreads whatever
else the machine does over both sides.

    git worktree add /tmp/before <commit> && (cd /tmp/before && uv sync --all-packages)
    uv run python benchmarks/bench_ab_local.py --before /tmp/before [--rounds 3] [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]
LOCAL_PHASES = ("ttfc", "cold_create", "exec", "reset")
BENCH_ARGS = ("--images", "16", "--rollouts", "4", "--concurrency", "8", "--think-ms", "100",
              "--padding-mb", "1", "--quiet")

Measure = tuple[str, Callable[[dict[str, Any]], float]]
LOCAL_MEASURES: list[Measure] = [
    ("warm TTFC p50, held (ms)", lambda r: r["ttfc"]["in_use"]["ttfc_ms"]["p50"]),
    ("warm TTFC p50, back to back (ms)", lambda r: r["ttfc"]["back_to_back"]["ttfc_ms"]["p50"]),
    ("cold create → first result p50 (ms)", lambda r: r["cold_create"]["first_result_ms"]["p50"]),
    ("exec `true` p50 (ms)", lambda r: r["exec"]["exec_ms"]["p50"]),
    ("exec `true` p99 (ms)", lambda r: r["exec"]["exec_ms"]["p99"]),
    ("reset after 1,000 files, after use, p50 (ms)",
     lambda r: r["reset"]["after_use"]["reset_ms"]["p50"]),
    ("reset after 1,000 files, immediately, p50 (ms)",
     lambda r: r["reset"]["immediate"]["reset_ms"]["p50"]),
]
BENCH_MEASURES: list[Measure] = [
    ("rollbox bench: TTFC mean ratio (baseline/rollbox)", lambda r: r["ratios"]["ttfc_mean"]),
    ("rollbox bench: TTFC p99 ratio", lambda r: r["ratios"]["ttfc_p99"]),
    ("rollbox bench: creations ratio", lambda r: r["ratios"]["creations"]),
    ("rollbox bench: wall ratio", lambda r: r["ratios"]["wall"]),
]


def run_json(checkout: Path, argv: list[str], out: Path) -> dict[str, Any]:
    """Run ``argv`` with ``checkout``'s Python and read the JSON it wrote to ``out``."""
    env = {**os.environ, "ROLLBOX_HOME": str(out.parent / "home")}
    python = checkout / ".venv" / "bin" / "python"
    subprocess.run([str(python), *argv], cwd=checkout, env=env, check=True,
                   stdout=subprocess.DEVNULL)
    data: dict[str, Any] = json.loads(out.read_text())
    return data


def one_round(checkout: Path, work: Path, quick: bool) -> dict[str, dict[str, Any]]:
    work.mkdir(parents=True, exist_ok=True)
    local = work / "local.json"
    only = [arg for phase in LOCAL_PHASES for arg in ("--only", phase)]
    bench = work / "bench.json"
    sizes = ["--images", "4", "--think-ms", "0"] if quick else []
    return {
        "local": run_json(checkout, ["benchmarks/bench_local.py", *only, "--json", str(local),
                                     *(["--quick"] if quick else [])], local),
        "bench": run_json(checkout, ["-m", "rollbox", "bench", *BENCH_ARGS, *sizes,
                                     "--workdir", str(work / "bench"), "--json", str(bench)],
                          bench),
    }


def medians(rounds: list[dict[str, dict[str, Any]]]) -> dict[str, float]:
    out = {}
    for kind, measures in (("local", LOCAL_MEASURES), ("bench", BENCH_MEASURES)):
        for label, pick in measures:
            out[label] = statistics.median(pick(r[kind]) for r in rounds)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True,
                        help="the older checkout (with its own .venv)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per side (default 3)")
    parser.add_argument("--json", type=Path, help="also write every round's results here")
    parser.add_argument("--quick", action="store_true", help="a small smoke run")
    args = parser.parse_args()
    sides = {"before": args.before.resolve(), "after": HERE}
    results: dict[str, list[dict[str, dict[str, Any]]]] = {"before": [], "after": []}
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="rbx-ab-") as tmp:
        os.chmod(tmp, 0o755)  # the sandbox user reaches the state directories under it
        for i in range(args.rounds):
            for side, checkout in sides.items():
                print(f"round {i + 1}/{args.rounds}: {side}", file=sys.stderr, flush=True)
                results[side].append(one_round(checkout, Path(tmp) / f"{side}-{i}",
                                                  args.quick))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    before, after = medians(results["before"]), medians(results["after"])
    width = max(len(label) for label in before)
    print(f"{os.cpu_count()} cores, load {load_start:.1f} → {os.getloadavg()[0]:.1f}, "
          f"medians of {args.rounds} interleaved rounds")
    print(f"{'measure':<{width}}  {'before':>9}  {'after':>9}  after/before")
    for label in before:
        b, a = before[label], after[label]
        print(f"{label:<{width}}  {b:>9.3f}  {a:>9.3f}  {a / b:>6.2f}")


if __name__ == "__main__":
    main()
