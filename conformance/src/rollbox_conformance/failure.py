"""Failure surfacing: a sandbox killed mid-command, an image that cannot be found and a
create that fails each surface as the documented error with ``retryable`` set right,
and a pool carries on after them."""

from __future__ import annotations

import asyncio

import pytest
from rollbox import Backend, Pool, StaticPoolPolicy
from rollbox.errors import CreateFailedError, ImageNotFoundError, SandboxLostError

from rollbox_conformance.base import BackendTestBase


class FailureTests(BackendTestBase):
    """Every failure is accounted for: the right error, never a silent drop or a hang."""

    async def test_missing_image_raises_image_not_found(self, backend: Backend) -> None:
        before = set(await self.leak_check(backend))
        with pytest.raises(ImageNotFoundError) as caught:
            await backend.create(self.spec.replace(image=self.missing_image_ref))
        assert not caught.value.retryable
        assert set(await self.leak_check(backend)) - before == set()

    async def test_sandbox_killed_mid_command_is_lost(self, backend: Backend) -> None:
        sandbox = await backend.create(self.spec)
        try:
            running = asyncio.ensure_future(sandbox.exec(["sleep", "60"], timeout=60))
            await asyncio.sleep(0.5)
            assert not running.done(), "sleep 60 ended early"
            await self.kill_sandbox(backend, sandbox)
            async with self.within(self.timeout_slack_s, "an exec in a killed sandbox"):
                with pytest.raises(SandboxLostError) as caught:
                    await running
            assert caught.value.retryable
            assert caught.value.sandbox_id == sandbox.id
        finally:
            await sandbox.close()

    async def test_killed_sandbox_refuses_further_work(self, backend: Backend) -> None:
        sandbox = await backend.create(self.spec)
        try:
            await self.kill_sandbox(backend, sandbox)
            async with self.within(self.timeout_slack_s, "an exec in a killed sandbox"):
                with pytest.raises(SandboxLostError) as caught:
                    await sandbox.exec(["true"], timeout=30)
            assert caught.value.retryable
            assert not await sandbox.ping()
        finally:
            await sandbox.close()

    async def test_pool_recovers_from_a_lost_sandbox(self, backend: Backend) -> None:
        before = set(await self.leak_check(backend))
        async with Pool(backend, policy=StaticPoolPolicy(size=1)) as pool:
            lease = await pool.acquire(self.spec)
            await self.kill_sandbox(backend, lease.raw)
            with pytest.raises(SandboxLostError):
                async with self.within(self.timeout_slack_s, "an exec in a killed sandbox"):
                    await lease.sandbox.exec(["true"], timeout=30)
            # released as OK: the pool resets it, and either the reset revives it
            # cleanly or fails and the pool quarantines it; a dead one is never handed out
            await pool.release(lease)
            async with pool.lease(self.spec) as sandbox:
                assert (await sandbox.exec(["echo", "recovered"], timeout=30)).stdout == (
                    b"recovered\n"
                )
        leaked = sorted(set(await self.leak_check(backend)) - before)
        assert leaked == [], f"left behind after recovering from a lost sandbox: {leaked}"

    async def test_pool_recovers_from_a_missing_image(self, backend: Backend) -> None:
        async with Pool(backend) as pool:
            with pytest.raises(ImageNotFoundError):
                await pool.acquire(self.spec.replace(image=self.missing_image_ref))
            async with pool.lease(self.spec) as sandbox:
                assert (await sandbox.exec(["true"], timeout=30)).ok
            assert pool.metrics.failures_by_kind().get("image_not_found", 0) >= 1

    async def test_failed_create_is_retryable_and_the_pool_recovers(
        self, backend: Backend
    ) -> None:
        await self.inject_create_failure(backend)
        async with Pool(backend) as pool:
            with pytest.raises(CreateFailedError) as caught:
                await pool.acquire(self.spec)
            assert caught.value.retryable
            async with pool.lease(self.spec) as sandbox:
                assert (await sandbox.exec(["true"], timeout=30)).ok
