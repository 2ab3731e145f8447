"""Helpers for the NeMo Gym adapter's tests."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

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


def provider_block(config: Path = rollbox_nemo_gym.CONFIG,
                   **overrides: object) -> dict[str, object]:
    """The adapter's shipped YAML block for the provider, with ``overrides``."""
    shipped = OmegaConf.to_container(OmegaConf.load(config), resolve=True)
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


class RollboxServe:
    """A real ``rollbox serve`` (local backend) in a process of its own, with a home and
    a state directory under ``root``: its socket is ``url``, its token ``token_file``."""

    def __init__(self, root: Path) -> None:
        self.home = root / "server-home"
        self.state = root / "server-state"
        self.home.mkdir(mode=0o711)
        self.log = root / "serve.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"unix:{self.state / 'serve.sock'}"

    @property
    def token_file(self) -> Path:
        return self.state / "token"

    def start(self, timeout_s: float = 120) -> RollboxServe:
        env = {**os.environ, "ROLLBOX_HOME": str(self.home)}
        env.pop("ROLLBOX_BACKEND", None)
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "rollbox", "serve", "--state-dir", str(self.state)],
                env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while b"use it:" not in self.log.read_bytes():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"rollbox serve did not start:\n{self.log.read_text()}")
            time.sleep(0.05)
        return self

    async def held(self) -> list[str]:
        """The ids of the sandboxes clients hold on the server right now."""
        from rollbox_remote.backend import RemoteBackend

        backend = await asyncio.to_thread(RemoteBackend, self.url, token_file=self.token_file)
        try:
            return [info["id"] for info in await backend.call("GET", "/sandboxes")]
        finally:
            await backend.aclose()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
