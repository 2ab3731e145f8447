"""Concurrency: many execs on one sandbox and across sandboxes, concurrent creates and
file operations, a slow command that does not hold up a fast one, and a storm of
timeouts that takes no sandbox down."""

from __future__ import annotations

import asyncio
import contextlib
import random

from rollbox import Backend, Sandbox
from rollbox.errors import ExecTimeoutError

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
        # Named, not compared as lists: pytest's diff of 50 payloads of ~1 KB takes a minute.
        wrong = [i for i, (r, p) in enumerate(zip(results, payloads, strict=True))
                 if r.stdout != p]
        assert not wrong, (f"{len(wrong)} of {len(payloads)} commands got another's stdin "
                           f"back (commands {wrong[:5]} ...)")

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


    async def test_a_storm_of_concurrent_timeouts_loses_no_sandbox(
        self, backend: Backend
    ) -> None:
        """Commands killed at their timeout while others of the same sandbox start, end
        and time out: every sandbox still answers afterwards."""
        rng = random.Random(11)
        if backend.capabilities.shell:
            commands: list[str | list[str]] = [
                "sleep 2", "sh -c 'sleep 2 & sleep 2'", "true", "echo storm",
                "(setsid sleep 3 </dev/null >/dev/null 2>&1 &); sleep 1"]
        else:
            commands = [["sleep", "2"], ["sleep", "0.2"], ["true"], ["echo", "storm"]]
        sandboxes = await self.open_sandboxes(backend, 10)
        try:
            async def one(sandbox: Sandbox) -> None:
                timeout = rng.choice([0.001, 0.01, 0.05, 0.2, 1.0])
                with contextlib.suppress(ExecTimeoutError):
                    await sandbox.exec(rng.choice(commands), timeout=timeout)

            async with self.within(60 + self.timeout_slack_s, "a storm of timeouts"):
                storm = await asyncio.gather(*(one(s) for s in sandboxes for _ in range(5)),
                                             return_exceptions=True)
                answers = await asyncio.gather(
                    *(s.exec(["echo", "alive"], timeout=30) for s in sandboxes),
                    return_exceptions=True)
            errors = [r for r in storm if r is not None]
            assert errors == [], f"the storm itself failed: {errors[:3]}"
            lost = [(s.id, a) for s, a in zip(sandboxes, answers, strict=True)
                    if getattr(a, "stdout", None) != b"alive\n"]
            assert lost == [], f"{len(lost)} of {len(sandboxes)} sandboxes do not answer: {lost}"
        finally:
            await asyncio.gather(*(s.close() for s in sandboxes))
