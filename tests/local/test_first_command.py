"""The first command of a fresh generation (after a reset, or a sandbox's first) costs
its agent and helper no more than a steady one: the helper was forked just before, and
walks its request path once at boot (``Helper.warm_up``) so its copy-on-write faults
are paid while the generation boots, not by the command.
Counted in page faults (a count, not a timing: the same on a busy machine)."""

from __future__ import annotations

import asyncio
import statistics
from pathlib import Path

from rollbox.spec import SandboxSpec
from rollbox_local import LocalBackend
from rollbox_local.sandbox import LocalSandbox


def faults(pid: int) -> int:
    """Minor page faults of ``pid`` so far (0 once it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat.rsplit(")", 1)[1].split()[7])


def agent_and_helpers(sandbox: LocalSandbox) -> dict[int, int]:
    assert sandbox._current is not None and sandbox._current.agent is not None
    agent = sandbox._current.agent.pid
    children = Path(f"/proc/{agent}/task/{agent}/children").read_text().split()
    return {pid: faults(pid) for pid in [agent, *map(int, children)]}


async def faults_of_one_command(sandbox: LocalSandbox) -> int:
    before = agent_and_helpers(sandbox)
    await sandbox.exec(["true"])
    after = agent_and_helpers(sandbox)
    return sum(after[pid] - before.get(pid, 0) for pid in after)


async def test_a_fresh_generations_first_command_faults_like_a_steady_one(
        backend: LocalBackend) -> None:
    sandbox = await backend.create(SandboxSpec(image="host"))
    assert isinstance(sandbox, LocalSandbox)
    first, steady = [], []
    try:
        for _ in range(5):
            await sandbox.reset()
            await asyncio.sleep(0.1)  # its agent has booted (its helper warmed up)
            first.append(await faults_of_one_command(sandbox))
            steady.append(await faults_of_one_command(sandbox))
    finally:
        await sandbox.close()
    # Without the rehearsal: ~170 against ~6.
    assert statistics.median(first) <= statistics.median(steady) + 30, (first, steady)
