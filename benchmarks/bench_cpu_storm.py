"""Is the host still in charge while sandboxes burn every CPU? (issue 11)

Measures on the local backend, first on a quiet set of sandboxes and then with
``--busy`` of them (default 100) each running a busy loop: how late an exec timeout
fires past its deadline (``sleep 30`` under ``timeout=1``), the round trip of ``true`` in
another sandbox, and how late the backend's own event loop wakes from a 10 ms sleep.
Sandboxes run at a lower CPU weight than the backend (where cgroups can be written, all
sandboxes together weigh what one process does: ``rollbox_local.cgroups``; commands run
at nice 5), which is what keeps these numbers bounded.

    uv run python benchmarks/bench_cpu_storm.py [--busy 100] [--rounds 10] [--json F]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from rollbox import SandboxSpec
from rollbox.errors import ExecTimeoutError
from rollbox.sandbox import Sandbox
from rollbox_local import LocalBackend

SPEC = SandboxSpec(image="host")
BUSY_LOOP = ["sh", "-c", "(while :; do :; done) > /dev/null 2>&1 &"]


async def timeout_overshoot_ms(sandbox: Sandbox, rounds: int) -> list[float]:
    """How long past a 1 s deadline ``exec`` takes to raise ExecTimeoutError."""
    late = []
    for _ in range(rounds):
        started = time.perf_counter()
        try:
            await sandbox.exec(["sleep", "30"], timeout=1.0)
        except ExecTimeoutError:
            late.append((time.perf_counter() - started - 1.0) * 1e3)
        else:
            raise SystemExit("sleep 30 finished under a 1 s timeout")
    return late


async def exec_ms(sandbox: Sandbox, rounds: int) -> list[float]:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        await sandbox.exec(["true"])
        times.append((time.perf_counter() - started) * 1e3)
    return times


async def loop_lag_ms(seconds: float) -> list[float]:
    """How late a 10 ms ``asyncio.sleep`` wakes, sampled for ``seconds``."""
    lags = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        started = time.perf_counter()
        await asyncio.sleep(0.01)
        lags.append((time.perf_counter() - started - 0.01) * 1e3)
    return lags


def summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"n": len(ordered), "p50": statistics.median(ordered),
            "p90": ordered[int(0.9 * (len(ordered) - 1))], "max": ordered[-1]}


async def measure(probe: Sandbox, rounds: int) -> dict[str, dict[str, float]]:
    lag = asyncio.create_task(loop_lag_ms(rounds * 1.2))
    overshoot = await timeout_overshoot_ms(probe, rounds)
    round_trip = await exec_ms(probe, rounds * 5)
    return {"timeout_overshoot_ms": summary(overshoot), "exec_true_ms": summary(round_trip),
            "loop_lag_ms": summary(await lag)}


async def run(busy: int, rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="rbx-storm-") as tmp:
        os.chmod(tmp, 0o755)  # the sandbox user reaches the state directory
        async with LocalBackend(state_dir=Path(tmp)) as backend:
            cgroups = backend.cgroups is not None
            probe = await backend.create(SPEC)
            quiet = await measure(probe, rounds)
            burners = await asyncio.gather(*(backend.create(SPEC) for _ in range(busy)))
            await asyncio.gather(*(b.exec(BUSY_LOOP) for b in burners))
            await asyncio.sleep(2.0)  # let the loops take the CPUs
            load = os.getloadavg()[0]
            storm = await measure(probe, rounds)
            await asyncio.gather(*(b.close() for b in burners), probe.close())
            left = await backend.leftovers()
    return {"busy": busy, "cgroups": cgroups, "load_during_storm": load, "quiet": quiet,
            "storm": storm, "leftovers": left}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy", type=int, default=100, help="sandboxes burning CPU")
    parser.add_argument("--rounds", type=int, default=10, help="timeouts measured per phase")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    result = asyncio.run(run(args.busy, args.rounds))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{os.cpu_count()} cores, load {load:.1f} at the start, "
          f"{result['load_during_storm']:.1f} in the storm; cgroups: {result['cgroups']}; "
          f"left behind: {len(result['leftovers'])}")
    print(f"{'measure':<28} {'quiet p50/p90/max':>24} {f'{args.busy} busy p50/p90/max':>26}")
    for key in ("timeout_overshoot_ms", "exec_true_ms", "loop_lag_ms"):
        q, s = result["quiet"][key], result["storm"][key]
        print(f"{key:<28} {q['p50']:>8.1f}{q['p90']:>8.1f}{q['max']:>8.1f} "
              f"{s['p50']:>10.1f}{s['p90']:>8.1f}{s['max']:>8.1f}")


if __name__ == "__main__":
    main()
