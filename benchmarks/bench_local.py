"""Issue 2's performance targets on the local backend, with SWE-ReX alongside.

Measures, on image "host" (always hydrated):

1. warm TTFC: ``rollbox.Pool`` acquire -> first ``true`` result, over N acquires of a
   fixed warm pool whose release resets the sandbox in place; each lease holds the
   sandbox ``--use-ms`` after its first command (a stand-in for the model's turn);
   also back to back (no hold), and with ``StaticPoolPolicy(size=1)``;
2. cold create -> first result (``backend.create`` + ``exec(["true"])``);
3. exec round trip of ``true`` on a live sandbox;
4. reset in place after the sandbox wrote 1,000 files: after ``--settle-ms`` of use
   (the standby generation had time to boot) and immediately after the write;
5. N idle warm sandboxes at once: total PSS of their processes and the machine's
   used-memory delta; nothing left after the pool closes;
6. SWE-ReX's LocalDeployment (no isolation): start + first command, exec round trip.

    uv sync --group bench      # installs the SWE-ReX peer (optional)
    uv run --group bench python benchmarks/bench_local.py [--json out.json] [--quick]

Every phase gets its own backend over a fresh, world-searchable state directory (the
sandbox user must reach it when running as root) and checks ``leftovers()`` after.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rollbox import Pool, PoolPolicy, SandboxSpec, StaticPoolPolicy
from rollbox.errors import SandboxFileNotFoundError
from rollbox.metrics import Metrics, summarize
from rollbox.sandbox import Sandbox
from rollbox_local import LocalBackend

GiB = 1024**3
KERNEL_FIELDS = ("AnonPages", "Slab", "PageTables", "KernelStack", "VmallocUsed")
PHASES = ("ttfc", "cold_create", "exec", "reset", "idle", "swerex")
MS = 1e-3
TARGETS_S = {"ttfc_p50": 2 * MS, "ttfc_p99": 10 * MS, "cold_p50": 30 * MS,
             "exec_p50": 2 * MS, "reset_p50": 10 * MS}
WRITE_FILES = (
    "mkdir -p /tmp/w && cd /tmp/w && i=0 && while [ $i -lt {n} ]; do : > f$i; i=$((i+1)); "
    "done && ls | wc -l"
)


@dataclass(frozen=True)
class Config:
    ttfc_n: int = 1000
    ttfc_static_n: int = 200
    use_s: float = 0.1
    cold_n: int = 50
    exec_n: int = 1000
    reset_n: int = 50
    reset_files: int = 1000
    settle_s: float = 0.25
    idle_n: int = 1000
    idle_batch: int = 16
    rex_starts: int = 20
    rex_session_execs: int = 200
    rex_execs: int = 1000


QUICK = Config(ttfc_n=30, ttfc_static_n=10, use_s=0.02, cold_n=3, exec_n=50, reset_n=3,
               reset_files=100, settle_s=0.1, idle_n=8, idle_batch=4, rex_starts=1,
               rex_session_execs=3, rex_execs=20)


class FixedPoolPolicy(PoolPolicy):
    """A warm pool of a fixed set of sandboxes (created by ``prewarm``): no background
    refill, release resets in place and keeps up to ``size`` idle."""

    name = "fixed"

    def __init__(self, size: int) -> None:
        self.size = size

    def max_idle(self, spec: SandboxSpec) -> int:
        return self.size


# -- helpers -----------------------------------------------------------------------------


def make_state_dir() -> Path:
    """A new state directory the sandbox user can reach (``mkdtemp`` makes it 0700)."""
    state = Path(tempfile.mkdtemp(prefix="rollbox-bench-"))
    state.chmod(0o711)
    return state


@contextlib.asynccontextmanager
async def fresh_backend(report: dict[str, Any]) -> AsyncIterator[LocalBackend]:
    """A backend over a new state directory; records what it left behind in ``report``."""
    state = make_state_dir()
    backend = LocalBackend(state_dir=state)
    try:
        yield backend
    finally:
        await backend.aclose()
        report["leftovers"] = await backend.leftovers()
        shutil.rmtree(state, ignore_errors=True)


def summary_ms(values: list[float]) -> dict[str, float]:
    return {k: (v * 1e3 if k != "count" else v) for k, v in summarize(values).as_dict().items()}


async def timed(action: Callable[[], Awaitable[Any]]) -> float:
    started = time.perf_counter()
    await action()
    return time.perf_counter() - started


async def check_true(sandbox: Sandbox) -> None:
    result = await sandbox.exec(["true"])
    if result.exit_code != 0:
        raise RuntimeError(f"`true` exited {result.exit_code} in {sandbox.id}")


# -- 1. warm TTFC through the pool -------------------------------------------------------


async def ttfc_run(backend: LocalBackend, spec: SandboxSpec, policy: PoolPolicy,
                   n: int, use_s: float) -> dict[str, Any]:
    async with Pool(backend, policy=policy) as pool:
        await pool.prewarm(spec, 1)
        for _ in range(n):
            lease = await pool.acquire(spec)
            await check_true(lease.sandbox)
            if use_s:
                await asyncio.sleep(use_s)
            await lease.release()
        metrics = pool.metrics
    counters = dict(metrics.counters)
    return {
        "acquires": n, "hold_after_first_command_ms": use_s * 1e3,
        "ttfc_ms": summary_ms(metrics.samples.get("ttfc", [])),
        "reset_ms": summary_ms(metrics.samples.get("reset", [])),
        "creations": counters.get("creations", 0), "resets": counters.get("resets", 0),
        "closed": counters.get("closed", 0), "failures": metrics.failures_by_kind(),
    }


async def bench_ttfc(spec: SandboxSpec, cfg: Config) -> dict[str, Any]:
    out: dict[str, Any] = {}
    runs: list[tuple[str, Callable[[], PoolPolicy], int, float]] = [
        ("in_use", lambda: FixedPoolPolicy(1), cfg.ttfc_n, cfg.use_s),
        ("back_to_back", lambda: FixedPoolPolicy(1), cfg.ttfc_n, 0.0),
        ("static_policy", lambda: StaticPoolPolicy(size=1), cfg.ttfc_static_n, cfg.use_s),
    ]
    for name, policy, n, use_s in runs:
        report: dict[str, Any] = {}
        async with fresh_backend(report) as backend:
            report.update(await ttfc_run(backend, spec, policy(), n, use_s))
        out[name] = report
    return out


# -- 2. cold create, 3. exec round trip --------------------------------------------------


async def bench_cold(spec: SandboxSpec, cfg: Config) -> dict[str, Any]:
    report: dict[str, Any] = {}
    firsts, creates = [], []
    async with fresh_backend(report) as backend:
        warm = await backend.create(spec)  # starts the backend's zygote: once per backend
        await check_true(warm)
        await warm.close()
        for _ in range(cfg.cold_n):
            started = time.perf_counter()
            sandbox = await backend.create(spec)
            created = time.perf_counter()
            await check_true(sandbox)
            firsts.append(time.perf_counter() - started)
            creates.append(created - started)
            await sandbox.close()
    report.update(first_result_ms=summary_ms(firsts), create_only_ms=summary_ms(creates))
    return report


async def bench_exec(spec: SandboxSpec, cfg: Config) -> dict[str, Any]:
    report: dict[str, Any] = {}
    metrics = Metrics()
    async with fresh_backend(report) as backend:
        sandbox = await backend.create(spec)
        for _ in range(20):  # warm-up; the first command also starts the standby boot
            await check_true(sandbox)
        await asyncio.sleep(0.5)
        for _ in range(cfg.exec_n):
            metrics.observe("exec", await timed(lambda: check_true(sandbox)))
        await sandbox.close()
    report["exec_ms"] = summary_ms(metrics.samples["exec"])
    return report


# -- 4. reset after writing files --------------------------------------------------------


def standby_ready(sandbox: Sandbox) -> bool | None:
    """Diagnostic only: whether the local sandbox's standby generation finished booting
    (None if this backend version keeps no such attribute)."""
    if not hasattr(sandbox, "_standby"):
        return None
    task: asyncio.Task[Any] | None = sandbox._standby
    return task is not None and task.done()


async def reset_run(
    backend: LocalBackend, spec: SandboxSpec, cfg: Config, settle_s: float
) -> dict[str, Any]:
    """Each cycle the write is the generation's first command, so its standby starts
    booting when the write's result is in: ``settle_s`` later it is ready (or not)."""
    sandbox = await backend.create(spec)
    times, ready = [], []
    for _ in range(cfg.reset_n):
        wrote = await sandbox.exec(["sh", "-c", WRITE_FILES.format(n=cfg.reset_files)])
        if wrote.exit_code != 0 or int(wrote.stdout) != cfg.reset_files:
            raise RuntimeError(f"writing files failed: {wrote!r}")
        if settle_s:
            await asyncio.sleep(settle_s)
        ready.append(standby_ready(sandbox))
        times.append(await timed(sandbox.reset))
        # read_file starts no command, so it leaves the next generation's standby alone
        with contextlib.suppress(SandboxFileNotFoundError):
            await sandbox.read_file("/tmp/w/f0")
            raise RuntimeError("reset kept the files the sandbox wrote")
        if settle_s:
            await asyncio.sleep(settle_s)  # the dropped layer is deleted meanwhile
    await sandbox.close()
    known = [r for r in ready if r is not None]
    return {
        "files": cfg.reset_files,
        "resets": cfg.reset_n,
        "use_before_reset_ms": settle_s * 1e3,
        "standby_ready_at_reset": f"{sum(known)}/{len(known)}" if known else "unknown",
        "reset_ms": summary_ms(times),
    }


