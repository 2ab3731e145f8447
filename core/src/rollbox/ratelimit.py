"""Pacing for control-plane operations: token buckets on the event loop's clock.

``TokenBucket`` holds a fixed rate; ``AdaptiveRate`` starts fast and follows what the
server says (AIMD: it halves on a 429, cuts in proportion on a latency well above the
server's best, and climbs back by a fixed step per second while requests go through),
never above its cap.

Waiters queue in two classes, urgent first, FIFO within each, and are woken by one
timer set for when the next token is due: no polling, so a wait costs nothing while it
waits, and the same limiter paces real creates and simulated ones in virtual time
(time comes only from the running loop).
"""

from __future__ import annotations

import asyncio
from collections import deque

_EPSILON = 1e-9
"""Float slack on a token: a refill that should make one whole may fall short by this."""
_MIN_STEP_S = 1e-6
"""The shortest wait for a token: a loop's clock (a virtual one especially) may not
move by less, and a timer due "now" would find the bucket as it left it."""


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
        self._urgent: deque[asyncio.Future[None]] = deque()
        self._normal: deque[asyncio.Future[None]] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self.waited_s = 0.0
        """Seconds callers spent waiting here, summed."""

    async def acquire(self, *, urgent: bool = False) -> None:
        """Wait for one token, first come first served within each class: an ``urgent``
        caller (someone is waiting for what it does, e.g. an acquire that found no warm
        sandbox) goes before every other, whose work is speculative and can wait."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        self._refill(now)
        if (not self._urgent and (urgent or not self._normal) and now >= self._paused_until
                and self._tokens >= 1 - _EPSILON):
            self._tokens -= 1
            return
        waiter: asyncio.Future[None] = loop.create_future()
        (self._urgent if urgent else self._normal).append(waiter)
        self._schedule(loop)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._tokens += 1  # granted as it was cancelled: give the token back
                self._schedule(loop)
            raise
        finally:
            self.waited_s += loop.time() - now

    def pause(self, seconds: float) -> None:
        """Hold every caller for ``seconds`` from now (e.g. an HTTP 429 Retry-After)."""
        loop = asyncio.get_running_loop()
        self._paused_until = max(self._paused_until, loop.time() + seconds)
        self._schedule(loop, rearm=True)

    def throttled(self, retry_after_s: float) -> None:
        """The server refused a request for load: hold every caller for ``Retry-After``
        (an ``AdaptiveRate`` also slows down)."""
        self.pause(retry_after_s)

    def answered(self, latency_s: float) -> None:
        """A request went through in ``latency_s``: a fixed rate does not change (an
        ``AdaptiveRate`` follows it)."""

    def set_rate(self, rate: float) -> None:
        """Change the rate from now on (tokens already earned are kept)."""
        loop = asyncio.get_running_loop()
        self._refill(loop.time())
        self.rate = rate
        self._schedule(loop, rearm=True)

    def _refill(self, now: float) -> None:
        if self._stamp is None:
            self._stamp = now
        if now > self._stamp:
            self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
            self._stamp = now

    def _schedule(self, loop: asyncio.AbstractEventLoop, *, rearm: bool = False) -> None:
        """Grant what can be granted now; set the timer for the next token if anyone
        still waits."""
        if rearm and self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._timer is not None:
            return
        now = loop.time()
        self._refill(now)
        while now >= self._paused_until and self._tokens >= 1 - _EPSILON:
            waiter = self._next_waiter()
            if waiter is None:
                return
            self._tokens -= 1
            waiter.set_result(None)
        if not (self._urgent or self._normal):
            return
        due = max(self._paused_until, now + max((1 - self._tokens) / self.rate, _MIN_STEP_S))
        self._timer = loop.call_at(due, self._wake)

    def _wake(self) -> None:
        self._timer = None
        self._schedule(asyncio.get_running_loop())

    def _next_waiter(self) -> asyncio.Future[None] | None:
        for queue in (self._urgent, self._normal):
            while queue:
                waiter = queue.popleft()
                if not waiter.done():
                    return waiter
        return None


class AdaptiveRate(TokenBucket):
    """A token bucket whose rate follows the server (AIMD), within ``[floor, cap]``.

    It starts at ``start`` (default: the cap). ``throttled(retry_after)`` (a 429, an
    APF rejection) halves the rate and pauses everyone for ``retry_after``;
    ``answered(latency_s)`` after each request that went through raises the rate by
    ``step`` per second of such answers, or, when the latency is over ``slow_factor``
    times the fastest answer seen lately and ``slow_margin_s`` above it (the server has
    started to queue), cuts it in proportion, by half at most, at most once per
    ``cooldown_s``: a server is backed off from before it refuses. The fixed ``cap`` is
    what a ``TokenBucket`` would hold.
    """

    def __init__(self, cap: float, burst: int = 1, *, start: float | None = None,
                 floor: float = 1.0, step: float = 10.0, slow_factor: float = 4.0,
                 slow_margin_s: float = 0.5, cooldown_s: float = 0.25) -> None:
        if floor <= 0 or cap < floor:
            raise ValueError("AdaptiveRate needs 0 < floor <= cap")
        super().__init__(min(cap, max(floor, start if start is not None else cap)), burst)
        self.cap = cap
        self.floor = floor
        self.step = step
        self.slow_factor = slow_factor
        self.slow_margin_s = slow_margin_s
        self.cooldown_s = cooldown_s
        self.fastest_s: float | None = None
        self._fastest_at = 0.0
        self._last_cut = -1e9
        self._last_answer: float | None = None
        self._ceiling: float | None = None  # the rate of the last cut
        self.cuts = 0
        """How many times the rate was cut (a 429, or a slow answer)."""

    def throttled(self, retry_after_s: float) -> None:
        """The server refused a request for load: halve the rate (once for the refusals
        of one moment: those of one burst come together) and pause for ``Retry-After``."""
        self._cut(0.5)
        self.pause(retry_after_s)

    def answered(self, latency_s: float) -> None:
        """A request went through in ``latency_s``."""
        now = asyncio.get_running_loop().time()
        if self.fastest_s is None or latency_s <= self.fastest_s or (
                now - self._fastest_at > 30.0):  # forget a best that is long gone
            self.fastest_s, self._fastest_at = latency_s, now
        slow = max(self.fastest_s * self.slow_factor, self.fastest_s + self.slow_margin_s)
        if latency_s > slow:
            self._cut(max(0.5, slow / latency_s))
            return
        since = 0.0 if self._last_answer is None else min(now - self._last_answer, 1.0)
        self._last_answer = now
        if self.rate < self.cap and since > 0:
            # Near the rate the server last refused, probe a tenth as fast (a ceiling
            # forgotten after 30 s without a cut).
            near = (self._ceiling is not None and now - self._last_cut < 30.0
                    and self.rate >= 0.8 * self._ceiling)
            step = self.step / 10 if near else self.step
            self.set_rate(min(self.cap, self.rate + step * since))

    def _cut(self, factor: float) -> None:
        now = asyncio.get_running_loop().time()
        if now - self._last_cut < self.cooldown_s:
            return
        self._last_cut = now
        self._ceiling = self.rate
        self._last_answer = None  # climb again from the next answer on, not from before
        self.cuts += 1
        self.set_rate(max(self.floor, self.rate * factor))
