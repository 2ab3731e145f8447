"""The sync bridge: one asyncio event loop per process, on a background thread.

rollbox is async; Gymnasium, most trainers and many servers call environments
synchronously. Each caller could run its own loop (``asyncio.run`` per call), but then
they could not share a pool: a pool, its sandboxes and their subprocess pipes belong to
the loop that made them. So there is exactly one loop per process, on a daemon thread
started on first use; a synchronous caller submits a coroutine to it and blocks for the
result (``loop_thread().run(coro)``), an async caller on a loop of its own awaits it
(``await loop_thread().call(coro)``), and a batch submits one coroutine that runs many
sessions concurrently.

Safe across ``fork`` (``AsyncVectorEnv`` forks workers): a child process notices that
the loop thread belongs to its parent and starts its own. Calling ``run`` from the loop
thread itself would deadlock, so it raises instead.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import concurrent.futures.thread  # its exit hook first: see the end of this module
import contextlib
import os
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from rollbox.errors import UsageError

T = TypeVar("T")


class LoopThread:
    """An event loop running forever on a daemon thread."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._main, name="rollbox-loop", daemon=True
        )
        self._shutdown_hooks: list[Callable[[], Coroutine[Any, Any, None]]] = []
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self.loop.is_closed()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for its result (or its exception).

        If the waiting thread is interrupted (KeyboardInterrupt) the coroutine is
        cancelled, so no sandbox work outlives its caller.
        """
        if threading.current_thread() is self._thread:
            coro.close()
            raise UsageError(
                "rollbox was called synchronously from inside its own event loop (the "
                "bridge's thread); from async code await the coroutine, or call from "
                "another thread"
            )
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except BaseException:
            future.cancel()
            raise

    async def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` run on this loop, from any event loop (directly when called on
        this one). Cancelling the caller cancels the coroutine."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def on_shutdown(self, hook: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Register a coroutine function to await on the loop before it stops."""
        self._shutdown_hooks.append(hook)

    def stop(self) -> None:
        """Run the shutdown hooks, stop the loop and join the thread. Idempotent."""
        if not self.alive:
            return
        if os.getpid() == self.pid:
            for hook in reversed(self._shutdown_hooks):
                # best effort: the process (or this loop) is going away
                with contextlib.suppress(Exception, concurrent.futures.CancelledError):
                    self.run(hook(), timeout=60)
            self._shutdown_hooks.clear()
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)
            if not self._thread.is_alive():
                self.loop.close()


_lock = threading.Lock()
_current: LoopThread | None = None


def loop_thread() -> LoopThread:
    """The process's loop thread, started on first use (and again after a fork)."""
    global _current
    with _lock:
        if _current is None or _current.pid != os.getpid() or not _current.alive:
            _current = LoopThread()
        return _current


def shutdown() -> None:
    """Close every shared pool and stop the loop thread (also runs at interpreter exit).

    Envs still open afterwards fail on their next call; new envs start a fresh loop.
    """
    global _current
    with _lock:
        current, _current = _current, None
    if current is not None and current.pid == os.getpid():
        current.stop()


# At interpreter exit concurrent.futures' thread pools stop taking work before atexit
# handlers run, and closing pools still uses them (the local backend deletes layers in
# one). threading's own exit hooks run before that, newest first: registered after
# concurrent.futures.thread's (imported above), this one runs before it.
getattr(threading, "_register_atexit", atexit.register)(shutdown)
