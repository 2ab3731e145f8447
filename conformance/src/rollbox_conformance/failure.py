"""Failure surfacing: a sandbox killed mid-command, an image that cannot be found and a
create that fails each surface as the documented error with ``retryable`` set right,
and a pool carries on after them; a caller's malformed command is a usage error that
leaves the sandbox working."""

from __future__ import annotations

import asyncio

import pytest
from rollbox import Backend, Pool, Sandbox, StaticPoolPolicy
from rollbox.errors import (
    CreateFailedError,
    ImageNotFoundError,
    InvalidCommandError,
    SandboxLostError,
)

from rollbox_conformance.base import BackendTestBase


class FailureTests(BackendTestBase):
    """Every failure is accounted for: the right error, never a silent drop or a hang."""

    async def test_missing_image_raises_image_not_found(self, backend: Backend) -> None:
        before = set(await self.leak_check(backend))
        with pytest.raises(ImageNotFoundError) as caught:
            await backend.create(self.spec.replace(image=self.missing_image_ref))
        assert not caught.value.retryable
        assert set(await self.leak_check(backend)) - before == set()

    @pytest.mark.parametrize("mistake", [
        pytest.param({"command": "echo a\0b"}, id="nul-in-shell-string"),
        pytest.param({"command": ["echo", "a\0b"]}, id="nul-in-argv"),
        pytest.param({"command": []}, id="empty-argv"),
        pytest.param({"command": [""]}, id="empty-program"),
        pytest.param({"command": ["true"], "env": {"A": "x\0y"}}, id="nul-in-env-value"),
        pytest.param({"command": ["true"], "env": {"A=B": "x"}}, id="equals-in-env-name"),
        pytest.param({"command": ["true"], "env": {"": "x"}}, id="empty-env-name"),
        pytest.param({"command": ["true"], "timeout": -1}, id="negative-timeout"),
        pytest.param({"command": ["true"], "output_limit": -5}, id="negative-output-limit"),
        pytest.param({"command": ["echo", "x" * 200_000]}, id="argument-over-128-KiB"),
        pytest.param({"command": ["echo", *["y" * 1000] * 2500]}, id="argv-over-2-MiB"),
    ])
    async def test_a_callers_mistake_is_a_usage_error_and_keeps_the_sandbox(
        self, sandbox: Sandbox, mistake: dict[str, object]
    ) -> None:
        """What no process could be started with is refused as InvalidCommandError
        (not retryable: a fresh sandbox would not help), and the sandbox still answers."""
        with pytest.raises(InvalidCommandError) as caught:
            await sandbox.exec(**mistake)  # type: ignore[arg-type]
        assert not caught.value.retryable
        with pytest.raises(InvalidCommandError):
            await sandbox.stream(**{k: v for k, v in mistake.items()  # type: ignore[arg-type]
                                    if k != "stdin"})
        assert (await sandbox.exec(["echo", "alive"], timeout=30)).stdout == b"alive\n"

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
