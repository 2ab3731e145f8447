"""The virtual clock and the simulated cluster's parts: the API server, a node's image
filesystem (pulls, bandwidth, GC), and the sim backend's errors."""

from __future__ import annotations

import asyncio
import time

import pytest
from rollbox.errors import ImageError
from rollbox.spec import SandboxSpec
from rollbox_sim import ClusterModel, SimBackend, run_virtual
from rollbox_sim.clock import now
from rollbox_sim.cluster import ApiServer, Node, Throttled

GB = 10**9


def test_an_hour_of_virtual_time_passes_at_once() -> None:
    async def main() -> float:
        await asyncio.gather(*(asyncio.sleep(s) for s in (1.0, 60.0, 3600.0)))
        return now()

    started = time.monotonic()
    assert run_virtual(main) == pytest.approx(3600.0)
    assert time.monotonic() - started < 5.0


def test_the_api_server_admits_its_rate_and_refuses_the_rest() -> None:
    async def main() -> tuple[int, int]:
        api = ApiServer(ClusterModel(api_qps=10.0, api_burst=5))
        admitted = refused = 0
        for _ in range(50):  # 50 writes in one second
            try:
                api.write("create")
                admitted += 1
            except Throttled as throttled:
                assert throttled.retry_after_s == 1.0
                refused += 1
            await asyncio.sleep(0.02)
        return admitted, refused

    admitted, refused = run_virtual(main)
    assert admitted <= 5 + 10 + 1 and admitted + refused == 50


def _node(**model: float) -> Node:
    node = Node.of("node-0", ClusterModel(**model))  # type: ignore[arg-type]
    node.start()
    return node


def test_pulls_take_size_over_bandwidth_one_after_another() -> None:
    async def main() -> list[float]:
        node = _node(pull_mbps=800.0, disk_gb=100.0)  # 100 MB/s
        done: list[float] = []

        async def pull(image: str) -> None:
            assert await node.image(image, 2 * GB)
            done.append(now())

        await asyncio.gather(pull("a"), pull("b"))
        assert not await node.image("a", 2 * GB)  # there already: no pull
        node.stop()
        return done

    assert run_virtual(main) == pytest.approx([20.0, 40.0])


def test_gc_frees_down_to_the_low_threshold_and_never_an_image_in_use() -> None:
    async def main() -> Node:
        node = _node(disk_gb=10.0, gc_high=0.85, gc_low=0.6)
        for image in ("a", "b", "c", "d"):
            await node.image(image, 2 * GB)  # 8 GB: under 8.5
        node.in_use["a"] += 1  # a sandbox runs on the oldest
        await node.image("e", 2 * GB)  # 10 GB would pass 8.5: GC down to 6 first
        node.stop()
        return node

    node = run_virtual(main)
    assert "a" in node.images and "e" in node.images
    assert node.used <= 10 * GB * 0.85
    assert node.stats["evictions"] == 2  # b, c: the least recently used unused ones


def test_an_image_larger_than_every_disk_is_an_image_error_at_create() -> None:
    async def main() -> None:
        backend = SimBackend(ClusterModel(nodes=2, disk_gb=2.0), image_sizes={"huge": 3 * GB})
        with pytest.raises(ImageError, match="larger than"):
            await backend.create(SandboxSpec(image="huge"))
        assert all(n.running == 0 and not n.in_use for n in backend.cluster.nodes)
        await backend.aclose()

    run_virtual(main)


def test_a_create_waits_for_a_free_slot() -> None:
    async def main() -> tuple[float, int]:
        backend = SimBackend(ClusterModel(nodes=1, slots_per_node=1))
        first = await backend.create(SandboxSpec(image="x"))
        later = asyncio.ensure_future(backend.create(SandboxSpec(image="x")))
        await asyncio.sleep(30)
        assert not later.done()
        await first.close()
        second = await later
        await second.close()
        await backend.aclose()
        return now(), backend.slot_waits

    ended, waits = run_virtual(main)
    assert ended > 30 and waits >= 1
