"""One generation of a sandbox: a bwrap instance, its agent, its writable layer.

Reset replaces the generation. A sandbox in use boots its next generation in the
background (a standby), so that reset is a swap and not a wait.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rollbox_local.bwrap import Layout, sandbox_argv
from rollbox_local.instance import BLOCK_FD, INFO_FD, Instance
from rollbox_local.zygote import AgentChannel

if TYPE_CHECKING:
    from rollbox_local.sandbox import LocalSandbox


STANDBY_NICE = 10


@dataclass
class Generation:
    instance: Instance
    agent: AgentChannel
    upper: Path
    work: Path

    def __post_init__(self) -> None:
        # Either one dying means the sandbox is lost: take the other down with it, so
        # that running commands end (and surface SandboxLostError) at once.
        self.instance.exited.add_done_callback(lambda _: self.agent.signal_kill())
        self.agent.exited.add_done_callback(lambda _: self.instance.signal_kill())

    @property
    def alive(self) -> bool:
        return self.instance.alive and self.agent.alive

    def signal_kill(self) -> None:
        """Kill every process of this generation without waiting for the teardown
        (unmounting a layer with many files takes milliseconds; nobody needs to wait)."""
        self.agent.signal_kill()
        self.instance.signal_kill()

    async def stop(self) -> None:
        """Kill every process of this generation (its writable layer stays on disk)."""
        await self.agent.kill()
        self.agent.close()
        await self.instance.kill()


async def boot_generation(sandbox: LocalSandbox, number: int, *,
                          standby: bool = False) -> Generation:
    """Start a fresh instance over a new, empty writable layer, and its agent.

    A standby's bwrap runs niced: nobody waits for it, commands running now do."""
    backend = sandbox.backend
    upper, work = sandbox.directory / f"upper{number}", sandbox.directory / f"work{number}"
    for path in (upper, work):
        path.mkdir(mode=0o755)
        if backend.ids is not None:
            os.chown(path, *backend.ids)
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
        nice=STANDBY_NICE if standby else 0,
    )
    try:
        agent = await backend.zygote.boot_agent(
            holder=instance.holder, rlimits=sandbox.rlimits, sandbox_id=sandbox.id,
            timeout=sandbox.spec.timeouts.create_s,
        )
    except BaseException:
        await instance.kill()
        raise
    return Generation(instance, agent, upper, work)
