"""Sandboxes come from a warm pool shared by every provider of one configuration, are
reset in place when stopped, and nothing is left once the pool closes."""

from __future__ import annotations

import asyncio

import pytest
from nemo_gym.sandbox import AsyncSandbox, SandboxCreateError, SandboxSpec, SandboxStatus
from ng_support import leftovers, sandbox_processes, shared_pools
from rollbox.errors import AcquireTimeoutError
from rollbox_nemo_gym import RollboxProvider

SPEC = SandboxSpec(workdir="/work")


async def session(provider_config: dict[str, object], command: str) -> tuple[str, str]:
    """One NeMo Gym-style session: a provider of its own (built from the mapping, closed
    with the sandbox), one command. Returns the sandbox's rollbox id and the output."""
    async with AsyncSandbox(provider_config, SPEC) as sandbox:
        await sandbox.start()
        result = await sandbox.exec(command)
        assert result.return_code == 0, result
        return sandbox._require_handle().raw.lease.raw.id, result.stdout or ""


async def test_providers_of_one_config_share_a_warm_pool_reset_in_place() -> None:
    config = {"rollbox": {"keep_warm_s": 60}}
    first, _ = await session(config, "echo dirty > file.txt; sleep 1000 & echo started")
    second, seen = await session(
        config, "cat file.txt 2>/dev/null; ps -eo comm | grep -c sleep || true")
    assert second == first  # the same sandbox, handed out again ...
    assert seen == "0\n"  # ... reset: no file, no process of the first session
    (shared,) = shared_pools()
    counts = shared.pool.metrics.counters
    assert counts["creations"] == 1 and counts["reuses"] >= 1 and counts["resets"] >= 1


async def test_a_different_config_gets_a_pool_of_its_own() -> None:
    await session({"rollbox": {"keep_warm_s": 60}}, "true")
    await session({"rollbox": {"keep_warm_s": 60, "pool_options": {"max_sandboxes": 4}}}, "true")
    assert len(shared_pools()) == 2


async def test_the_last_provider_closes_the_pool_when_keep_warm_s_is_0() -> None:
    provider = RollboxProvider(keep_warm_s=0)
    sandboxes = [AsyncSandbox(provider, SPEC, owns_provider=False) for _ in range(3)]
    await asyncio.gather(*(s.start() for s in sandboxes))
    (shared,) = shared_pools()
    assert len(sandbox_processes()) >= 3
    await sandboxes[0].stop()
    await provider.aclose()  # closes the two sandboxes still open too
    assert shared_pools() == []
    assert await leftovers(shared) == []
    assert sandbox_processes() == []
    statuses = [await provider.status(s._require_handle()) for s in sandboxes[1:]]
    assert statuses == [SandboxStatus.STOPPED] * 2
    await provider.aclose()  # idempotent


async def test_a_pool_stays_warm_for_keep_warm_s_then_closes() -> None:
    config = {"rollbox": {"keep_warm_s": 0.5}}
    first, _ = await session(config, "true")
    (shared,) = shared_pools()
    second, _ = await session(config, "true")  # within keep_warm_s: the warm sandbox
    assert second == first
    await asyncio.sleep(1.5)
    assert shared_pools() == []
    assert await leftovers(shared) == []


async def test_ttl_s_ends_the_sandbox() -> None:
    async with AsyncSandbox({"rollbox": {"keep_warm_s": 0}},
                            SandboxSpec(ttl_s=0.5)) as sandbox:
        await sandbox.start()
        assert (await sandbox.exec("true")).return_code == 0
        await asyncio.sleep(1)
        assert await sandbox.status() == SandboxStatus.STOPPED
        late = await sandbox.exec("true")
        assert (late.return_code, late.error_type) == (125, "sandbox")
        assert "ttl_s" in (late.stderr or "")


async def test_ready_timeout_s_bounds_the_wait_for_a_sandbox() -> None:
    provider = RollboxProvider(keep_warm_s=0, pool_options={"max_sandboxes": 1})
    held = await AsyncSandbox(provider, SPEC, owns_provider=False).start()
    waiting = AsyncSandbox(provider, SandboxSpec(workdir="/work", ready_timeout_s=0.3),
                           owns_provider=False)
    with pytest.raises(SandboxCreateError) as caught:
        await waiting.start()
    assert isinstance(caught.value.cause, AcquireTimeoutError)
    assert caught.value.retryable is True
    await held.stop()
    await provider.aclose()


async def test_a_cancelled_command_is_killed_and_the_sandbox_stays_usable() -> None:
    async with AsyncSandbox({"rollbox": {"keep_warm_s": 0}}, SPEC) as sandbox:
        await sandbox.start()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.5):
                await sandbox.exec("sleep 30")
        still = await sandbox.exec("ps -eo comm | grep -c '^sleep' || true")
        assert (still.return_code, still.stdout) == (0, "0\n")


SERVICE = SandboxSpec(
    workdir="/srv",
    entrypoint=["python3", "-m", "http.server", "8123", "--bind", "127.0.0.1"],
    provider_options={"ready_port": 8123},
)
FETCH = ("python3 -c 'import urllib.request; print(urllib.request.urlopen("
         "\"http://127.0.0.1:8123/\", timeout=5).status)'")


async def test_an_entrypoint_is_running_when_create_returns_and_after_each_reset() -> None:
    config = {"rollbox": {"keep_warm_s": 60}}
    for _ in range(2):  # the second session gets the first one's sandbox, reset
        async with AsyncSandbox(config, SERVICE) as sandbox:
            await sandbox.start()
            served = await sandbox.exec(FETCH + "; ls")
            assert served.stdout == "200\n", served  # no wait: it was ready at hand-out
            await sandbox.exec("touch left-behind")
    (shared,) = shared_pools()
    assert shared.pool.metrics.counters["creations"] == 1


@pytest.mark.parametrize(
    ("entrypoint", "says"),
    [(["false"], "exited with 1"), (["sleep", "1000"], "accepts connections on port 8000")],
)
async def test_an_entrypoint_that_never_serves_is_a_create_error_that_says_why(
    entrypoint: list[str], says: str
) -> None:
    spec = SandboxSpec(entrypoint=entrypoint, ports=[8000], ready_timeout_s=5)
    async with AsyncSandbox({"rollbox": {"keep_warm_s": 0}}, spec) as sandbox:
        with pytest.raises(SandboxCreateError, match=says):
            await sandbox.start()
