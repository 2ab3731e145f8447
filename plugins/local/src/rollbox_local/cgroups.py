"""Control groups: limits that hold for a sandbox as a whole, and a freezer.

rlimits count one process at a time (six processes of 450 MiB each pass a 512 MiB
RLIMIT_AS; memfd and tmpfs pages count nowhere). A cgroup counts everything a sandbox
generation holds: every process, the tmpfs pages of its writable layer, memfd. Each
generation of each sandbox gets one, under a group per backend process::

    <where this process may make groups>/rollbox-<owner>/   cpu weight of one process
        lbx-…-g0/   memory, pids, cpu quota and weight; freezer (one per generation)
            work/   (cgroup v1 memory) the helpers and every command: the memory limit

On cgroup v1 the generation's agent stays in ``lbx-…-g0`` while its helpers enter
``work/`` as they are forked (``_agent.py``): an out-of-memory kill inside the sandbox
chooses among the workload's processes only, never the agent, so a sandbox that exhausts
its memory stays a sandbox (its command is killed, the next one runs). cgroup v2 allows
processes only in leaf groups and has no cheap way for a process to enter one (see
JOIN_V1), so there the agent shares the group and an agent killed for memory is counted
(``oom_kills``) and reported as the workload's doing.

Where the writable layer is a tmpfs (``scratch.py``), its pages are memory charged to the
group: the memory limit is then ``memory_mb + disk_mb``, so that a full layer is ENOSPC
at ``disk_mb`` and never an out-of-memory kill.

The zygote's child makes a generation's group, writes its limits and enters it before
it starts bwrap, and the agent's first process enters it before it forks the agent: the
sandbox never runs outside it, and no group is made, entered or removed on the event
loop (only a CPU weight is written there: ``put_to_use``).

Where groups can be made:

* cgroup v2: under the parent of this process's group when this user may write it and
  it has the controllers (a systemd-delegated user session: ``systemd-run --user
  --scope``), else under the root group when running as root;
* cgroup v1 (this machine's kind: memory, cpu, pids, freezer hierarchies writable by
  root): under this process's own group of each controller.

Groups of backend processes that died are removed when a backend starts (their last
processes killed first). Where none of this is possible, ``Cgroups.detect`` says why and
the backend declares no whole-sandbox memory, CPU or pids limit.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rollbox.spec import Resources

from rollbox_local.owners import owner_alive, owner_name

CONTROLLERS = ("memory", "pids", "cpu")
CPU_PERIOD_US = 100_000
SANDBOX_WEIGHT_V1 = 1024  # cpu.shares of all sandboxes together
SANDBOX_WEIGHT_V2 = 100  # cpu.weight of all sandboxes together
"""All sandboxes together weigh what one ordinary process does: however many burn CPU,
the backend (one process) keeps at least the share of each CPU it would have against a
single competitor. Lower would starve sandboxes on a host busy with other work (their
agents too: a kill of a timed-out command would wait for CPU)."""
STANDBY_WEIGHT = {1: 110, 2: 11}
"""cpu.shares (v1) / cpu.weight (v2) of a generation booted ahead of need (a standby, a
warm reserve) until it is put to use; groups that are in use keep the default (1024 /
100). Generations compete as sibling groups, so a standby bwrap's nice value counts only
inside its own group: without this a standby's boot took half of a CPU from a command
running next to it. 110 is what nice 10 weighs against nice 0's 1024."""
USED_WEIGHT = {1: 1024, 2: 100}
JOIN_V1 = "tasks"
"""How a process enters a v1 group: it writes ``0`` (itself) into ``tasks``. The
processes that enter (the zygote's child, the agent's first process) have one thread
each, so this moves the whole process; and moving only the writing thread skips the
kernel's global threadgroup lock, whose writer otherwise waits out an RCU grace period
(7-17 ms on an idle 2-core machine, once per generation or twice, on every cold create
and first command). ``cgroup.procs`` takes that lock; v2 has only ``cgroup.procs`` for a
group that is not threaded, so there each generation pays it (``favordynmods`` on the
cgroup2 mount makes it cheap)."""
PREFIX = "rollbox-"
KILL_ROUNDS = 3
MiB = 1024 * 1024
WORKLOAD = "work"
"""The child group (v1 memory) the workload's processes run in."""
AGENT_MEMORY_MB = 64
"""What a generation's group allows beyond its workload's limit, for the agent and
bwrap's holder (a few MiB each, most of it shared with the zygote)."""


