"""Shared pools that outlive their users by ``keep_warm_s``, policies made with options,
and the bridge awaited from another event loop."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from rollbox.envs.bridge import loop_thread
from rollbox.envs.pools import pool_kwargs, registry
from rollbox.errors import UsageError
from rollbox.pool import StaticPoolPolicy
from rollbox.testing import FakeBackend


def test_a_pool_left_by_its_last_user_stays_warm_for_keep_warm_s() -> None:
    backend = FakeBackend()
    thread, pools = registry()
    first = thread.run(pools.attach(backend, {}, {}))
    thread.run(pools.detach(first, keep_warm_s=30))
    assert not first.closed and pools.open() == [first]
    again = thread.run(pools.attach(backend, {}, {}))  # within keep_warm_s: the same pool
    assert again is first and first.expiry is None
    thread.run(pools.detach(again, keep_warm_s=0.2))
    deadline = time.monotonic() + 10
    while not first.closed and time.monotonic() < deadline:
        time.sleep(0.05)
    assert first.closed and pools.open() == []


def test_equal_options_share_a_pool_whatever_their_order() -> None:
    backend = FakeBackend()
    thread, pools = registry()
    one = thread.run(pools.attach(backend, {}, {"policy": "static",
                                                "policy_options": {"size": 2}}))
    two = thread.run(pools.attach(backend, {}, {"policy_options": {"size": 2},
                                                "policy": "static"}))
    assert one is two
    thread.run(pools.detach(one))
    thread.run(pools.detach(two))
    assert one.closed


def test_a_policy_is_made_by_name_with_its_options() -> None:
    made = pool_kwargs({"policy": "static", "policy_options": {"size": 3}, "create_rate": 5})
    assert isinstance(made["policy"], StaticPoolPolicy) and made["policy"].size == 3
    assert made["create_rate"] == 5


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"sizee": 1}, "unknown pool_options sizee"),
        ({"policy": "nope"}, "no pool policy named 'nope'"),
        ({"policy": "static", "policy_options": {"bad": 1}}, "does not take"),
        ({"policy_options": {"size": 1}}, "apply to a policy given by name"),
        ({"policy": 3}, "must be a policy name or a PoolPolicy"),
    ],
)
def test_bad_pool_options_say_what_is_wrong(options: dict[str, object], says: str) -> None:
    with pytest.raises(UsageError, match=says):
        pool_kwargs(options)


async def test_the_bridge_is_awaited_from_another_loop() -> None:
    thread = loop_thread()

    async def where() -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    assert await thread.call(where()) is thread.loop
    cancelled = threading.Event()

    async def wait_forever() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()

    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.1):
            await thread.call(wait_forever())
    # cancelling the caller cancelled the work on the bridge's loop
    assert await asyncio.to_thread(cancelled.wait, 10)
