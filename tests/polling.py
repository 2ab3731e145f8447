"""Waiting in tests for something that has no event to await."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def until(check: Callable[[], object], timeout: float = 20.0) -> None:
    """Poll ``check`` until it is true (an emulated controller, a watch's effect); fails
    with TimeoutError after ``timeout`` seconds."""
    async with asyncio.timeout(timeout):
        while True:
            if check():
                return
            await asyncio.sleep(0.02)