async def bench_reset(spec: SandboxSpec, cfg: Config) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, settle in (("after_use", cfg.settle_s), ("immediate", 0.0)):
        report: dict[str, Any] = {}
        async with fresh_backend(report) as backend:
            report.update(await reset_run(backend, spec, cfg, settle))
        out[name] = report
    return out


# -- 5. idle sandboxes: memory and cleanup -----------------------------------------------


def meminfo() -> dict[str, int]:
    values = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, rest = line.split(":", 1)
            values[key] = int(rest.split()[0]) * 1024
    return values


def used_bytes() -> int:
    info = meminfo()
    return info["MemTotal"] - info["MemAvailable"]


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def _mnt_ns(pid: int | str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def sandbox_processes(roots: list[Path]) -> dict[int, str]:
    """Processes of the sandboxes whose directories are under ``roots`` (a backend's
    ``scratch.place()``): their bwrap processes, and every process inside one of their
    mount namespaces (the agents). pid -> kind."""
    markers, own_ns = [str(root).encode() for root in roots], _mnt_ns("self")
    procs = [e.name for e in Path("/proc").iterdir() if e.name.isdigit()]
    found: dict[int, str] = {}
    for pid in procs:
        cmdline = _read(f"/proc/{pid}/cmdline") or b""
        if b"bwrap" in cmdline.split(b"\0", 1)[0] and any(m in cmdline for m in markers):
            found[int(pid)] = "bwrap"
    namespaces = {_mnt_ns(p) for p in found} - {None, own_ns}
    inside = [int(pid) for pid in procs if int(pid) not in found and _mnt_ns(pid) in namespaces]
    for pid in inside:  # the agent, and the helpers it forks (their parent is inside too)
        found[pid] = "helper" if _parent(pid) in inside else "agent"
    return found


def _parent(pid: int) -> int:
    for line in (_read(f"/proc/{pid}/status") or b"").splitlines():
        if line.startswith(b"PPid:"):
            return int(line.split()[1])
    return 0


def pss_bytes(pid: int) -> int:
    rollup = _read(f"/proc/{pid}/smaps_rollup") or b""
    for line in rollup.splitlines():
        if line.startswith(b"Pss:"):
            return int(line.split()[1]) * 1024
    return 0


async def bench_idle(spec: SandboxSpec, cfg: Config) -> dict[str, Any]:
    """Twice: held in reserve (``Pool(prepare=False)``: agents start with the first
    command) and ready (the default: every agent running)."""
    return {"reserve": await bench_idle_once(spec, cfg, prepare=False),
            "ready": await bench_idle_once(spec, cfg, prepare=True)}


async def bench_idle_once(spec: SandboxSpec, cfg: Config, *, prepare: bool) -> dict[str, Any]:
    state = make_state_dir()
    backend = LocalBackend(state_dir=state)
    report: dict[str, Any] = {"sandboxes": cfg.idle_n, "prepare": prepare}
    try:
        async with Pool(backend, policy=FixedPoolPolicy(cfg.idle_n), prepare=prepare) as pool:
            first = await backend.create(spec)  # starts the zygote before the baseline
            await first.close()
            await asyncio.sleep(1)
            before, kernel_before = used_bytes(), meminfo()
            started = time.perf_counter()
            while (have := pool.idle_count(spec)) < cfg.idle_n:
                await pool.prewarm(spec, min(cfg.idle_batch, cfg.idle_n - have))
                if pool.idle_count(spec) == have:
                    raise RuntimeError(f"no sandbox could be created after {have}: "
                                       f"{pool.metrics.failures_by_kind()}")
            report["create_all_s"] = time.perf_counter() - started
            await asyncio.sleep(2)
            after, kernel_after = used_bytes(), meminfo()
            procs = sandbox_processes([backend.scratch.place()])
            pss = {pid: pss_bytes(pid) for pid in procs}
            agents = {pid: _mnt_ns(pid) for pid, kind in procs.items() if kind == "agent"}
            report.update(
                processes=len(procs), agents=len(agents),
                total_pss_mib=sum(pss.values()) / 2**20,
                pss_per_sandbox_kib=sum(pss.values()) / cfg.idle_n / 1024,
                pss_by_kind_mib={k: sum(v for p, v in pss.items() if procs[p] == k) / 2**20
                                 for k in sorted(set(procs.values()))},
                used_delta_mib=(after - before) / 2**20,
                used_delta_per_sandbox_kib=(after - before) / cfg.idle_n / 1024,
                kernel_delta_mib={k: (kernel_after[k] - kernel_before[k]) / 2**20
                                  for k in KERNEL_FIELDS},
            )
        await backend.aclose()
        survivors = [p for p, ns in agents.items() if ns is not None and _mnt_ns(p) == ns]
        mounts = (_read("/proc/self/mountinfo") or b"").count(str(state).encode())
        report["leftovers"] = [
            *await backend.leftovers(),
            *(f"agent {p} still runs" for p in survivors),
            *([f"{mounts} mounts under {state}"] if mounts else []),
            *(f"process {p} still runs" for p in sandbox_processes([backend.scratch.place()])),
        ]
    finally:
        await backend.aclose()
        shutil.rmtree(state, ignore_errors=True)
    return report


# -- 6. SWE-ReX --------------------------------------------------------------------------


async def bench_swerex(cfg: Config) -> dict[str, Any]:
    os.environ.setdefault("SWE_REX_LOG_STREAM_LEVEL", "WARNING")
    try:
        import swerex  # noqa: F401
    except ImportError:
        return {"skipped": "swe-rex is not installed: run `uv sync --group bench` "
                           "(or `uv run --group bench python benchmarks/bench_local.py`)"}
    try:
        return await swerex_runs(cfg)
    except Exception as exc:  # a peer's failure is a result, not a reason to lose ours
        return {"skipped": f"SWE-ReX failed: {exc!r}"[:500]}


async def swerex_runs(cfg: Config) -> dict[str, Any]:
    from importlib.metadata import version

    from swerex.deployment.local import LocalDeployment
    from swerex.runtime.abstract import BashAction, Command, CreateBashSessionRequest

    async def start_and_first() -> LocalDeployment:
        deployment = LocalDeployment()
        await deployment.start()  # type: ignore[no-untyped-call]
        # Its default startup_timeout (1 s) is tight for its own 0.6 s of fixed sleeps
        # on a loaded machine; a longer one changes nothing when it starts in time.
        await deployment.runtime.create_session(CreateBashSessionRequest(startup_timeout=30))
        obs = await deployment.runtime.run_in_session(BashAction(command="true"))
        if obs.exit_code != 0:
            raise RuntimeError(f"SWE-ReX `true` exited {obs.exit_code}")
        return deployment

    starts = []
    for _ in range(cfg.rex_starts):
        started = time.perf_counter()
        deployment = await start_and_first()
        starts.append(time.perf_counter() - started)
        await deployment.stop()  # type: ignore[no-untyped-call]
    deployment = await start_and_first()
    try:
        session, execute = [], []
        for _ in range(cfg.rex_session_execs):
            session.append(await timed(
                lambda: deployment.runtime.run_in_session(BashAction(command="true"))))
        for _ in range(cfg.rex_execs):
            execute.append(await timed(
                lambda: deployment.runtime.execute(Command(command=["true"]))))
    finally:
        await deployment.stop()  # type: ignore[no-untyped-call]
    return {"version": version("swe-rex"), "start_first_command_ms": summary_ms(starts),
            "run_in_session_ms": summary_ms(session), "execute_ms": summary_ms(execute)}


# -- report ------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    model = "unknown"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")),
                     model)
    return {"nproc": os.cpu_count(), "cpu": model, "kernel": platform.release(),
            "python": platform.python_version(), "loadavg_start": os.getloadavg(),
            "mem_total_gib": meminfo()["MemTotal"] / GiB}


