"""Optional capabilities NeMo Gym checks for: pause/resume, and serialize/connect in one
process (across processes: test_ports_and_serve.py)."""

from __future__ import annotations

import json

import pytest
from nemo_gym.sandbox import AsyncSandbox, SandboxSpec, SandboxStatus
from ng_support import leftovers, sandbox_processes, shared_pools
from rollbox.errors import SandboxLostError
from rollbox_nemo_gym import RollboxProvider

SPEC = SandboxSpec(workdir="/work")


async def test_pause_keeps_the_files_and_frees_the_sandbox() -> None:
    provider = RollboxProvider(keep_warm_s=0)
    async with AsyncSandbox(provider, SPEC) as sandbox:
        await sandbox.start()
        await sandbox.exec("echo kept > state.txt; sleep 1000 &")
        await sandbox.pause()
        assert await sandbox.status() == SandboxStatus.PAUSED
        paused = await sandbox.exec("true")
        assert (paused.return_code, paused.error_type) == (125, "sandbox")
        assert "paused" in (paused.stderr or "")
        await sandbox.pause()  # already paused: snapshots nothing more
        (shared,) = shared_pools()
        assert shared.pool.idle_count() == 1  # its sandbox went back to the pool

        await sandbox.resume()
        assert await sandbox.status() == SandboxStatus.RUNNING
        resumed = await sandbox.exec("cat state.txt; ps -eo comm | grep -c sleep || true")
        assert resumed.stdout == "kept\n0\n"  # files survive a pause, processes do not
        await sandbox.exec("echo again >> state.txt")
        await sandbox.pause()
        await sandbox.resume()
        assert (await sandbox.exec("cat state.txt")).stdout == "kept\nagain\n"
    assert shared_pools() == []
    assert await leftovers(shared) == []  # every snapshot dropped, every fork closed


async def test_a_handle_serializes_to_ids_and_connects_in_this_process() -> None:
    creator = RollboxProvider(keep_warm_s=0)
    sandbox = await AsyncSandbox(creator, SPEC, owns_provider=False).start()
    await sandbox.exec("echo shared > note.txt")
    descriptor = await sandbox.serialize()
    text = json.dumps(descriptor)
    assert "token" not in text.lower() and "secret" not in text.lower()
    assert descriptor["workdir"] == "/work"

    borrower = RollboxProvider(keep_warm_s=0)
    borrowed = await AsyncSandbox.connect(descriptor, provider=borrower)
    assert (await borrowed.exec("cat note.txt")).stdout == "shared\n"
    await borrowed.disconnect()  # a borrower does not stop the owner's sandbox
    assert (await sandbox.exec("cat note.txt")).stdout == "shared\n"

    await sandbox.stop()
    with pytest.raises(SandboxLostError, match="was stopped"):
        await AsyncSandbox.connect(descriptor, provider=borrower)
    await creator.aclose()
    assert sandbox_processes() == []
