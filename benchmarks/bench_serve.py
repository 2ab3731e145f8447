"""Issue 15's performance targets: the local backend behind ``rollbox serve`` (unix socket)
against the same backend in-process, side by side in one run.

1. exec round trip of ``true`` on a live sandbox: in-process vs through the server;
2. warm TTFC from a second process: create (a warm sandbox of the server's pool) ->
   first ``true`` result -> close (reset back into the pool), in a client process that
   is not the one that warmed the pool; in-process ``Pool`` TTFC alongside;
3. 100 MiB ``write_file``/``read_file`` and ``upload``/``download`` through the server;
4. an HTTP GET through ``sandbox.endpoint(port)`` to a server inside a ``network="none"``
   sandbox, against the same GET to the same server program on the host's loopback;
5. 16 client processes sharing one server pool vs 16 processes each with its own
   in-process pool (and image store), on a ``rollbox bench``-style workload: the
   synthetic SWE tasks, lookahead pools, every process running every task in its own
   rotated order. Creations (all processes) and TTFC (every rollout) compared.

    uv run python benchmarks/bench_serve.py [--only exec,ttfc,files,ports,share]
        [--workers 16] [--json out.json]

The server is a real ``rollbox serve`` child process with its own ROLLBOX_HOME.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

from rollbox import Pool, SandboxSpec, StaticPoolPolicy
from rollbox.metrics import summarize
from rollbox_local import LocalBackend
from rollbox_remote import RemoteBackend

MiB = 1024 * 1024
SPEC = SandboxSpec(image="host")
PHASES = ("exec", "ttfc", "files", "ports", "share")


def ms(values: list[float]) -> dict[str, float]:
    s = summarize(values)
    return {"count": s.count, "p50_ms": s.p50 * 1e3, "p90_ms": s.p90 * 1e3,
            "mean_ms": s.mean * 1e3, "p99_ms": s.p99 * 1e3}


def state_dir(prefix: str) -> Path:
    path = Path(tempfile.mkdtemp(prefix=prefix))
    path.chmod(0o711)  # the sandbox user must reach it when running as root
    return path


# -- the server -----------------------------------------------------------------------------


class ServeChild:
    """``rollbox serve`` in a child process with a home of its own."""

    def __init__(self, *args: str) -> None:
        self.root = state_dir("rollbox-bench-serve-")
        self.home = self.root / "home"
        self.home.mkdir(mode=0o711)
        self.env = {**os.environ, "ROLLBOX_HOME": str(self.home)}
        self.env.pop("ROLLBOX_BACKEND", None)
        self.log = self.root / "serve.log"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "rollbox", "serve", "--log-level", "WARNING", *args],
                env=self.env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while b"use it:" not in self.log.read_bytes():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"rollbox serve did not start:\n{self.log.read_text()}")
            time.sleep(0.05)
        self.url = f"unix:{self.home / 'serve' / 'serve.sock'}"
        self.token = (self.home / "serve" / "token").read_text().strip()

    def client_env(self) -> dict[str, str]:
        return {**self.env, "ROLLBOX_BACKEND": "remote", "ROLLBOX_URL": self.url,
                "ROLLBOX_TOKEN": self.token}

    def backend(self) -> RemoteBackend:
        return RemoteBackend(self.url, self.token)

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(120)
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.asynccontextmanager
async def local_backend() -> AsyncIterator[LocalBackend]:
    state = state_dir("rollbox-bench-local-")
    backend = LocalBackend(state_dir=state)
    try:
        yield backend
    finally:
        await backend.aclose()
        shutil.rmtree(state, ignore_errors=True)


# -- 1. exec round trip ---------------------------------------------------------------------


def cpu_s(pid: int) -> float:
    """CPU time (user + system) a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def bench_exec(serve: ServeChild, n: int) -> dict[str, Any]:
    """Round trips, and the CPU each side spends per request: on a busy machine the
    wall times wait for the CPU, the CPU times say what a quiet machine would add."""
    remote = await asyncio.to_thread(serve.backend)
    times: dict[str, list[float]] = {"in_process": [], "served": []}
    cpu = {"in_process": 0.0, "served": 0.0, "server": 0.0}
    async with local_backend() as local:
        sandboxes = {"in_process": await local.create(SPEC), "served": await remote.create(SPEC)}
        for sandbox in sandboxes.values():
            for _ in range(20):
                await sandbox.exec(["true"])
        for _ in range(10):  # interleaved blocks: both sides see the same machine load
            for name, sandbox in sandboxes.items():
                process_cpu, server_cpu = time.process_time(), cpu_s(serve.process.pid)
                for _ in range(n // 10):
                    started = time.perf_counter()
                    await sandbox.exec(["true"])
                    times[name].append(time.perf_counter() - started)
                cpu[name] += time.process_time() - process_cpu
                if name == "served":
                    cpu["server"] += cpu_s(serve.process.pid) - server_cpu
        for sandbox in sandboxes.values():
            await sandbox.close()
    await remote.aclose()
    out: dict[str, Any] = {name: ms(values) for name, values in times.items()}
    out["added_p50_ms"] = out["served"]["p50_ms"] - out["in_process"]["p50_ms"]
    count = 10 * (n // 10)
    out["cpu_ms_per_exec"] = {"in_process": cpu["in_process"] / count * 1e3,
                              "served_client": cpu["served"] / count * 1e3,
                              "server": cpu["server"] / count * 1e3}
    return out


# -- 2. warm TTFC from a second process -------------------------------------------------------

SECOND_PROCESS = """
import asyncio, json, sys, time
from rollbox import SandboxSpec
from rollbox_remote import RemoteBackend

async def main(n, hold):
    backend = RemoteBackend()
    spec = SandboxSpec(image="host")
    times = {"ttfc": [], "create": [], "first_exec": [], "bare_idle": [], "bare_b2b": []}
    for _ in range(n):
        started = time.perf_counter()
        sandbox = await backend.create(spec)
        created = time.perf_counter()
        result = await sandbox.exec(["true"])
        done = time.perf_counter()
        times["ttfc"].append(done - started)
        times["create"].append(created - started)
        times["first_exec"].append(done - created)
        assert result.ok
        await asyncio.sleep(hold)   # the rollout goes on (the model's turn)
        await sandbox.close()
    for _ in range(n):  # the floor: a request that does no work, after the same idle
        await asyncio.sleep(hold)
        for key in ("bare_idle", "bare_b2b"):
            started = time.perf_counter()
            await backend.call("GET", "/health")
            times[key].append(time.perf_counter() - started)
    await backend.aclose()
    print(json.dumps(times))

asyncio.run(main(int(sys.argv[1]), float(sys.argv[2])))
"""


async def bench_ttfc(serve: ServeChild, n: int, hold_s: float = 0.1) -> dict[str, Any]:
    """Acquire -> first ``true`` result, then the lease is held ``hold_s`` (a stand-in
    for the rest of a rollout, as benchmarks/bench_local.py does) and given back, reset
    in place, for the next acquire."""
    warmer = await asyncio.to_thread(serve.backend)
    first = await warmer.create(SPEC)  # this process fills the pool: one sandbox, made
    await first.exec(["true"])
    await first.close()  # ... and given back, reset: warm for anyone
    await warmer.aclose()
    done = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-c", SECOND_PROCESS, str(n), str(hold_s)],
        env=serve.client_env(), capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(done.stderr)
    served = {key: ms(values) for key, values in json.loads(done.stdout).items()}
    in_process = []
    async with local_backend() as local, Pool(local, policy=StaticPoolPolicy(size=1)) as pool:
        await pool.prewarm(SPEC, 1)
        for _ in range(n):
            started = time.perf_counter()
            async with pool.lease(SPEC) as sandbox:
                await sandbox.exec(["true"])
                in_process.append(time.perf_counter() - started)
                await asyncio.sleep(hold_s)
    return {"served_second_process": served.pop("ttfc"), "in_process_pool": ms(in_process),
            "served_split": served}


# -- 3. files -------------------------------------------------------------------------------


async def bench_files(serve: ServeChild, size_mib: int, rounds: int) -> dict[str, Any]:
    data = os.urandom(MiB) * size_mib
    scratch = state_dir("rollbox-bench-files-")
    source = scratch / "up.bin"
    source.write_bytes(data)
    remote = await asyncio.to_thread(serve.backend)
    rates: dict[str, list[float]] = {"write_file": [], "read_file": [], "upload": [],
                                     "download": []}
    try:
        async with await remote.create(SPEC) as sandbox:
            for _ in range(rounds):
                for name in rates:
                    started = time.perf_counter()
                    if name == "write_file":
                        await sandbox.write_file("/tmp/big.bin", data)
                    elif name == "read_file":
                        assert len(await sandbox.read_file("/tmp/big.bin")) == len(data)
                    elif name == "upload":
                        await sandbox.upload(source, "/tmp/up.bin")
                    else:
                        await sandbox.download("/tmp/up.bin", scratch / "down.bin")
                    rates[name].append(size_mib / (time.perf_counter() - started))
    finally:
        await remote.aclose()
        shutil.rmtree(scratch, ignore_errors=True)
    return {name: {"median_mib_s": statistics.median(v), "runs": v} for name, v in rates.items()}


# -- 4. ports --------------------------------------------------------------------------------

HTTP_SERVER = """
import http.server, sys
class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    def do_GET(self):  # one write: no Nagle / delayed-ACK stall between head and body
        self.wfile.write(b"HTTP/1.1 200 OK\\r\\nContent-Length: 4\\r\\n\\r\\npong")
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


def http_gets(host: str, port: int, n: int) -> list[float]:
    """``n`` GETs over one keep-alive connection (as an HTTP client library does)."""
    connection = http.client.HTTPConnection(host, port, timeout=30)
    connection.connect()
    connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    times = []
    for _ in range(n):
        started = time.perf_counter()
        connection.request("GET", "/ping")
        response = connection.getresponse()
        assert response.read() == b"pong"
        times.append(time.perf_counter() - started)
    connection.close()
    return times


@contextlib.contextmanager
def host_http_server(port: int) -> Iterator[None]:
    process = subprocess.Popen([sys.executable, "-c", HTTP_SERVER, str(port)])
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError):
                http_gets("127.0.0.1", port, 1)
                break
            if time.monotonic() > deadline:
                raise RuntimeError("the host HTTP server did not start")
            time.sleep(0.05)
        yield
    finally:
        process.kill()
        process.wait()


async def sandbox_http_server(sandbox: Any, port: int) -> None:
    await sandbox.write_file("/tmp/server.py", HTTP_SERVER.encode())
    await sandbox.exec(f"nohup python3 /tmp/server.py {port} >/dev/null 2>&1 &", timeout=10)
    for _ in range(200):
        probe = await sandbox.exec(["python3", "-c", f"import socket; socket.create_connection("
                                    f"('127.0.0.1', {port}))"], timeout=10)
        if probe.ok:
            return
        await asyncio.sleep(0.05)
    raise RuntimeError("the sandbox's HTTP server did not start")


async def bench_ports(serve: ServeChild, n: int) -> dict[str, Any]:
    port = 18080
    out: dict[str, Any] = {}
    with host_http_server(port + 1):
        await asyncio.to_thread(http_gets, "127.0.0.1", port + 1, 20)
        out["host_loopback"] = ms(await asyncio.to_thread(http_gets, "127.0.0.1", port + 1, n))
    async with local_backend() as local:
        if local.capabilities.ports:
            async with await local.create(SPEC) as sandbox:
                await sandbox_http_server(sandbox, port)
                endpoint = await sandbox.endpoint(port)
                await asyncio.to_thread(http_gets, endpoint.host, endpoint.port, 20)
                out["local_endpoint"] = ms(await asyncio.to_thread(
                    http_gets, endpoint.host, endpoint.port, n))
    remote = await asyncio.to_thread(serve.backend)
    try:
        if remote.capabilities.ports:
            async with await remote.create(SPEC) as sandbox:
                await sandbox_http_server(sandbox, port)
                endpoint = await sandbox.endpoint(port)
                await asyncio.to_thread(http_gets, endpoint.host, endpoint.port, 20)
                out["served_endpoint"] = ms(await asyncio.to_thread(
                    http_gets, endpoint.host, endpoint.port, n))
    finally:
        await remote.aclose()
    for name in ("local_endpoint", "served_endpoint"):
        if name in out:
            out[f"{name}_added_p50_ms"] = out[name]["p50_ms"] - out["host_loopback"]["p50_ms"]
    return out


# -- 5. many processes, one pool ------------------------------------------------------------


def _synthetic() -> Any:
    from rollbox_bench.synthetic import SyntheticSource

    return SyntheticSource


async def worker(args: argparse.Namespace) -> None:
    """One client process of phase 5: every task, rotated by ``--offset``."""
    from rollbox.policies import LookaheadPolicy
    from rollbox.runner import run_rollouts

    source = _synthetic()(args.images, seed=0, padding_bytes=int(args.padding_mb * MiB),
                          kind="local", root=args.corpus, think_s=args.think_ms / 1e3)
    tasks = list(source.tasks())
    tasks = tasks[args.offset % len(tasks):] + tasks[: args.offset % len(tasks)]
    if args.backend == "remote":
        backend: Any = RemoteBackend()
        state = None
    else:
        state = state_dir("rollbox-bench-worker-")
        backend = LocalBackend(state_dir=state)
    budget = args.concurrency
    async with backend:
        pool = Pool(backend, policy=LookaheadPolicy(budget=budget),
                    max_sandboxes=args.concurrency + budget, create_rate=50.0)
        try:
            report = await run_rollouts(pool, tasks, args.rollouts, concurrency=args.concurrency,
                                        lookahead=2 * args.concurrency + budget)
        finally:
            await pool.close()
    if state is not None:
        shutil.rmtree(state, ignore_errors=True)
    print(json.dumps({
        "ttfc": pool.metrics.samples.get("ttfc", []),
        "creations": pool.metrics.counters["creations"],
        "succeeded": sum(1 for r in report.results if r.ok),
        "requested": len(report.results),
    }))


def run_workers(count: int, env: dict[str, str], args: argparse.Namespace,
                backend: str) -> list[dict[str, Any]]:
    command = [sys.executable, __file__, "worker", "--backend", backend,
               "--images", str(args.images), "--rollouts", str(args.rollouts),
               "--concurrency", str(args.concurrency), "--padding-mb", str(args.padding_mb),
               "--think-ms", str(args.think_ms), "--corpus", str(args.corpus)]
    processes = [subprocess.Popen([*command, "--offset", str(i * args.images // count)],
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for i in range(count)]
    results = []
    for process in processes:
        out, err = process.communicate(timeout=3600)
        if process.returncode != 0:
            raise RuntimeError(f"a worker failed:\n{err}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


async def bench_share(serve: ServeChild, args: argparse.Namespace) -> dict[str, Any]:
    source = _synthetic()(args.images, seed=0, padding_bytes=int(args.padding_mb * MiB),
                          kind="local", root=args.corpus, think_s=args.think_ms / 1e3)
    await asyncio.to_thread(source.build)
    out: dict[str, Any] = {"workers": args.workers, "images": args.images,
                           "rollouts_per_task": args.rollouts, "concurrency": args.concurrency,
                           "think_ms": args.think_ms}
    for arm, env in (("in_process", {**os.environ, "ROLLBOX_BACKEND": "local"}),
                     ("served", serve.client_env())):
        before = await server_counters(serve) if arm == "served" else {}
        started = time.perf_counter()
        results = await asyncio.to_thread(run_workers, args.workers, env, args,
                                          "remote" if arm == "served" else "local")
        wall = time.perf_counter() - started
        ttfc = [t for r in results for t in r["ttfc"]]
        if arm == "served":
            after = await server_counters(serve)
            creations = after.get("creations", 0) - before.get("creations", 0)
        else:
            creations = sum(r["creations"] for r in results)
        out[arm] = {"creations": creations, "ttfc": ms(ttfc), "wall_s": wall,
                    "succeeded": sum(r["succeeded"] for r in results),
                    "requested": sum(r["requested"] for r in results)}
    return out


async def server_counters(serve: ServeChild) -> dict[str, float]:
    remote = await asyncio.to_thread(serve.backend)
    try:
        text = (await remote.http.request("GET", "/metrics", timeout=30)).body.decode()
    finally:
        await remote.aclose()
    prefix = 'rollbox_pool_events_total{event="'
    return {line[len(prefix):].split('"', 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line.startswith(prefix)}


# -- report ------------------------------------------------------------------------------


def render(result: dict[str, Any]) -> str:
    lines = [f"machine: {result['machine']}"]
    if "exec" in result:
        e = result["exec"]
        c = e["cpu_ms_per_exec"]
        lines.append(f"exec true p50: in-process {e['in_process']['p50_ms']:.3f} ms, served "
                     f"{e['served']['p50_ms']:.3f} ms, added {e['added_p50_ms']:.3f} ms "
                     f"(target <= 1 ms); CPU ms per exec: in-process {c['in_process']:.3f}, "
                     f"served client {c['served_client']:.3f} + server {c['server']:.3f}")
    if "ttfc" in result:
        t = result["ttfc"]
        lines.append(f"warm TTFC p50: second process through the server "
                     f"{t['served_second_process']['p50_ms']:.3f} ms (target <= 3 ms); "
                     f"in-process pool {t['in_process_pool']['p50_ms']:.3f} ms")
        split = {k: v["p50_ms"] for k, v in t["served_split"].items()}
        lines.append(f"  served, p50: create {split['create']:.3f} ms + first exec "
                     f"{split['first_exec']:.3f} ms; a bare GET /health after the same idle "
                     f"{split['bare_idle']:.3f} ms, right after another {split['bare_b2b']:.3f} ms")
    if "files" in result:
        f = result["files"]
        lines.append("100 MiB through the server, MiB/s (target >= 200): " + ", ".join(
            f"{k} {v['median_mib_s']:.0f}" for k, v in f.items()))
    if "ports" in result:
        p = result["ports"]
        parts = [f"host loopback {p['host_loopback']['p50_ms']:.3f} ms"]
        for name in ("local_endpoint", "served_endpoint"):
            if name in p:
                added = p[f"{name}_added_p50_ms"]
                parts.append(f"{name} {p[name]['p50_ms']:.3f} ms (+{added:.3f})")
        lines.append("HTTP GET p50 (target <= 2 ms added): " + ", ".join(parts))
    if "share" in result:
        s = result["share"]
        for arm in ("in_process", "served"):
            a = s[arm]
            lines.append(f"{s['workers']} processes, {arm}: creations {a['creations']}, TTFC "
                         f"mean {a['ttfc']['mean_ms']:.2f} ms p50 {a['ttfc']['p50_ms']:.2f} ms "
                         f"p99 {a['ttfc']['p99_ms']:.2f} ms, {a['succeeded']}/{a['requested']} "
                         f"ok, wall {a['wall_s']:.1f} s")
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    only = set(args.only.split(",")) if args.only else set(PHASES)
    result: dict[str, Any] = {"machine": {
        "nproc": os.cpu_count(), "kernel": platform.release(),
        "python": platform.python_version(), "loadavg_start": os.getloadavg()}}
    serve = await asyncio.to_thread(ServeChild, "--idle-ttl", "600")
    try:
        if "exec" in only:
            result["exec"] = await bench_exec(serve, args.n)
        if "ttfc" in only:
            result["ttfc"] = await bench_ttfc(serve, max(args.n // 3, 20))
        if "files" in only:
            result["files"] = await bench_files(serve, 100, 3)
        if "ports" in only:
            result["ports"] = await bench_ports(serve, args.n)
        if "share" in only:
            result["share"] = await bench_share(serve, args)
    finally:
        await asyncio.to_thread(serve.stop)
    result["machine"]["loadavg_end"] = os.getloadavg()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", nargs="?", default="bench", choices=["bench", "worker"])
    parser.add_argument("--only", default=None, help=f"phases among {','.join(PHASES)}")
    parser.add_argument("--n", type=int, default=500, help="samples per latency phase")
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--rollouts", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--padding-mb", type=float, default=1.0)
    parser.add_argument("--think-ms", type=float, default=100.0)
    parser.add_argument("--corpus", type=Path, default=None)
    parser.add_argument("--backend", default="local")
    parser.add_argument("--offset", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.mode == "worker":
        asyncio.run(worker(args))
        return
    if args.corpus is None:
        args.corpus = state_dir("rollbox-bench-corpus-")
    try:
        result = asyncio.run(run(args))
    finally:
        shutil.rmtree(args.corpus, ignore_errors=True)
    print(render(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