def verdict(value_ms: float, target_s: float) -> str:
    return "met" if value_ms <= target_s * 1e3 else "MISSED"


def rows(r: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(measure, result, target, verdict) lines of the table."""
    t, cold, ex = r["ttfc"], r["cold_create"], r["exec"]
    out = []
    for name, label in (("in_use", f"held {t['in_use']['hold_after_first_command_ms']:g} ms"),
                        ("back_to_back", "back to back"),
                        ("static_policy", "StaticPoolPolicy(1)")):
        s = t[name]["ttfc_ms"]
        out.append((f"warm TTFC, {label} (n={s['count']}, creations={t[name]['creations']})",
                    f"p50 {s['p50']:.2f} ms, p99 {s['p99']:.2f} ms", "p50 ≤ 2, p99 ≤ 10 ms",
                    "met" if s["p50"] <= 2 and s["p99"] <= 10 else "MISSED"))
    s = cold["first_result_ms"]
    out.append((f"cold create → first result (n={s['count']})",
                 f"p50 {s['p50']:.1f} ms (create alone {cold['create_only_ms']['p50']:.1f})",
                 "p50 ≤ 30 ms", verdict(s["p50"], TARGETS_S["cold_p50"])))
    s = ex["exec_ms"]
    out.append((f"exec `true` round trip (n={s['count']})",
                f"p50 {s['p50']:.2f} ms, p99 {s['p99']:.2f} ms", "p50 ≤ 2 ms",
                verdict(s["p50"], TARGETS_S["exec_p50"])))
    for name, label in (("after_use", "after use"), ("immediate", "immediately")):
        x = r["reset"][name]
        s = x["reset_ms"]
        out.append((f"reset after {x['files']} files, {label} "
                    f"(n={s['count']}, standby ready {x['standby_ready_at_reset']})",
                    f"p50 {s['p50']:.1f} ms, p99 {s['p99']:.1f} ms", "p50 ≤ 10 ms",
                    verdict(s["p50"], TARGETS_S["reset_p50"])))
    for mode, label in (("reserve", "in reserve, no agents"), ("ready", "ready, agents up")):
        idle = r["idle"][mode]
        n = idle["sandboxes"]
        out.append((f"{n} idle sandboxes {label}: total PSS ({idle['processes']} procs)",
                    f"{idle['total_pss_mib']:.0f} MiB", "≤ 1024 MiB",
                    "met" if idle["total_pss_mib"] <= 1024 else "MISSED"))
        out.append((f"{n} idle sandboxes {label}: used-memory delta",
                    f"{idle['used_delta_mib']:.0f} MiB "
                    f"(slab {idle['kernel_delta_mib']['Slab']:.0f})",
                    "≤ 1024 MiB", "met" if idle["used_delta_mib"] <= 1024 else "MISSED"))
    left = sum(len(v.get("leftovers", [])) for v in _phases(r))
    out.append(("left behind after close (all phases)", str(left), "0",
                "met" if left == 0 else "MISSED"))
    rex = r["swerex"]
    if "skipped" not in rex:
        rex_start, rex_exec = rex["start_first_command_ms"]["p50"], rex["run_in_session_ms"]["p50"]
        out += [
            ("SWE-ReX start + first command", f"p50 {rex_start:.0f} ms",
             "", f"rollbox cold {cold['first_result_ms']['p50'] / rex_start:.3f}x"),
            ("SWE-ReX run_in_session `true`", f"p50 {rex_exec:.1f} ms",
             "", f"rollbox exec {ex['exec_ms']['p50'] / rex_exec:.3f}x"),
            ("SWE-ReX execute(Command) `true`", f"p50 {rex['execute_ms']['p50']:.2f} ms",
             "", f"rollbox exec {ex['exec_ms']['p50'] / rex['execute_ms']['p50']:.2f}x"),
        ]
    return out


def _phases(r: dict[str, Any]) -> list[dict[str, Any]]:
    return [*r["ttfc"].values(), r["cold_create"], r["exec"], *r["reset"].values(),
            *r["idle"].values()]


def render(r: dict[str, Any]) -> str:
    table = rows(r)
    widths = [max(len(row[i]) for row in table) for i in range(4)]
    lines = [" | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True))
             for row in table]
    m = r["machine"]
    head = (f"{m['nproc']} cores ({m['cpu']}), kernel {m['kernel']}, Python {m['python']}, "
            f"load {m['loadavg_start'][0]:.1f} → {m['loadavg_end'][0]:.1f}")
    notes = [] if "skipped" not in r["swerex"] else [f"SWE-ReX: {r['swerex']['skipped']}"]
    return "\n".join([head, *lines, *notes])


def save(result: dict[str, Any], path: Path | None) -> None:
    if path is not None:
        path.write_text(json.dumps(result, indent=2) + "\n")


async def run(
    cfg: Config, only: frozenset[str] = frozenset(), json_path: Path | None = None
) -> dict[str, Any]:
    """Every phase in turn; the JSON file is rewritten after each, so a run cut short
    keeps what it measured."""
    spec = SandboxSpec(image="host")
    result: dict[str, Any] = {"config": asdict(cfg), "machine": machine()}
    phases: list[tuple[str, Callable[[], Awaitable[dict[str, Any]]]]] = [
        ("ttfc", lambda: bench_ttfc(spec, cfg)),
        ("cold_create", lambda: bench_cold(spec, cfg)),
        ("exec", lambda: bench_exec(spec, cfg)),
        ("reset", lambda: bench_reset(spec, cfg)),
        ("idle", lambda: bench_idle(spec, cfg)),
        ("swerex", lambda: bench_swerex(cfg)),
    ]
    result["phase_load"] = {}
    for name, phase in phases:
        if only and name not in only:
            continue
        started, load = time.perf_counter(), os.getloadavg()[0]
        result[name] = await phase()
        wall = time.perf_counter() - started
        result["phase_load"][name] = {"wall_s": wall, "load1_start": load,
                                      "load1_end": os.getloadavg()[0]}
        print(f"  {name}: {wall:.1f} s", file=sys.stderr, flush=True)
        save(result, json_path)
    result["machine"]["loadavg_end"] = os.getloadavg()
    save(result, json_path)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small smoke run (seconds)")
    parser.add_argument("--json", type=Path, help="also write the full results here")
    parser.add_argument("--use-ms", type=float, help="hold each lease after its first command")
    parser.add_argument("--idle", type=int, help="idle sandboxes alive at once")
    parser.add_argument("--only", action="append", default=[], choices=PHASES,
                        help="run only this phase (repeatable; the table needs all)")
    args = parser.parse_args()
    cfg = QUICK if args.quick else Config()
    if args.use_ms is not None:
        cfg = Config(**{**asdict(cfg), "use_s": args.use_ms / 1e3})
    if args.idle is not None:
        cfg = Config(**{**asdict(cfg), "idle_n": args.idle})
    result = asyncio.run(run(cfg, frozenset(args.only), args.json))
    if not args.only:
        print(render(result))


if __name__ == "__main__":
    main()
