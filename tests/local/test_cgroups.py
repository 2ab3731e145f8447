"""Where the local backend has cgroups, every process of a sandbox generation is in that
generation's group of every controller: bwrap's holder (entered by the zygote's child),
the agent and each command (entered by the agent's first process), after a reset too.

The processes enter by writing ``0`` into v1's ``tasks`` (see ``cgroups.JOIN_V1``); a
process left in the backend's group would escape the sandbox's memory, pids and CPU
limits and its freezer."""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from pathlib import Path

import pytest
from rollbox import SandboxSpec
from rollbox.backend import creating_ahead_of_need
from rollbox_local import LocalBackend
from rollbox_local.cgroups import STANDBY_WEIGHT, USED_WEIGHT, _own_groups
from rollbox_local.generation import Generation
from rollbox_local.sandbox import LocalSandbox


def _host_pids(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


async def _check_generation(backend: LocalBackend, sandbox: LocalSandbox) -> None:
    cgroups = backend.cgroups
    assert cgroups is not None
    generation = sandbox._live()
    assert generation.cgroup is not None
    marker = uuid.uuid4().hex
    process = await sandbox.stream(["sh", "-c", f"sleep 30; : {marker}"], timeout=60)
    try:
        pids = []
        for _ in range(100):
            pids = _host_pids(marker)
            if pids:
                break
            await asyncio.sleep(0.05)
        assert pids, "the command never showed up on the host"
        assert generation.agent is not None
        rollbox = {generation.instance.holder, generation.agent.pid}
        for pid in {*rollbox, *pids}:
            groups = _own_groups(pid)
            for controller in ("memory", "pids", "cpu", "freezer"):
                key = controller if cgroups.version == 1 else ""
                group = "/" + generation.cgroup
                if controller == "memory" and cgroups.version == 1 and pid not in rollbox:
                    group += "/work"  # the workload's memory: its limit, never the agent's
                assert groups[key].endswith(group), (pid, controller, groups)
    finally:
        await process.send_signal(signal.SIGKILL)
        await process.wait()


async def test_every_process_of_a_generation_is_in_its_groups(backend: LocalBackend) -> None:
    if backend.cgroups is None:
        pytest.skip(f"no cgroups here: {backend.cgroups_missing}")
    if os.geteuid() != 0 and backend.cgroups.version == 1:
        pytest.skip("v1 groups are root's")
    sandbox = await backend.create(SandboxSpec(image="host"))
    try:
        await _check_generation(backend, sandbox)
        await sandbox.reset()  # the next generation: booted as a standby, in its own groups
        await _check_generation(backend, sandbox)
    finally:
        await sandbox.close()


async def test_a_standby_weighs_little_on_the_cpu_until_it_is_put_to_use(
        backend: LocalBackend) -> None:
    """Generations compete as sibling groups, where a standby bwrap's nice value does not
    reach: its group's own CPU weight keeps its boot from taking half a CPU from the
    command running beside it (``cgroups.STANDBY_WEIGHT``)."""
    cgroups = backend.cgroups
    if cgroups is None:
        pytest.skip(f"no cgroups here: {backend.cgroups_missing}")
    if os.geteuid() != 0 and cgroups.version == 1:
        pytest.skip("v1 groups are root's")

    def weight(generation: Generation) -> int:
        assert generation.cgroup is not None
        return int(cgroups._weight_file(generation.cgroup).read_text())

    sandbox = await backend.create(SandboxSpec(image="host"))
    try:
        await sandbox.exec(["true"])  # in use: its standby boots meanwhile
        for _ in range(200):
            if sandbox._standby is not None:
                break
            await asyncio.sleep(0.005)
        assert sandbox._standby is not None, "no standby was booted"
        standby = await sandbox._standby
        assert weight(standby) == STANDBY_WEIGHT[cgroups.version]
        await sandbox.reset()
        assert sandbox._live() is standby
        assert weight(standby) == STANDBY_WEIGHT[cgroups.version]  # idle: weight is moot
        await sandbox.exec(["true"])
        assert weight(standby) == USED_WEIGHT[cgroups.version]
    finally:
        await sandbox.close()


async def test_a_reserve_warmed_ahead_of_need_is_not_put_to_use_by_preparing_it(
        backend: LocalBackend) -> None:
    """A pool prepares (starts the agent of) every sandbox it warms; only a command
    raises the weight."""
    cgroups = backend.cgroups
    if cgroups is None:
        pytest.skip(f"no cgroups here: {backend.cgroups_missing}")
    if os.geteuid() != 0 and cgroups.version == 1:
        pytest.skip("v1 groups are root's")
    with creating_ahead_of_need():
        sandbox = await backend.create(SandboxSpec(image="host"))
    try:
        await sandbox.prepare()
        generation = sandbox._live()
        assert generation.cgroup is not None
        weight = cgroups._weight_file(generation.cgroup)
        assert int(weight.read_text()) == STANDBY_WEIGHT[cgroups.version]
        await sandbox.exec(["true"])
        assert int(weight.read_text()) == USED_WEIGHT[cgroups.version]
    finally:
        await sandbox.close()
