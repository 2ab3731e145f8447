"""Pacing for control-plane operations: a token bucket on the event loop's clock.

Reads time only from the running loop, so the same limiter paces real creates and
simulated ones in virtual time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

_YIELD_S = 0.001


class TokenBucket:
    """At most ``rate`` operations per second on average, ``burst`` at once.

    ``pause(seconds)`` stops everyone for a while, which is how a server's
    ``Retry-After`` is honoured by the whole process rather than by one caller.
    """

    def __init__(self, rate: float, burst: int = 1) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("TokenBucket needs rate > 0 and burst >= 1")
        self.rate = rate
        self.burst = burst
        self._tokens = float(burst)
        self._stamp: float | None = None
        self._paused_until = 0.0
        self._lock = asyncio.Lock()
        self._urgent_lock = asyncio.Lock()
        self._urgent = 0
        self.waited_s = 0.0

    def _refill(self, now: float) -> None:
        if self._stamp is None:
            self._stamp = now
        self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now

    async def acquire(self, *, urgent: bool = False) -> None:
        """Wait for one token, first come first served within each class: an ``urgent``
        caller (someone is waiting for what it does, e.g. an acquire that found no warm
        sandbox) goes before every other, whose work is speculative and can wait."""
        if not urgent:
            async with self._lock:
                await self._take(lambda: self._urgent == 0)
            return
        self._urgent += 1
        try:
            async with self._urgent_lock:
                await self._take(lambda: True)
        finally:
            self._urgent -= 1

    async def _take(self, allowed: Callable[[], bool]) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        while True:
            now = loop.time()
            if now < self._paused_until:
                await asyncio.sleep(self._paused_until - now)
                continue
            self._refill(now)
            if self._tokens >= 1 and allowed():
                self._tokens -= 1
                self.waited_s += loop.time() - start
                return
            # Short of a token: sleep until one is due. Yielding to urgent callers: look
            # again soon (they take the tokens as they come).
            await asyncio.sleep((1 - self._tokens) / self.rate if self._tokens < 1
                                else _YIELD_S)

    def pause(self, seconds: float) -> None:
        """Hold every caller for ``seconds`` from now (e.g. an HTTP 429 Retry-After)."""
        loop = asyncio.get_running_loop()
        self._paused_until = max(self._paused_until, loop.time() + seconds)
