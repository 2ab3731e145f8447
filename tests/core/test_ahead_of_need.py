"""Creates a pool's filler makes are marked ahead of need; ones an acquirer waits for
are not (backends may run the former at low priority)."""

from __future__ import annotations

import asyncio

from rollbox import Pool, SandboxSpec, StaticPoolPolicy
from rollbox.backend import ahead_of_need
from rollbox.sandbox import Sandbox
from rollbox.testing import FakeBackend


class RecordingBackend(FakeBackend):
    def __init__(self) -> None:
        super().__init__()
        self.marks: list[bool] = []

    async def create(self, spec: SandboxSpec) -> Sandbox:
        self.marks.append(ahead_of_need())
        return await super().create(spec)


async def test_the_filler_creates_ahead_of_need_an_acquire_does_not() -> None:
    backend = RecordingBackend()
    spec = SandboxSpec()
    async with Pool(backend) as pool, pool.lease(spec):  # no warm target: acquire creates
        pass
    assert backend.marks == [False]

    backend = RecordingBackend()
    # The first create is awaited by the acquire; the filler then adds the second.
    async with Pool(backend, policy=StaticPoolPolicy(size=2)) as pool, pool.lease(spec):
        while len(backend.marks) < 2:  # noqa: ASYNC110
            await asyncio.sleep(0.001)
    assert backend.marks[0] is False and backend.marks[1] is True
    assert ahead_of_need() is False
