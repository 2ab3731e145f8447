"""Virtual time: an asyncio loop whose clock jumps to the next timer once every task
waits, so an hour of simulated cluster passes in as long as its events take to process.

rollbox's core reads time only from the running loop (``loop.time()``,
``asyncio.sleep``), so the pool, its policies, the limiter and the runner run here
unmodified. The loop is looptime's (a maintained library), without real I/O: nothing in
a simulation may touch a socket, a thread or a subprocess (a wait on one would stall
the clock; looptime turns an idle loop into ``IdleTimeoutError`` after ``idle_s``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import looptime

T = TypeVar("T")


def run_virtual(main: Callable[[], Awaitable[T]], *, idle_s: float = 1.0) -> T:
    """Run ``main()`` to its end on a new virtual-time loop starting at 0.0 and close
    the loop. ``idle_s``: real seconds an idle loop (nothing scheduled, nothing to wait
    for) is given before its tasks fail with ``looptime.IdleTimeoutError``."""
    loop = looptime.new_event_loop(start=0.0, noop_cycles=1, idle_timeout=idle_s)
    try:
        return loop.run_until_complete(_run(main))
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


async def _run(main: Callable[[], Awaitable[T]]) -> T:
    return await main()


def now() -> float:
    """The running loop's time (virtual in a simulation)."""
    return asyncio.get_running_loop().time()