@dataclass(frozen=True)
class CgroupPlan:
    """What the zygote's child does for one generation, in order: make ``dirs``, write
    ``writes`` (file, value), then write ``0`` (itself) into each of ``procs``. Each of
    the agent's helpers then writes ``0`` into each of ``workload``."""

    dirs: tuple[str, ...]
    writes: tuple[tuple[str, str], ...]
    procs: tuple[str, ...]
    workload: tuple[str, ...] = ()

    def as_request(self) -> dict[str, list[object]]:
        return {"dirs": list(self.dirs), "writes": [list(w) for w in self.writes],
                "procs": list(self.procs)}


class Cgroups:
    """The groups of one backend process: its base group, one group per generation."""

    def __init__(self, version: int, bases: dict[str, Path]) -> None:
        self.version = version
        self.bases = bases
        """Controller → this backend's base group (v2: one directory for all)."""

    # -- finding where groups can be made --------------------------------------------------

    @classmethod
    def detect(cls) -> tuple[Cgroups | None, str]:
        """This backend's groups (made now), or None and why none can be made here."""
        v2_root, v1_mounts = _mounts()
        own = _own_groups()
        why_not = "no cgroup filesystem is mounted"
        if v2_root is not None and set(CONTROLLERS) <= _controllers(v2_root):
            for parent in _v2_candidates(v2_root, own.get("", "/")):
                try:
                    base = _make_base_v2(parent)
                except OSError as exc:
                    why_not = f"cannot make a cgroup under {parent}: {exc.strerror}"
                    continue
                return cls(2, {c: base for c in (*CONTROLLERS, "freezer")}), ""
            if why_not == "no cgroup filesystem is mounted":
                why_not = ("this user may not write any cgroup v2 group with the memory, "
                           "pids and cpu controllers")
        needed = (*CONTROLLERS, "freezer")
        if all(c in v1_mounts for c in needed):
            bases = {}
            try:
                for controller in needed:
                    parent = v1_mounts[controller] / own.get(controller, "/").lstrip("/")
                    sweep_dead(parent, version=1)
                    bases[controller] = _mkdir(parent / f"{PREFIX}{owner_name()}")
                _write(bases["cpu"] / "cpu.shares", str(SANDBOX_WEIGHT_V1))
                if (bases["memory"] / "memory.use_hierarchy").exists():
                    with contextlib.suppress(OSError):
                        _write(bases["memory"] / "memory.use_hierarchy", "1")
            except OSError as exc:
                for path in bases.values():
                    with contextlib.suppress(OSError):
                        path.rmdir()
                return None, (f"cannot make cgroup v1 groups ({exc.strerror}: "
                              f"{exc.filename}); run as root, or use cgroup v2 delegation")
            return cls(1, bases), ""
        if v1_mounts and v2_root is None:
            why_not = ("cgroup v1 is missing some of the memory, pids, cpu and freezer "
                       "controllers")
        return None, why_not

    # -- one generation ---------------------------------------------------------------

    def group(self, name: str) -> dict[str, Path]:
        return {controller: base / name for controller, base in self.bases.items()}

    def plan(self, name: str, resources: Resources, *, standby: bool = False,
             layer_in_memory: bool = False) -> CgroupPlan:
        """The group ``name`` with ``resources``' memory, pids and CPU limits; at
        STANDBY_WEIGHT until ``put_to_use`` where ``standby``. ``layer_in_memory``: the
        writable layer is a tmpfs of ``disk_mb``, whose pages count as memory."""
        groups = self.group(name)
        writes: list[tuple[str, str]] = []
        if standby:
            writes.append((str(self._weight_file(name)), str(STANDBY_WEIGHT[self.version])))
        r = resources
        memory = None if r.memory_mb is None else (
            r.memory_mb + (r.disk_mb or 0 if layer_in_memory else 0)) * MiB
        if self.version == 2:
            path = groups["memory"]
            if memory is not None:
                writes += [(f"{path}/memory.max", str(memory)),
                           (f"{path}/memory.swap.max", "0")]
            if r.pids is not None:
                writes.append((f"{path}/pids.max", str(r.pids)))
            if r.cpus is not None:
                writes.append((f"{path}/cpu.max", f"{_quota(r.cpus)} {CPU_PERIOD_US}"))
            return CgroupPlan((str(path),), tuple(writes), (f"{path}/cgroup.procs",))
        dirs = [str(p) for p in groups.values()]
        workload: tuple[str, ...] = ()
        if memory is not None:
            work = groups["memory"] / WORKLOAD
            dirs.append(str(work))
            workload = (f"{work}/{JOIN_V1}",)
            swap = (self.bases["memory"] / "memory.memsw.limit_in_bytes").exists()
            for group, limit in ((groups["memory"], memory + AGENT_MEMORY_MB * MiB),
                                 (work, memory)):
                writes.append((f"{group}/memory.limit_in_bytes", str(limit)))
                if swap:  # no swap: after memory.limit_in_bytes, which it may not undercut
                    writes.append((f"{group}/memory.memsw.limit_in_bytes", str(limit)))
        if r.pids is not None:
            writes.append((f"{groups['pids']}/pids.max", str(r.pids)))
        if r.cpus is not None:
            writes += [(f"{groups['cpu']}/cpu.cfs_period_us", str(CPU_PERIOD_US)),
                       (f"{groups['cpu']}/cpu.cfs_quota_us", str(_quota(r.cpus)))]
        procs = tuple(f"{d}/{JOIN_V1}" for d in dirs if not d.endswith(f"/{WORKLOAD}"))
        return CgroupPlan(tuple(dirs), tuple(writes), procs, workload)

    def oom_kills(self, name: str) -> int:
        """How many processes of generation ``name`` the kernel killed for its memory
        limit (0 where it cannot tell, or the group is gone)."""
        group = self.group(name)["memory"]
        files = ((group / "memory.events",) if self.version == 2 else
                 (group / "memory.oom_control", group / WORKLOAD / "memory.oom_control"))
        kills = 0
        for path in files:
            with contextlib.suppress(OSError, ValueError):
                for line in _read(path).splitlines():
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        kills += int(value)
        return kills

    def _weight_file(self, name: str) -> Path:
        return self.group(name)["cpu"] / ("cpu.weight" if self.version == 2 else "cpu.shares")

    def put_to_use(self, name: str) -> None:
        """Give group ``name`` a used generation's CPU weight. One write that waits on no
        other group (tens of microseconds; 0.1-0.3 ms on a busy machine), so it is made
        on the event loop, just after the command's request is sent (where a thread hop
        would cost more), overlapping the agent's work; a group already gone is left
        alone."""
        with contextlib.suppress(OSError):
            _write(self._weight_file(name), str(USED_WEIGHT[self.version]))

    def freeze(self, name: str, frozen: bool, *, timeout: float = 10.0) -> bool:
        """Stop (or continue) every process of group ``name``; blocking, so call it in a
        thread. True once the kernel reports the group frozen (thawed)."""
        group = self.group(name)["freezer"]
        deadline = time.monotonic() + timeout
        if self.version == 2:
            _write(group / "cgroup.freeze", "1" if frozen else "0")
            want = f"frozen {1 if frozen else 0}"
            while want not in _read(group / "cgroup.events").splitlines():
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.001)
            return True
        _write(group / "freezer.state", "FROZEN" if frozen else "THAWED")
        want = "FROZEN" if frozen else "THAWED"
        while _read(group / "freezer.state").strip() != want:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.001)
        return True

    def remove(self, name: str) -> None:
        """Remove group ``name`` once its processes are gone (blocking: call it in a
        thread); what still runs there after a short wait is killed first."""
        for path in self.group(name).values():
            _remove_group(path)

    def close(self) -> None:
        """Remove this backend's base groups (after every generation's)."""
        for path in set(self.bases.values()):
            _remove_group(path)


