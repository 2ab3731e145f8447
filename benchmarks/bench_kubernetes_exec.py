"""Exec latency against the API server emulator: pod exec vs the in-sandbox HTTP runtime.

One emulator whose pods serve agent-sandbox's runtime API (``http_runtime=True``), backed
by real local sandboxes; one sandbox per transport; N commands one after another on
each, alternating so both see the same machine load. Latency is the client's, from
``exec`` called to result. ``http_unwrapped`` is the same argv sent to the runtime without
the output-capping wrapper (how rollbox sends its own scripts): the transport's own cost.

    uv run python benchmarks/bench_kubernetes_exec.py --commands 200
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from rollbox.spec import SandboxSpec, Timeouts
from rollbox_kubernetes import KubernetesBackend
from rollbox_kubernetes.testing import ApiServerEmulator
from rollbox_local import LocalBackend


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"p50_ms": 1000 * statistics.median(ordered),
            "p90_ms": 1000 * ordered[int(0.9 * (len(ordered) - 1))],
            "mean_ms": 1000 * statistics.fmean(ordered)}


def state_dir() -> Path:
    state = Path(tempfile.mkdtemp(prefix="rollbox-bench-k8s-exec-"))
    state.chmod(0o711)  # the sandbox user must reach it
    return state


async def run(commands: int, command: str, state: Path) -> dict[str, Any]:
    try:
        async with ApiServerEmulator(LocalBackend(state_dir=state), http_runtime=True) as emu:
            spec = SandboxSpec(image="host", workdir="/work", timeouts=Timeouts(create_s=60))
            backends = {name: KubernetesBackend(host=emu.url, run_id=f"bench-{name}",
                                                warm_replicas=0, transport=name,
                                                qps=1000, burst=1000)
                        for name in ("exec", "http")}
            sandboxes = {name: await b.create(spec) for name, b in backends.items()}
            samples: dict[str, list[float]] = {name: [] for name in
                                               (*backends, "http_unwrapped")}
            runtime = sandboxes["http"].runtime  # type: ignore[attr-defined]
            argv = ["timeout", "-s", "KILL", "60", "env", "ROLLBOX_EXEC=x", *shlex.split(command)]
            for sandbox in sandboxes.values():  # warm up connections
                await sandbox.exec(command)
            for _ in range(commands):
                for name, sandbox in sandboxes.items():
                    started = time.perf_counter()
                    result = await sandbox.exec(command)
                    samples[name].append(time.perf_counter() - started)
                    assert result.ok, result
                started = time.perf_counter()
                raw = await runtime.exec(argv, limit=1 << 20, timeout_s=60, raw=True)
                samples["http_unwrapped"].append(time.perf_counter() - started)
                assert raw.exit_code == 0, raw
            out = {name: summary(s) for name, s in samples.items()}
            for name, backend in backends.items():
                out[name]["api_exec_requests"] = backend.stats.by_verb["exec"]
                out[name]["runtime_requests"] = sum(backend.transports.stats.values())
                await backend.aclose()
            return out
    finally:
        shutil.rmtree(state, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commands", type=int, default=200)
    parser.add_argument("--command", default="true")
    args = parser.parse_args()
    result = asyncio.run(run(args.commands, args.command, state_dir()))
    print(json.dumps({"commands": args.commands, "command": args.command, **result},
                     indent=2))


if __name__ == "__main__":
    main()
