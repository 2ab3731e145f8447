"""A node's image filesystem (rollbox.imagedisk), in virtual time: pulls take their
size over the bandwidth one after another, GC keeps the disk under its threshold and
never removes an image in use, an image no disk holds is refused at once."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import looptime
import pytest
from rollbox.errors import ImageError
from rollbox.imagedisk import ImageDisk

T = TypeVar("T")
GB = 1_000_000_000


def virtual(main: Callable[[], Awaitable[T]]) -> T:
    loop = looptime.new_event_loop(start=0.0, noop_cycles=1, idle_timeout=1.0)
    try:
        return loop.run_until_complete(main())  # type: ignore[arg-type]
    finally:
        loop.close()


def disk(**options: object) -> ImageDisk:
    settings: dict[str, object] = {"capacity": 10 * GB, "pull_bytes_per_s": 1 * GB}
    return ImageDisk("n0", **{**settings, **options})  # type: ignore[arg-type]


def test_pulls_are_serialized_and_an_image_is_pulled_once() -> None:
    async def main() -> tuple[list[float], dict[str, int]]:
        node = disk()
        node.start()
        loop = asyncio.get_running_loop()
        done: list[float] = []

        async def want(image: str, size: int) -> None:
            await node.image(image, size)
            done.append(loop.time())

        await asyncio.gather(want("a", 2 * GB), want("b", 3 * GB), want("a", 2 * GB))
        assert await node.image("a", 2 * GB) is False  # present: no pull
        node.stop()
        return done, dict(node.stats)

    done, stats = virtual(main)
    assert done == [2.0, 2.0, 5.0]  # b waited for a's pull: one puller
    assert stats["pulls"] == 2 and stats["critical_path_pulls"] == 2
    assert stats["bytes_pulled"] == 5 * GB


def test_parallel_pullers_share_the_bandwidth_and_time_scales() -> None:
    async def main() -> float:
        node = disk(parallel_pulls=2, time_scale=0.5)
        node.start()
        await asyncio.gather(node.image("a", 2 * GB), node.image("b", 2 * GB))
        node.stop()
        return asyncio.get_running_loop().time()

    # each puller has half of 1 GB/s: 4 modelled seconds, 2 at half time
    assert virtual(main) == 2.0


def test_gc_keeps_images_in_use_and_the_disk_under_its_threshold() -> None:
    async def main() -> ImageDisk:
        node = disk()
        node.start()
        high = node.capacity * node.gc_high
        peaks: list[int] = []
        node.on_change = lambda: peaks.append(node.used)
        node.hold("busy")
        await node.image("busy", 4 * GB)
        for name in ("old", "newer"):
            await node.image(name, 2 * GB)
        await node.image("next", 3 * GB)  # 11 GB wanted: GC down to the low mark, 8
        assert max(peaks) <= high and node.used <= high
        node.stop()
        return node

    node = virtual(main)
    # old went first, then newer (4 + 2 + 3 is still past 8); busy is in use
    assert list(node.images) == ["busy", "next"]
    assert node.stats["evictions"] == 2


def test_a_pull_waits_while_images_in_use_fill_the_disk() -> None:
    async def main() -> float:
        node = disk()
        node.start()
        for name in ("a", "b"):
            node.hold(name)
            await node.image(name, 4 * GB)
        loop = asyncio.get_running_loop()
        loop.call_later(10.0, node.release, "a")  # at 18
        await node.image("c", 4 * GB)  # 12 GB > 8.5: waits for a's release, then GC
        node.stop()
        assert "a" not in node.images and node.stats["disk_waits"] > 0
        return loop.time()

    # a's release at 18 is seen within a second, then c's 4 s
    assert 22.0 <= virtual(main) <= 23.0


def test_an_image_no_disk_holds_is_refused_at_once() -> None:
    async def main() -> None:
        node = disk()
        node.start()
        with pytest.raises(ImageError, match="larger than node n0's image disk"):
            await node.image("huge", 9 * GB)  # over 85 % of 10 GB
        assert asyncio.get_running_loop().time() == 0.0
        node.stop()

    virtual(main)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="gc_low <= gc_high"):
        disk(gc_low=0.9, gc_high=0.8)
    with pytest.raises(ValueError, match="time_scale > 0"):
        disk(time_scale=0)
