"""Lifecycle: create, ready, close; close is idempotent; nothing leaks afterwards."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from rollbox import Backend, Pool, RollboxError, Sandbox, StaticPoolPolicy

from rollbox_conformance.base import BackendTestBase
from rollbox_conformance.hostside import host_processes_with


class LifecycleTests(BackendTestBase):
    """A sandbox is ready when create returns, and gone without a trace after close."""

    async def test_create_returns_a_ready_sandbox(self, backend: Backend) -> None:
        sandbox = await backend.create(self.spec)
        try:
            assert sandbox.id
            assert sandbox.spec == self.spec
            result = await sandbox.exec(["true"], timeout=30)
            assert result.exit_code == 0
            assert await sandbox.ping()
        finally:
            await sandbox.close()

    async def test_sandbox_ids_are_unique(self, backend: Backend) -> None:
        sandboxes = await self.open_sandboxes(backend, 4)
        try:
            assert len({s.id for s in sandboxes}) == 4
        finally:
            await asyncio.gather(*(s.close() for s in sandboxes))

    async def test_close_is_idempotent(self, backend: Backend) -> None:
        sandbox = await backend.create(self.spec)
        await sandbox.close()
        await sandbox.close()
        await asyncio.gather(sandbox.close(), sandbox.close())

    async def test_async_with_closes(self, backend: Backend) -> None:
        async with await backend.create(self.spec) as sandbox:
            assert (await sandbox.exec(["true"], timeout=30)).ok
        await self._assert_unusable(sandbox)

    async def test_use_after_close_raises_a_rollbox_error(self, backend: Backend) -> None:
        sandbox = await backend.create(self.spec)
        await sandbox.close()
        await self._assert_unusable(sandbox)
        assert not await sandbox.ping()

    async def test_nothing_leaks_after_close(self, backend: Backend) -> None:
        before = set(await self.leak_check(backend))
        sandboxes = await self.open_sandboxes(backend, 3)
        for sandbox in sandboxes:
            await sandbox.write_file("leak-probe.txt", b"x")
            assert (await sandbox.exec(["true"], timeout=30)).ok
        await asyncio.gather(*(s.close() for s in sandboxes))
        leaked = sorted(set(await self.leak_check(backend)) - before)
        assert leaked == [], f"left behind after close: {leaked}"

    async def test_backend_aclose_closes_what_is_still_open(self, backend: Backend) -> None:
        before = set(await self.leak_check(backend))
        sandboxes = await self.open_sandboxes(backend, 2)
        await backend.aclose()
        leaked = sorted(set(await self.leak_check(backend)) - before)
        assert leaked == [], f"left behind after backend.aclose(): {leaked}"
        for sandbox in sandboxes:
            await self._assert_unusable(sandbox)

    async def test_nothing_leaks_after_pool_shutdown(self, backend: Backend) -> None:
        before = set(await self.leak_check(backend))
        async with Pool(backend, policy=StaticPoolPolicy(size=2)) as pool:
            first = await pool.acquire(self.spec)
            second = await pool.acquire(self.spec)
            assert (await first.sandbox.exec(["true"], timeout=30)).ok
            await pool.release(first)
            assert (await second.sandbox.exec(["true"], timeout=30)).ok
            # second stays leased: shutting the pool down must close it too
        leaked = sorted(set(await self.leak_check(backend)) - before)
        assert leaked == [], f"left behind after the pool shut down: {leaked}"

    async def test_no_process_outlives_close(self, backend: Backend) -> None:
        """A daemon that ignores SIGTERM and left the session must die with its sandbox."""
        self.require(backend, "shell")
        marker = f"rbx-leak-{uuid.uuid4().hex}"
        sandbox = await backend.create(self.spec)
        try:
            script = (
                f"setsid sh -c 'trap \"\" TERM HUP INT; sleep 300; :' {marker} "
                "</dev/null >/dev/null 2>&1 &\n"
                f"sh -c 'trap \"\" TERM HUP; sleep 300; :' {marker} </dev/null >/dev/null 2>&1 &\n"
                "sleep 0.3; echo started"
            )
            result = await self.sh(sandbox, script)
            assert result.text.strip() == "started", result
        finally:
            await sandbox.close()
        pids = host_processes_with(marker)
        for _ in range(int(self.timeout_slack_s * 10)):  # processes may take a moment to die
            if not pids:
                break
            await asyncio.sleep(0.1)
            pids = host_processes_with(marker)
        assert pids == [], f"processes outlived their sandbox: host pids {pids}"

    @staticmethod
    async def _assert_unusable(sandbox: Sandbox) -> None:
        with pytest.raises(RollboxError):
            await sandbox.exec(["true"], timeout=30)
        with pytest.raises(RollboxError):
            await sandbox.write_file("after-close.txt", b"x")
