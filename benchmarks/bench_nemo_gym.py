"""NeMo Gym's AsyncSandbox on the rollbox provider vs NeMo Gym's built-in ``local`` provider.

``local`` runs commands as host subprocesses in a directory of their own: no isolation
at all, the cheapest a provider can be. rollbox's sandboxes are bubblewrap namespaces
over copy-on-write layers, handed out from a warm pool. Measured, side by side:

* start → first result: ``AsyncSandbox(config, spec).start()`` through the result of the
  first ``exec("true")``, a provider built from its YAML mapping per sandbox (as NeMo
  Gym's servers do), the pool warm; each sandbox held 100 ms (``--hold-ms``) and stopped
  before the next; p50 / p90.
* exec round trip of ``true`` in a started sandbox; p50 / p90.
* a burst of 256 concurrent sessions over 32 images (start, first command, a second
  command, stop), twice in a row: TTFC (start requested → first result) mean / max, and
  sandbox creations per session. rollbox's images are 32 small task images over the host
  (hydrated before the burst); ``local`` ignores images.
* with ``--serve``: start → first result and exec round trip once more on the rollbox
  provider with ``backend: remote``, through a ``rollbox serve`` (local backend) in a
  process of its own, as NeMo Gym servers that share sandboxes between processes run.

Runs in an environment with nemo-gym (Python 3.13, see docs/nemo-gym.md)::

    uv venv -p 3.13 /tmp/ng && uv pip install -p /tmp/ng --python-version 3.13.14 \\
        nemo-gym==0.7.0 -e core -e plugins/local -e plugins/remote -e serve -e adapters/nemo-gym
    /tmp/ng/bin/python benchmarks/bench_nemo_gym.py [--rounds 200] [--serve] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import rollbox_nemo_gym
from nemo_gym.sandbox import AsyncSandbox, SandboxSpec
from rollbox.envs.pools import registry
from rollbox_local import LocalBackend
from rollbox_local.oci_build import write_oci_layout

# The local provider warns on every create that it ignores images: that is the point.
logging.getLogger("nemo_gym.sandbox.providers.local.provider").setLevel(logging.ERROR)


def quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


async def start_to_first_result(provider: dict[str, Any], spec: SandboxSpec, rounds: int,
                                hold_s: float) -> dict[str, list[float]]:
    """Seconds from ``AsyncSandbox(...)`` to the first result; of that, ``start()``. Each
    sandbox is held ``hold_s`` after its first result (a session does not end the moment
    it starts), then stopped."""
    times: dict[str, list[float]] = {"total": [], "start": []}
    for index in range(rounds + 3):  # 3 rounds of warm-up
        began = time.perf_counter()
        sandbox = AsyncSandbox(provider, spec)
        await sandbox.start()
        started = time.perf_counter()
        result = await sandbox.exec("true")
        done = time.perf_counter()
        assert result.return_code == 0, result
        await asyncio.sleep(hold_s)
        await sandbox.stop()
        if index >= 3:
            times["total"].append(done - began)
            times["start"].append(started - began)
    return times


async def exec_round_trips(provider: dict[str, Any], spec: SandboxSpec,
                           rounds: int) -> list[float]:
    async with AsyncSandbox(provider, spec) as sandbox:
        await sandbox.start()
        for _ in range(3):
            await sandbox.exec("true")
        times = []
        for _ in range(rounds):
            started = time.perf_counter()
            result = await sandbox.exec("true")
            times.append(time.perf_counter() - started)
            assert result.return_code == 0, result
    return times


async def burst(provider: dict[str, Any], specs: Sequence[SandboxSpec],
                sessions: int) -> list[float]:
    async def session(index: int) -> float:
        started = time.perf_counter()
        sandbox = AsyncSandbox(provider, specs[index % len(specs)])
        await sandbox.start()
        first = await sandbox.exec("true")
        ttfc = time.perf_counter() - started
        second = await sandbox.exec("ls >/dev/null")
        await sandbox.stop()
        assert first.return_code == 0 and second.return_code == 0, (first, second)
        return ttfc

    return list(await asyncio.gather(*(session(i) for i in range(sessions))))


def rollbox_creations() -> int:
    thread, pools = registry()

    async def count() -> int:
        return sum(s.pool.metrics.counters.get("creations", 0) for s in pools.open())

    return asyncio.run_coroutine_threadsafe(count(), thread.loop).result(60)


async def task_images(root: Path, count: int) -> list[str]:
    """``count`` small task images over the host, hydrated in the image store."""
    refs = []
    for index in range(count):
        files = {f"repo/task_{index}.py": f"ANSWER = {index}\n".encode(),
                 "repo/README": b"a task\n"}
        refs.append(str(write_oci_layout(root / f"task-{index}", files, base_host=True)))
    async with LocalBackend() as backend:
        for ref in refs:
            await backend.prefetch(ref)
    return refs


async def through_serve(rounds: int, hold_s: float, work: Path) -> dict[str, Any]:
    """Start → first result and exec on ``backend: remote``, through a ``rollbox serve``
    of its own (its warm pool: a released sandbox reset and kept for the next)."""
    state = work / "serve"
    log = work / "serve.log"
    with log.open("wb") as out:
        server = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "rollbox", "serve", "--state-dir", str(state),
            stdout=out, stderr=asyncio.subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while b"use it:" not in log.read_bytes():
            if server.returncode is not None or time.monotonic() > deadline:
                raise RuntimeError(f"rollbox serve did not start:\n{log.read_text()}")
            await asyncio.sleep(0.05)
        provider = {"rollbox": {"backend": "remote", "keep_warm_s": 600, "backend_options": {
            "url": f"unix:{state / 'serve.sock'}", "token_file": str(state / "token")}}}
        spec = SandboxSpec(workdir="/tmp")
        times = await start_to_first_result(provider, spec, rounds, hold_s)
        trips = await exec_round_trips(provider, spec, rounds)
        rollbox_nemo_gym.shutdown()
    finally:
        server.send_signal(signal.SIGTERM)
        await asyncio.wait_for(server.wait(), 60)
    return {"start_to_first_result": summary(times["total"]),
            "start_only": summary(times["start"]), "exec_round_trip": summary(trips)}


def summary(times: Sequence[float]) -> dict[str, float]:
    return {"p50_ms": ms(statistics.median(times)), "p90_ms": ms(quantile(times, 0.9)),
            "mean_ms": ms(statistics.fmean(times)), "max_ms": ms(max(times)), "n": len(times)}


async def run(rounds: int, sessions: int, images: int, hold_s: float,
              work: Path, serve: bool) -> dict[str, Any]:
    workspace = work / "local-provider"
    # local: its shipped config, concurrency raised to the burst so it is not its limit.
    local = {"local": {"workspace_root": str(workspace), "shell": "/bin/bash",
                       "concurrency": sessions}}
    rollbox = {"rollbox": {"keep_warm_s": 600,
                           "pool_options": {"policy": "static",
                                            "policy_options": {"size": sessions // images}}}}
    spec = SandboxSpec(workdir="/tmp")
    local_spec = SandboxSpec()
    result: dict[str, Any] = {}

    local_times = await start_to_first_result(local, local_spec, rounds, hold_s)
    rollbox_times = await start_to_first_result(rollbox, spec, rounds, hold_s)
    result["start_to_first_result"] = {
        "local": summary(local_times["total"]), "rollbox": summary(rollbox_times["total"]),
    }
    result["start_only"] = {
        "local": summary(local_times["start"]), "rollbox": summary(rollbox_times["start"]),
    }
    result["exec_round_trip"] = {
        "local": summary(await exec_round_trips(local, local_spec, rounds)),
        "rollbox": summary(await exec_round_trips(rollbox, spec, rounds)),
    }
    rollbox_nemo_gym.shutdown()  # the burst starts from an empty pool
    if serve:
        result["through_serve"] = await through_serve(rounds, hold_s, work)

    refs = await task_images(work / "images", images)
    rollbox_specs = [SandboxSpec(image=ref, workdir="/repo") for ref in refs]
    local_specs = [SandboxSpec() for _ in refs]
    bursts: dict[str, Any] = {"local": [], "rollbox": []}
    for _ in range(2):
        times = await burst(local, local_specs, sessions)
        bursts["local"].append({**summary(times), "creations_per_session": 1.0})
        before = rollbox_creations()
        times = await burst(rollbox, rollbox_specs, sessions)
        made = rollbox_creations() - before
        bursts["rollbox"].append({**summary(times),
                                  "creations_per_session": round(made / sessions, 3)})
    result["burst"] = bursts
    rollbox_nemo_gym.shutdown()
    return result


def report(result: dict[str, Any]) -> str:
    lines = []
    for name in ("start_to_first_result", "start_only", "exec_round_trip"):
        local, rollbox = result[name]["local"], result[name]["rollbox"]
        lines.append(f"{name:22} local p50 {local['p50_ms']:8.3f} ms p90 {local['p90_ms']:8.3f}"
                     f" | rollbox p50 {rollbox['p50_ms']:8.3f} ms p90 {rollbox['p90_ms']:8.3f}"
                     f" | rollbox/local p50 {rollbox['p50_ms'] / local['p50_ms']:.2f}")
    for name, served in result.get("through_serve", {}).items():
        local = result[name]["local"]
        lines.append(f"{name:22} rollbox through rollbox serve p50 {served['p50_ms']:8.3f} ms "
                     f"p90 {served['p90_ms']:8.3f} | /local p50 "
                     f"{served['p50_ms'] / local['p50_ms']:.2f}")
    for index in range(2):
        local, rollbox = result["burst"]["local"][index], result["burst"]["rollbox"][index]
        lines.append(
            f"burst {index + 1} TTFC mean/max   local {local['mean_ms']:8.1f} / "
            f"{local['max_ms']:8.1f} ms | rollbox {rollbox['mean_ms']:8.1f} / "
            f"{rollbox['max_ms']:8.1f} ms | creations/session local "
            f"{local['creations_per_session']:.2f} rollbox {rollbox['creations_per_session']:.2f}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--sessions", type=int, default=256)
    parser.add_argument("--images", type=int, default=32)
    parser.add_argument("--hold-ms", type=float, default=100.0,
                        help="how long a start-to-first-result session holds its sandbox")
    parser.add_argument("--serve", action="store_true",
                        help="also measure the provider through a rollbox serve (remote)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-nemo-gym-"))
    work.chmod(0o711)
    os.environ.setdefault("ROLLBOX_HOME", str(work / "rollbox-home"))
    try:
        result = asyncio.run(run(args.rounds, args.sessions, args.images,
                                 args.hold_ms / 1000, work, args.serve))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version(),
                         "platform": platform.platform(), "load": os.getloadavg()}
    print(report(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    sys.exit(0)


if __name__ == "__main__":
    main()
