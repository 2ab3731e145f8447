"""One generation of a sandbox: a bwrap instance, its agent, its writable layer, its
cgroup.

Reset replaces the generation. A sandbox in use boots its next generation in the
background (a standby), so that reset is a swap and not a wait. A generation's writable
layer is a tmpfs of its own where the scratch allows (``scratch.py``), holding the
overlay's upper and work directories and what the sandbox sees as /dev/shm.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rollbox.errors import CreateFailedError
from rollbox.spec import MiB

from rollbox_local._agent import caps_dropped
from rollbox_local.bwrap import Layout, sandbox_argv
from rollbox_local.entrypoint import start_entrypoint
from rollbox_local.instance import BLOCK_FD, INFO_FD, Instance, bwrap_failure
from rollbox_local.workers import BACKGROUND_NICE
from rollbox_local.zygote import AgentChannel

if TYPE_CHECKING:
    from rollbox_local.sandbox import LocalSandbox


@dataclass(eq=False)  # a live resource: compared and hashed by identity
class Generation:
    instance: Instance
    upper: Path
    """The overlay's upper directory, as the bwrap process sees it (on a tmpfs layer it
    exists only in the generation's mount namespace: see ``host_upper``)."""
    leftovers: tuple[Path, ...]
    """What to delete on the host once it is stopped (directories, mount points)."""
    on_tmpfs: bool = False
    cgroup: str | None = None
    """The name of its cgroup (``cgroups.py``), None where the backend has none."""
    cgroup_procs: tuple[str, ...] = ()
    workload_cgroup: tuple[str, ...] = ()
    """Where its helpers, and so its commands, go (``CgroupPlan.workload``)."""
    on_stopped: Callable[[], None] | None = None
    """Called once every process is gone (drops the cgroup)."""
    on_put_to_use: Callable[[], None] | None = None
    """Called once when it is first used (a generation booted ahead of need runs at a
    standby's CPU weight until then: ``cgroups.STANDBY_WEIGHT``)."""
    agent: AgentChannel | None = None
    """None until the first command: an idle warm sandbox costs only its bwrap."""

    def __post_init__(self) -> None:
        self._agent_boot: asyncio.Task[AgentChannel] | None = None
        # Either one dying means the sandbox is lost: take the other down with it, so
        # that running commands end (and surface SandboxLostError) at once.
        self.instance.exited.add_done_callback(self._holder_died)

    def _holder_died(self, _: object) -> None:
        if self.agent is not None:
            self.agent.signal_kill()

    def _attach(self, agent: AgentChannel) -> AgentChannel:
        if self.agent is agent:  # a concurrent caller attached it already
            return agent
        self.agent = agent
        agent.exited.add_done_callback(lambda _: self.instance.signal_kill())
        if not self.instance.alive:
            agent.signal_kill()
        return agent

    async def start_agent(self, sandbox: LocalSandbox, *,
                          holder_ready: bool = True) -> AgentChannel:
        """The agent, booted on first need (concurrent callers share one boot).
        ``holder_ready=False``: the instance was started without waiting for bwrap to
        finish, and the agent's boot waits for it (``Instance.start``)."""
        if self.agent is not None:
            return self.agent
        if self._agent_boot is None:
            self._agent_boot = asyncio.ensure_future(sandbox.backend.zygote.boot_agent(
                holder=self.instance.holder, rlimits=sandbox.rlimits, sandbox_id=sandbox.id,
                timeout=sandbox.spec.timeouts.create_s, cgroup_procs=self.cgroup_procs,
                workload_cgroup=self.workload_cgroup, holder_ready=holder_ready,
                isolate=sandbox.backend.capabilities.exec_isolation,
            ))
        return self._attach(await asyncio.shield(self._agent_boot))

    @property
    def booting_agent(self) -> bool:
        """Its agent is being started (a first command, ``prepare``) but not there yet."""
        return self._agent_boot is not None and self.agent is None

    def put_to_use(self) -> None:
        """Someone waits on this generation now: give it a used generation's CPU weight."""
        if self.on_put_to_use is not None:
            self.on_put_to_use()
            self.on_put_to_use = None

    def host_upper(self) -> str:
        """The upper directory as a host path: through the bwrap process's root where
        the layer is a tmpfs mounted in the generation's own mount namespace."""
        if self.on_tmpfs:
            return f"/proc/{self.instance.monitor.pid}/root{self.upper}"
        return str(self.upper)

    @property
    def alive(self) -> bool:
        return self.instance.alive and (self.agent is None or self.agent.alive)

    @property
    def exits(self) -> list[asyncio.Future[None]]:
        return [self.instance.exited] + ([self.agent.exited] if self.agent else [])

    def signal_kill(self) -> None:
        """Kill every process of this generation without waiting for the teardown
        (unmounting a layer with many files takes milliseconds; nobody needs to wait)."""
        if self.agent is not None:
            self.agent.signal_kill()
        self.instance.signal_kill()

    async def stop(self) -> None:
        """Kill every process of this generation (a tmpfs layer goes with them; one on
        disk stays until ``leftovers`` are deleted)."""
        if self._agent_boot is not None and self.agent is None:
            with contextlib.suppress(Exception):
                self._attach(await self._agent_boot)
        if self.agent is not None:
            await self.agent.kill()
            self.agent.close()
        await self.instance.kill()
        if self.on_stopped is not None:
            self.on_stopped()
            self.on_stopped = None


