"""One generation of a sandbox: a bwrap instance, its agent, its writable layer.

Reset replaces the generation. A sandbox in use boots its next generation in the
background (a standby), so that reset is a swap and not a wait.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rollbox_local.bwrap import Layout, sandbox_argv
from rollbox_local.instance import BLOCK_FD, INFO_FD, Instance
from rollbox_local.workers import BACKGROUND_NICE
from rollbox_local.zygote import AgentChannel

if TYPE_CHECKING:
    from rollbox_local.sandbox import LocalSandbox


@dataclass(eq=False)  # a live resource: compared and hashed by identity
class Generation:
    instance: Instance
    upper: Path
    work: Path
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

    async def start_agent(self, sandbox: LocalSandbox) -> AgentChannel:
        """The agent, booted on first need (concurrent callers share one boot)."""
        if self.agent is not None:
            return self.agent
        if self._agent_boot is None:
            self._agent_boot = asyncio.ensure_future(sandbox.backend.zygote.boot_agent(
                holder=self.instance.holder, rlimits=sandbox.rlimits, sandbox_id=sandbox.id,
                timeout=sandbox.spec.timeouts.create_s,
            ))
        return self._attach(await asyncio.shield(self._agent_boot))

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
        """Kill every process of this generation (its writable layer stays on disk)."""
        if self._agent_boot is not None and self.agent is None:
            with contextlib.suppress(Exception):
                self._attach(await self._agent_boot)
        if self.agent is not None:
            await self.agent.kill()
            self.agent.close()
        await self.instance.kill()


async def boot_generation(sandbox: LocalSandbox, number: int, *, agent: bool = False,
                          background: bool = False) -> Generation:
    """Start a fresh instance over a new, empty writable layer.

    ``agent``: start the agent now (a sandbox in use: its next generation will be used
    too). A new sandbox gets its agent with its first command (or ``prepare()``), so
    that idle reserves stay small. ``background``: nobody waits for this boot (a
    standby, or a sandbox a pool warms ahead of need), so its bwrap runs niced and
    commands running now keep the CPU."""
    backend = sandbox.backend
    upper, work = sandbox.directory / f"upper{number}", sandbox.directory / f"work{number}"
    layout = Layout(
        lowers=sandbox.lowers,
        upper=upper,
        work=work,
        on_host=sandbox.image.on_host,
        etc_dir=backend.etc_dir,
        workdir=sandbox.spec.workdir,
        share_network=sandbox.spec.network.value == "host",
    )
    instance = await Instance.start(
        backend.zygote,
        sandbox_argv(backend.bwrap, layout, block_fd=BLOCK_FD, info_fd=INFO_FD),
        block_fd=backend.block_fd,
        ids=backend.ids,
        timeout=sandbox.spec.timeouts.create_s,
        sandbox_id=sandbox.id,
        log_path=str(sandbox.directory / f"bwrap{number}.log"),
        make_dirs=(str(upper), str(work)),  # made by the zygote, as the sandbox user
        nice=BACKGROUND_NICE if background else 0,
    )
    generation = Generation(instance, upper, work)
    if agent:
        try:
            await generation.start_agent(sandbox)
        except BaseException:
            await generation.stop()
            raise
    return generation
