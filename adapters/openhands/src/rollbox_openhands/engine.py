"""One rollbox backend, pool and warm agent-servers per process, for synchronous callers.

The OpenHands SDK is synchronous; rollbox is asyncio. ``Engine`` runs an event loop in a
daemon thread that owns a backend, a ``Pool`` and ``AgentServers``; workspaces submit
coroutines to it. Every ``RollboxWorkspace`` of a process shares the one engine, so
they share its warm agent-servers. It closes at interpreter exit (or ``shutdown()``).
"""

from __future__ import annotations

import asyncio
import atexit
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

from rollbox import Pool, open_backend
from rollbox.backend import Backend

from rollbox_openhands.agent_servers import AgentServers
from rollbox_openhands.server import WarmTargets, agent_servers_on

T = TypeVar("T")
_lock = threading.Lock()
_engine: Engine | None = None


class Engine:
    def __init__(self, *, warm: int = 1, backend: str | None = None) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="rollbox-openhands",
                                        daemon=True)
        self._thread.start()
        self._backend: Backend | None = None
        self._pool: Pool | None = None
        self.servers: AgentServers = self.run(self._open(warm, backend))

    async def _open(self, warm: int, backend: str | None) -> AgentServers:
        self._backend = open_backend(backend)
        self._pool = Pool(self._backend, policy=WarmTargets())
        return agent_servers_on(self._pool, warm=warm)

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coroutine`` on the engine's loop and wait for its result."""
        future: Future[T] = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        return future.result(timeout)

    def close(self) -> None:
        if not self.loop.is_running():
            return

        async def close_all() -> None:
            await self.servers.aclose()
            if self._pool is not None:
                await self._pool.close()
            if self._backend is not None:
                await self._backend.aclose()

        try:
            self.run(close_all(), timeout=120)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)


def engine(*, warm: int = 1) -> Engine:
    """The process's engine, started on first use."""
    global _engine
    with _lock:
        if _engine is None:
            _engine = Engine(warm=warm)
            atexit.register(shutdown)
        return _engine


def shutdown() -> None:
    """Stop every agent-server and close the sandboxes of this process's engine."""
    global _engine
    with _lock:
        current, _engine = _engine, None
    if current is not None:
        current.close()