async def boot_generation(sandbox: LocalSandbox, number: int, *, agent: bool = False,
                          background: bool = False) -> Generation:
    """Start a fresh instance over a new, empty writable layer.

    ``agent``: start the agent now (a sandbox in use: its next generation will be used
    too). A new sandbox gets its agent with its first command (or ``prepare()``), so
    that idle reserves stay small. ``background``: nobody waits for this boot (a
    standby, or a sandbox a pool warms ahead of need), so its bwrap runs niced and
    commands running now keep the CPU."""
    backend = sandbox.backend
    cgroup = cgroup_name(sandbox, number)
    plan = (backend.cgroups.plan(cgroup, sandbox.resources, standby=background,
                                 layer_in_memory=backend.scratch.tmpfs_layers)
            if backend.cgroups and cgroup else None)
    place = _place(sandbox, number)
    log_path = str(sandbox.directory / f"bwrap{number}.log")
    # With its agent, the sandbox is ready once the agent is: the agent's boot waits for
    # bwrap, started right behind it (one wait fewer, and none on the event loop).
    with_agent = agent or sandbox.spec.entrypoint is not None
    try:
        instance = await Instance.start(
            backend.zygote,
            sandbox_argv(backend.bwrap, place.layout, block_fd=BLOCK_FD, info_fd=INFO_FD),
            block_fd=backend.block_fd,
            ids=backend.ids,
            timeout=sandbox.spec.timeouts.create_s,
            sandbox_id=sandbox.id,
            log_path=log_path,
            make_dirs=place.make_dirs,  # made by the zygote, as the sandbox user
            nice=BACKGROUND_NICE if background else 0,
            cgroup=plan,
            tmpfs=place.tmpfs,
            await_ready=not with_agent,
        )
    except BaseException:
        backend.drop_cgroup(cgroup)
        raise
    generation = Generation(instance, place.layout.upper, place.leftovers,
                            place.tmpfs is not None, cgroup, plan.procs if plan else (),
                            plan.workload if plan else (),
                            lambda: backend.drop_cgroup(cgroup),
                            (lambda: backend.put_to_use(cgroup)) if plan and background else None)
    if with_agent:
        try:
            try:
                await generation.start_agent(sandbox, holder_ready=False)
            except CreateFailedError as exc:
                if caps_dropped(instance.holder) is None:  # bwrap failed: say why
                    raise CreateFailedError(bwrap_failure(log_path),
                                            sandbox_id=sandbox.id) from exc
                raise
            if sandbox.spec.entrypoint is not None:
                await start_entrypoint(sandbox, generation)
        except BaseException:
            await generation.stop()
            raise
    return generation


def cgroup_name(sandbox: LocalSandbox, number: int) -> str | None:
    """The cgroup of the sandbox's generation ``number`` (None: the backend has none)."""
    return f"{sandbox.id}-g{number}" if sandbox.backend.cgroups is not None else None


@dataclass(frozen=True)
class _Place:
    layout: Layout
    make_dirs: tuple[tuple[str, int], ...]
    leftovers: tuple[Path, ...]
    tmpfs: dict[str, object] | None


def _place(sandbox: LocalSandbox, number: int) -> _Place:
    """Where generation ``number``'s writable layer goes: a tmpfs of its own sized by the
    spec's disk limits, or directories on disk."""
    backend = sandbox.backend
    limits = sandbox.resources
    assert limits.disk_mb is not None and limits.inodes is not None

    def layout(upper: Path, work: Path, dev_shm: Path | None = None,
               dev_shm_bytes: int = 0) -> Layout:
        return Layout(
            lowers=sandbox.lowers, upper=upper, work=work, on_host=sandbox.image.on_host,
            etc_dir=backend.etc_dir, workdir=sandbox.spec.workdir,
            share_network=sandbox.spec.network.value == "host", dev_shm=dev_shm,
            dev_shm_bytes=dev_shm_bytes)

    if backend.scratch.tmpfs_layers:
        mount = sandbox.directory / f"g{number}"
        upper, work, shm = mount / "upper", mount / "work", mount / "shm"
        tmpfs: dict[str, object] = {
            "path": str(mount), "size": limits.disk_mb * MiB, "inodes": limits.inodes,
            "owner": list(backend.ids) if backend.ids else None}
        dirs = ((str(upper), 0o755), (str(work), 0o755), (str(shm), 0o1777))
        return _Place(layout(upper, work, dev_shm=shm), dirs, (mount,), tmpfs)
    upper, work = sandbox.directory / f"upper{number}", sandbox.directory / f"work{number}"
    return _Place(layout(upper, work, dev_shm_bytes=limits.disk_mb * MiB),
                  ((str(upper), 0o755), (str(work), 0o755)), (upper, work), None)
