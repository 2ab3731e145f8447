"""Helpers for the NeMo Gym adapter's tests."""

from __future__ import annotations

import asyncio
import os

import psutil
import rollbox_nemo_gym
from nemo_gym.sandbox import SandboxSpec
from omegaconf import OmegaConf
from rollbox.envs.pools import SharedPool, registry


def sandbox_processes() -> list[str]:
    """bubblewrap processes this test process started (each sandbox runs two)."""
    found = []
    for child in psutil.Process(os.getpid()).children(recursive=True):
        try:
            if child.name() == "bwrap":
                found.append(f"{child.pid} {' '.join(child.cmdline())[:120]}")
        except psutil.NoSuchProcess:
            continue
    return found


def provider_block(**overrides: object) -> dict[str, object]:
    """The adapter's shipped YAML block for the provider, with ``overrides``."""
    shipped = OmegaConf.to_container(OmegaConf.load(rollbox_nemo_gym.CONFIG), resolve=True)
    assert isinstance(shipped, dict)
    settings = dict(shipped["sandbox"]["rollbox"])
    settings.update(overrides)
    return {"rollbox": settings}


def shared_pools() -> list[SharedPool]:
    """The warm pools this process's providers share right now."""
    thread, pools = registry()

    async def open_pools() -> list[SharedPool]:
        return pools.open()

    return asyncio.run_coroutine_threadsafe(open_pools(), thread.loop).result(10)


async def leftovers(shared: SharedPool) -> list[str]:
    """What the pool's backend still holds (empty once it is closed)."""
    thread, _ = registry()
    return await thread.call(shared.backend.leftovers())


def spec(**fields: object) -> SandboxSpec:
    return SandboxSpec(**fields)  # type: ignore[arg-type]
