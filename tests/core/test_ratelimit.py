"""The create limiter: paced, and what someone waits for goes before speculative work."""

from __future__ import annotations

import asyncio

from rollbox.ratelimit import TokenBucket


async def test_pacing_holds_the_rate() -> None:
    bucket = TokenBucket(rate=20, burst=1)
    loop = asyncio.get_running_loop()
    started = loop.time()
    for _ in range(4):
        await bucket.acquire()
    assert loop.time() - started >= 3 / 20 * 0.9  # the first is free, then one per 50 ms


async def test_an_urgent_caller_goes_before_queued_speculative_ones() -> None:
    bucket = TokenBucket(rate=20, burst=1)
    await bucket.acquire()  # the bucket is empty now: everyone below queues
    order: list[str] = []

    async def take(name: str, urgent: bool) -> None:
        await bucket.acquire(urgent=urgent)
        order.append(name)

    fills = [asyncio.ensure_future(take(f"fill{i}", False)) for i in range(4)]
    await asyncio.sleep(0)  # the fills are queued first
    demand = asyncio.ensure_future(take("acquire", True))
    await asyncio.gather(demand, *fills)
    assert order[0] == "acquire", order
    assert order[1:] == ["fill0", "fill1", "fill2", "fill3"]  # FIFO among the rest


async def test_pause_holds_urgent_callers_too() -> None:
    bucket = TokenBucket(rate=1000, burst=5)
    loop = asyncio.get_running_loop()
    bucket.pause(0.2)
    started = loop.time()
    await bucket.acquire(urgent=True)
    assert loop.time() - started >= 0.19
