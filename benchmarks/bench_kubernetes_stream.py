"""Streaming exec and signals over pod exec, against the emulator (pods backed by
local sandboxes): how soon the first chunk arrives, how long a signal takes, and how
fast output streams, next to a plain ``exec``.

    uv run python benchmarks/bench_kubernetes_stream.py --rounds 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import signal
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from rollbox import Sandbox
from rollbox.spec import SandboxSpec
from rollbox_kubernetes import KubernetesBackend
from rollbox_kubernetes.testing import ApiServerEmulator
from rollbox_local import LocalBackend

MiB = 1024 * 1024


def summary(samples: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in samples)
    return {"p50_ms": round(statistics.median(ms), 1), "max_ms": round(ms[-1], 1)}


async def measure(sandbox: Sandbox, rounds: int, mib: int) -> dict[str, Any]:
    exec_rt, first_chunk, signal_call, signal_end = [], [], [], []
    for _ in range(rounds):
        t = time.perf_counter()
        await sandbox.exec(["true"])
        exec_rt.append(time.perf_counter() - t)

        t = time.perf_counter()
        process = await sandbox.stream("echo ready; sleep 60", timeout=120)
        stream = aiter(process)
        await anext(stream)
        first_chunk.append(time.perf_counter() - t)

        t = time.perf_counter()
        await process.send_signal(signal.SIGTERM)
        signal_call.append(time.perf_counter() - t)
        await process.wait()
        signal_end.append(time.perf_counter() - t)

    command = f"head -c {mib * MiB} /dev/zero"
    t = time.perf_counter()
    result = await sandbox.exec(command, output_limit=2 * mib * MiB)
    exec_s = time.perf_counter() - t
    assert len(result.stdout) == mib * MiB
    t = time.perf_counter()
    process = await sandbox.stream(command, output_limit=2 * mib * MiB)
    total = sum([len(chunk.data) async for chunk in process])
    await process.wait()
    stream_s = time.perf_counter() - t
    assert total == mib * MiB
    return {
        "rounds": rounds,
        "exec_true": summary(exec_rt),
        "stream_first_chunk": summary(first_chunk),
        "send_signal_returns": summary(signal_call),
        "signal_to_exit": summary(signal_end),
        f"exec_{mib}MiB_MiB_per_s": round(mib / exec_s, 1),
        f"stream_{mib}MiB_MiB_per_s": round(mib / stream_s, 1),
    }


def state_dir() -> Path:
    """A directory the sandbox user can reach (0711), as tests/kubernetes/conftest.py."""
    state = Path(tempfile.mkdtemp(prefix="rollbox-bench-stream-"))
    state.chmod(0o711)
    return state


async def main(rounds: int, mib: int) -> dict[str, Any]:
    state = state_dir()
    try:
        async with ApiServerEmulator(LocalBackend(state_dir=state)) as emu:
            backend = KubernetesBackend(host=emu.url, run_id="bench-stream", warm_replicas=1,
                                        qps=500, burst=500)
            async with backend:
                sandbox = await backend.create(SandboxSpec(image="host", workdir="/work"))
                async with sandbox:
                    return await measure(sandbox, rounds, mib)
    finally:
        shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--mib", type=int, default=64)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main(args.rounds, args.mib)), indent=2))
