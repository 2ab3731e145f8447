"""Lifecycle: create, ready, close; close is idempotent; nothing leaks afterwards, not
even when the process owning the sandboxes is killed."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rollbox import Backend, Pool, RollboxError, Sandbox, StaticPoolPolicy

from rollbox_conformance.base import BackendTestBase
from rollbox_conformance.hostside import host_processes_with
from rollbox_conformance.owner import Owner, named_paths


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

    async def test_a_cancelled_close_still_leaves_nothing(self, backend: Backend) -> None:
        """A caller cancelled mid-close (a timeout around it, a task group unwinding) must
        not leave the sandbox's resources behind a sandbox that counts as closed."""
        before = set(await self.leak_check(backend))
        sandbox = await backend.create(self.spec)
        assert (await sandbox.exec(["true"], timeout=30)).ok
        closing = asyncio.ensure_future(sandbox.close())
        await asyncio.sleep(0)  # it has begun
        closing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await closing
        await sandbox.close()  # waits for what the first close began, if anything
        leaked = sorted(set(await self.leak_check(backend)) - before)
        assert leaked == [], f"left behind after a cancelled close: {leaked}"

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
        pids = await self._wait_gone(marker)
        assert pids == [], f"processes outlived their sandbox: host pids {pids}"

    @pytest.fixture
    def owner_home(self) -> Iterator[Path]:
        """A directory for the owner's program and, in ``state/``, its backend's state;
        world-searchable (a sandbox user, e.g. uid 200000 under root, must reach it)."""
        home = Path(tempfile.mkdtemp(prefix="rbx-owner-"))
        try:
            home.chmod(0o711)
            (home / "state").mkdir(mode=0o711)
            yield home
        finally:
            shutil.rmtree(home, ignore_errors=True)

    async def test_nothing_outlives_a_killed_owner(self, owner_home: Path) -> None:
        """The process owning a busy sandbox, an idle one and a snapshot is killed
        (SIGKILL): none of their processes survives, and once a fresh backend has
        started, it holds nothing and nothing the owner named as its own is left."""
        script = self.owner_script(owner_home / "state")
        marker = f"rbx-owned-{uuid.uuid4().hex}"
        owner = Owner(script, marker, self.spec, owner_home)
        try:
            try:
                report = await owner.start(timeout=2 * self.spec.timeouts.create_s)
            finally:
                owner.kill()
                await owner.wait()
            survivors = await self._wait_gone(marker)
            names: dict[str, Any] = {}
            exec(script, names)  # the backend's own hook, as the owner ran it
            fresh: Backend = names["make_backend"]()
            try:
                leftovers = await self.leak_check(fresh)
            finally:
                await fresh.aclose()
            remaining = await asyncio.to_thread(
                lambda: [p for p in named_paths(report) if os.path.lexists(p)])
        finally:
            for pid in host_processes_with(marker):  # a failing backend's, not to keep
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        assert survivors == [], f"processes outlived their killed owner: host pids {survivors}"
        assert leftovers == [], f"a fresh backend still holds: {leftovers}"
        assert remaining == [], f"left behind by the killed owner: {remaining}"

    async def _wait_gone(self, marker: str) -> list[int]:
        """Host processes with ``marker`` in their command line, once those dying have
        had ``timeout_slack_s`` to go."""
        pids = host_processes_with(marker)
        for _ in range(int(self.timeout_slack_s * 10)):
            if not pids:
                break
            await asyncio.sleep(0.1)
            pids = host_processes_with(marker)
        return pids

    @staticmethod
    async def _assert_unusable(sandbox: Sandbox) -> None:
        with pytest.raises(RollboxError):
            await sandbox.exec(["true"], timeout=30)
        with pytest.raises(RollboxError):
            await sandbox.write_file("after-close.txt", b"x")