# -- helpers ---------------------------------------------------------------------------


def _quota(cpus: float) -> int:
    return max(1000, round(cpus * CPU_PERIOD_US))


def _read(path: Path) -> str:
    with open(path) as f:
        return f.read()


def _write(path: Path | str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _mkdir(path: Path) -> Path:
    with contextlib.suppress(FileExistsError):
        path.mkdir()
    return path


def _mounts() -> tuple[Path | None, dict[str, Path]]:
    """The cgroup v2 mount (if any) and each v1 controller's mount."""
    v2: Path | None = None
    v1: dict[str, Path] = {}
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            point = Path(left.split()[4])
            kind, _, options = [*right.split(), "", "", ""][:3]
            if kind == "cgroup2" and v2 is None:
                v2 = point
            elif kind == "cgroup":
                for option in options.split(","):
                    if option in (*CONTROLLERS, "freezer"):
                        v1.setdefault(option, point)
    return v2, v1


def _own_groups(pid: int | str = "self") -> dict[str, str]:
    """This process's (or ``pid``'s) group per v1 controller, and under "" its v2 group."""
    found: dict[str, str] = {}
    with contextlib.suppress(OSError), open(f"/proc/{pid}/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                found[controller] = path
    return found


def _controllers(group: Path) -> set[str]:
    try:
        return set(_read(group / "cgroup.controllers").split())
    except OSError:
        return set()


def _v2_candidates(root: Path, own: str) -> Iterator[Path]:
    """Where this backend may put its base group: the parent of its own group (a
    delegated subtree), then the root (root user only)."""
    mine = root / own.lstrip("/")
    if mine != root:
        yield mine.parent
    if os.geteuid() == 0:
        yield root


def _make_base_v2(parent: Path) -> Path:
    if not os.access(parent, os.W_OK) or not os.access(parent / "cgroup.procs", os.W_OK):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(parent))
    enabled = set(_read(parent / "cgroup.subtree_control").split())
    missing = [c for c in CONTROLLERS if c not in enabled]
    if missing:
        _write(parent / "cgroup.subtree_control", " ".join(f"+{c}" for c in missing))
    sweep_dead(parent, version=2)
    base = _mkdir(parent / f"{PREFIX}{owner_name()}")
    _write(base / "cgroup.subtree_control", " ".join(f"+{c}" for c in CONTROLLERS))
    _write(base / "cpu.weight", str(SANDBOX_WEIGHT_V2))
    return base


def sweep_all_dead() -> list[Path]:
    """Remove the base groups of dead backend processes wherever this process could
    have made them (what ``detect`` sweeps, without making a group of its own)."""
    v2_root, v1_mounts = _mounts()
    own = _own_groups()
    removed: list[Path] = []
    if v2_root is not None:
        for parent in _v2_candidates(v2_root, own.get("", "/")):
            removed += sweep_dead(parent, version=2)
    for controller, mount in v1_mounts.items():
        removed += sweep_dead(mount / own.get(controller, "/").lstrip("/"), version=1)
    return removed


def sweep_dead(parent: Path, *, version: int) -> list[Path]:
    """Remove the base groups under ``parent`` whose backend process is gone."""
    removed = []
    with contextlib.suppress(OSError):
        for entry in sorted(parent.iterdir()):
            if (entry.is_dir() and entry.name.startswith(PREFIX)
                    and not owner_alive(entry.name[len(PREFIX):])):
                _remove_group(entry)
                removed.append(entry)
    return removed


def _remove_group(path: Path, *, patience: float = 2.0) -> None:
    """rmdir a group and its children, deepest first, killing what still runs there
    after ``patience`` seconds (a generation's processes die with its agent, not at
    once)."""
    try:  # another remover (a generation's stop racing the backend's close) may be first
        children = sorted((p for p in path.iterdir() if p.is_dir()), reverse=True)
    except (FileNotFoundError, NotADirectoryError):
        return
    for child in children:
        _remove_group(child, patience=patience)
    for attempt in range(KILL_ROUNDS + 1):
        deadline = time.monotonic() + patience
        while time.monotonic() < deadline:
            try:
                path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    raise
            time.sleep(0.005)
        if attempt < KILL_ROUNDS:
            _kill_members(path)
    raise OSError(errno.EBUSY, "processes of the group would not die", str(path))


def _kill_members(path: Path) -> None:
    kill = path / "cgroup.kill"
    if kill.exists():
        with contextlib.suppress(OSError):
            _write(kill, "1")
            return
    with contextlib.suppress(OSError):
        for pid in _read(path / "cgroup.procs").split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
