"""Reset and snapshot: after ``reset()`` nothing of the previous rollout survives (files,
processes, environment); ``snapshot()``/``fork()`` give independent copies."""

from __future__ import annotations

import uuid

import pytest
from rollbox import Backend, Sandbox
from rollbox.errors import SandboxFileNotFoundError

from rollbox_conformance.base import BackendTestBase


class ResetSnapshotTests(BackendTestBase):
    """In-place reuse must be indistinguishable from a fresh sandbox."""

    async def test_reset_drops_files_written_through_the_api(
        self, backend: Backend, sandbox: Sandbox
    ) -> None:
        self.require(backend, "reset_in_place")
        await sandbox.write_file("/tmp/rbx-before-reset.txt", b"rollout 1")
        await sandbox.write_file("rbx-in-workdir.txt", b"rollout 1")
        await sandbox.reset()
        for path in ("/tmp/rbx-before-reset.txt", "rbx-in-workdir.txt"):
            with pytest.raises(SandboxFileNotFoundError):
                await sandbox.read_file(path)

    async def test_sandbox_works_after_reset(self, backend: Backend, sandbox: Sandbox) -> None:
        self.require(backend, "reset_in_place")
        for round_ in range(3):
            await sandbox.write_file("round.txt", str(round_).encode())
            assert (await sandbox.exec(["true"], timeout=30)).ok
            await sandbox.reset()
        assert (await sandbox.exec(["echo", "alive"], timeout=30)).stdout == b"alive\n"

    async def test_reset_drops_changes_made_by_commands(
        self, backend: Backend, sandbox: Sandbox
    ) -> None:
        self.require(backend, "reset_in_place", "shell")
        home_rc = "$HOME/.profile"
        script = (
            "mkdir -p \"$HOME\" && echo dirty > /tmp/rbx-cmd-file && mkdir -p /tmp/rbx-cmd-dir && "
            f"echo 'export RBX_LEAKED=1' >> {home_rc} && echo dirty > rbx-workdir-file && "
            "echo done"
        )
        assert (await self.sh(sandbox, script)).text == "done\n"
        await sandbox.reset()
        check = (
            "for p in /tmp/rbx-cmd-file /tmp/rbx-cmd-dir rbx-workdir-file; do "
            "[ -e \"$p\" ] && echo \"survived $p\"; done; "
            f"grep -q RBX_LEAKED {home_rc} 2>/dev/null && echo 'survived profile'; echo checked"
        )
        result = await self.sh(sandbox, check)
        assert result.text == "checked\n", result.text

    async def test_reset_kills_every_process(self, backend: Backend, sandbox: Sandbox) -> None:
        """Background jobs and TERM-ignoring daemons of the previous rollout are gone."""
        self.require(backend, "reset_in_place", "shell")
        marker = f"rbx-reset-{uuid.uuid4().hex}"
        script = (
            f"sh -c 'trap \"\" TERM HUP; sleep 300; :' {marker} </dev/null >/dev/null 2>&1 &\n"
            f"(setsid sh -c 'trap \"\" TERM HUP INT; sleep 300; :' {marker} "
            "</dev/null >/dev/null 2>&1 &)\n"
            "sleep 0.3; echo started"
        )
        assert (await self.sh(sandbox, script)).text == "started\n"
        await sandbox.reset()
        # "[r]bx" matches the marker but not this grep's own command line.
        pattern = "[r]" + marker[1:]
        check = (
            "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done "
            f"| grep -c '{pattern}'"
        )
        result = await self.sh(sandbox, check)
        assert result.text.strip() == "0", "processes of the previous rollout survived reset"

    async def test_snapshot_then_fork_copies_the_files(
        self, backend: Backend, sandbox: Sandbox
    ) -> None:
        self.require(backend, "snapshot", "fork")
        await sandbox.write_file("/tmp/rbx-snap.txt", b"state at snapshot")
        snapshot = await sandbox.snapshot()
        try:
            async with await backend.fork(snapshot) as child:
                assert child.id != sandbox.id
                assert await child.read_file("/tmp/rbx-snap.txt") == b"state at snapshot"
        finally:
            await backend.drop_snapshot(snapshot)

    async def test_fork_and_original_are_independent(
        self, backend: Backend, sandbox: Sandbox
    ) -> None:
        self.require(backend, "snapshot", "fork")
        await sandbox.write_file("/tmp/rbx-shared.txt", b"v1")
        snapshot = await sandbox.snapshot()
        try:
            await sandbox.write_file("/tmp/rbx-shared.txt", b"original after snapshot")
            await sandbox.write_file("/tmp/rbx-original-only.txt", b"o")
            async with await backend.fork(snapshot) as first, await backend.fork(
                snapshot
            ) as second:
                assert await first.read_file("/tmp/rbx-shared.txt") == b"v1"
                await first.write_file("/tmp/rbx-shared.txt", b"first fork")
                await first.write_file("/tmp/rbx-fork-only.txt", b"f")
                assert await second.read_file("/tmp/rbx-shared.txt") == b"v1"
                with pytest.raises(SandboxFileNotFoundError):
                    await second.read_file("/tmp/rbx-fork-only.txt")
                with pytest.raises(SandboxFileNotFoundError):
                    await first.read_file("/tmp/rbx-original-only.txt")
            assert await sandbox.read_file("/tmp/rbx-shared.txt") == b"original after snapshot"
            with pytest.raises(SandboxFileNotFoundError):
                await sandbox.read_file("/tmp/rbx-fork-only.txt")
        finally:
            await backend.drop_snapshot(snapshot)

    async def test_fork_outlives_its_parent(self, backend: Backend) -> None:
        self.require(backend, "snapshot", "fork")
        parent = await backend.create(self.spec)
        await parent.write_file("/tmp/rbx-parent.txt", b"kept")
        snapshot = await parent.snapshot()
        await parent.close()
        try:
            async with await backend.fork(snapshot) as child:
                assert await child.read_file("/tmp/rbx-parent.txt") == b"kept"
                assert (await child.exec(["true"], timeout=30)).ok
        finally:
            await backend.drop_snapshot(snapshot)
