"""AdaptiveRate against scripted servers, in virtual time: it backs off on 429s and on
a server that starts queueing, and costs nothing where the server has room."""

from __future__ import annotations

import asyncio

from rollbox.ratelimit import AdaptiveRate, TokenBucket
from rollbox_sim import run_virtual
from rollbox_sim.clock import now


class Server:
    """Serves ``qps`` requests a second, one at a time in arrival order; with
    ``seats``, a request arriving while that many wait is refused (429, Retry-After 1)."""

    def __init__(self, qps: float, seats: int | None = None) -> None:
        self.qps = qps
        self.seats = seats
        self.waiting = 0
        self.most_waiting = 0
        self.refused = 0
        self._free_at = 0.0

    async def request(self) -> float | None:
        """The latency, or None for a 429."""
        if self.seats is not None and self.waiting >= self.seats:
            self.refused += 1
            return None
        started = now()
        self.waiting += 1
        self.most_waiting = max(self.most_waiting, self.waiting)
        self._free_at = max(self._free_at, started) + 1 / self.qps
        await asyncio.sleep(self._free_at - started)
        self.waiting -= 1
        return now() - started


async def drive(server: Server, limiter: TokenBucket, requests: int) -> float:
    """``requests`` callers at once, each retrying after a 429; the time it took."""
    async def one() -> None:
        while True:
            await limiter.acquire()
            latency = await server.request()
            if isinstance(limiter, AdaptiveRate):
                if latency is None:
                    limiter.throttled(1.0)
                else:
                    limiter.answered(latency)
            if latency is not None:
                return
            await asyncio.sleep(1.0)

    started = now()
    await asyncio.gather(*(one() for _ in range(requests)))
    return now() - started


def test_an_idle_server_gets_the_cap_at_once() -> None:
    async def main() -> tuple[float, float]:
        limiter = AdaptiveRate(50.0, burst=1)
        took = await drive(Server(qps=1000.0), limiter, 200)
        return took, limiter.rate

    took, rate = run_virtual(main)
    assert 3.5 < took < 4.5  # 200 at 50/s: paced by the cap only
    assert rate == 50.0


def test_a_429_storm_is_backed_off_from_and_every_request_gets_through() -> None:
    async def main() -> tuple[Server, Server, float]:
        adaptive, fixed = Server(qps=10.0, seats=5), Server(qps=10.0, seats=5)
        limiter = AdaptiveRate(100.0, burst=10, floor=1.0)
        await drive(adaptive, limiter, 300)
        await drive(fixed, TokenBucket(100.0, 10), 300)
        return adaptive, fixed, limiter.rate

    adaptive, fixed, rate = run_virtual(main)
    assert adaptive.refused < fixed.refused / 3, (adaptive.refused, fixed.refused)
    assert rate < 40  # it came down toward what the server takes


def test_a_server_that_starts_queueing_is_backed_off_before_it_refuses() -> None:
    async def main() -> tuple[int, int]:
        adaptive, fixed = Server(qps=20.0), Server(qps=20.0)
        await drive(adaptive, AdaptiveRate(200.0, burst=1, slow_factor=3.0,
                                           slow_margin_s=0.1), 400)
        await drive(fixed, TokenBucket(200.0, 1), 400)
        return adaptive.most_waiting, fixed.most_waiting

    adaptive, fixed = run_virtual(main)
    assert adaptive < fixed / 3, (adaptive, fixed)


def test_the_rate_climbs_back_once_the_server_has_room_again() -> None:
    async def main() -> tuple[float, float]:
        limiter = AdaptiveRate(100.0, burst=1, floor=1.0, step=20.0)
        limiter.throttled(0.0)
        limiter.throttled(0.0)  # the same burst's refusals: one cut
        await asyncio.sleep(limiter.cooldown_s)
        limiter.throttled(0.0)  # a later one: another
        low = limiter.rate
        # quickly up to near the rate last refused, then probing past it slowly: after
        # 30 s without a refusal the old ceiling is forgotten
        await drive(Server(qps=10_000.0), limiter, 3000)
        return low, limiter.rate

    low, high = run_virtual(main)
    assert low == 25.0 and high == 100.0
