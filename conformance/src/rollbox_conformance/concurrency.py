"""Concurrency: many execs on one sandbox and across sandboxes, concurrent creates and
file operations, and a slow command that does not hold up a fast one."""

from __future__ import annotations

import asyncio

from rollbox import Backend, Sandbox

from rollbox_conformance.base import BackendTestBase


class ConcurrencyTests(BackendTestBase):
    """A rollout fires commands concurrently; every one gets its own, right answer."""

    async def test_100_concurrent_execs_on_one_sandbox(self, sandbox: Sandbox) -> None:
        async with self.within(60 + self.timeout_slack_s, "100 concurrent execs"):
            results = await asyncio.gather(
                *(sandbox.exec(["echo", f"n{i}"], timeout=60) for i in range(100))
            )
        assert [r.stdout for r in results] == [f"n{i}\n".encode() for i in range(100)]
        assert all(r.exit_code == 0 for r in results)

    async def test_100_concurrent_execs_across_sandboxes(self, backend: Backend) -> None:
        sandboxes = await self.open_sandboxes(backend, 5)
        try:
            async with self.within(60 + self.timeout_slack_s, "100 execs on 5 sandboxes"):
                results = await asyncio.gather(*(
                    sandboxes[i % 5].exec(["echo", f"{sandboxes[i % 5].id}:{i}"], timeout=60)
                    for i in range(100)
                ))
            expected = [f"{sandboxes[i % 5].id}:{i}\n".encode() for i in range(100)]
            assert [r.stdout for r in results] == expected
        finally:
            await asyncio.gather(*(s.close() for s in sandboxes))

    async def test_concurrent_stdin_is_not_mixed_up(self, sandbox: Sandbox) -> None:
        payloads = [bytes([i]) * (1000 + i) for i in range(50)]
        results = await asyncio.gather(
            *(sandbox.exec(["cat"], stdin=p, timeout=60) for p in payloads)
        )
        assert [r.stdout for r in results] == payloads

    async def test_concurrent_creates_and_closes(self, backend: Backend) -> None:
        before = set(await self.leak_check(backend))
        sandboxes = await self.open_sandboxes(backend, 8)
        assert len({s.id for s in sandboxes}) == 8
        results = await asyncio.gather(*(s.exec(["true"], timeout=60) for s in sandboxes))
        assert all(r.ok for r in results)
        await asyncio.gather(*(s.close() for s in sandboxes))
        leaked = sorted(set(await self.leak_check(backend)) - before)
        assert leaked == [], f"left behind after concurrent closes: {leaked}"

    async def test_concurrent_file_writes(self, sandbox: Sandbox) -> None:
        files = {f"/tmp/rbx-conc/{i}.bin": bytes([i % 256]) * (i * 97 + 1) for i in range(50)}
        await asyncio.gather(*(sandbox.write_file(p, d) for p, d in files.items()))
        back = await asyncio.gather(*(sandbox.read_file(p) for p in files))
        assert back == list(files.values())

    async def test_slow_command_does_not_block_a_fast_one(self, sandbox: Sandbox) -> None:
        slow = asyncio.ensure_future(sandbox.exec(["sleep", "3"], timeout=30))
        try:
            await asyncio.sleep(0.1)
            async with self.within(2.5, "a fast exec beside a slow one"):
                fast = await sandbox.exec(["echo", "fast"], timeout=30)
            assert fast.stdout == b"fast\n"
            assert not slow.done()
        finally:
            slow.cancel()
            await asyncio.gather(slow, return_exceptions=True)
