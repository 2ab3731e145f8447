"""Files: binary and large content, permissions, and paths or symlinks that lead outside
the sandbox, which are refused (PathOutsideSandboxError) or stay inside it; devices and
FIFOs, which are refused promptly, without holding up anyone else's file calls."""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

import pytest
from rollbox import Backend, Sandbox
from rollbox.errors import (
    PathOutsideSandboxError,
    RollboxError,
    SandboxError,
    SandboxFileNotFoundError,
)

from rollbox_conformance.base import BackendTestBase
from rollbox_conformance.hostside import new_secret

MiB = 1024 * 1024

# What a backend may do with a path that leads outside: refuse it, or find nothing there.
REFUSED = (PathOutsideSandboxError, SandboxFileNotFoundError)


class FileTests(BackendTestBase):
    """``read_file``/``write_file``/``upload``/``download`` keep bytes and stay inside."""

    async def test_binary_round_trip(self, sandbox: Sandbox) -> None:
        data = bytes(range(256)) * 257 + b"\x00\xff\x00"
        await sandbox.write_file("binary.bin", data)
        assert await sandbox.read_file("binary.bin") == data

    async def test_empty_file(self, sandbox: Sandbox) -> None:
        await sandbox.write_file("empty", b"")
        assert await sandbox.read_file("empty") == b""

    async def test_overwrite_replaces_the_whole_file(self, sandbox: Sandbox) -> None:
        await sandbox.write_file("f.txt", b"a long first version\n")
        await sandbox.write_file("f.txt", b"short\n")
        assert await sandbox.read_file("f.txt") == b"short\n"

    async def test_parent_directories_are_created(self, sandbox: Sandbox) -> None:
        await sandbox.write_file("/tmp/rbx-a/b/c/deep.txt", b"deep")
        assert await sandbox.read_file("/tmp/rbx-a/b/c/deep.txt") == b"deep"

    async def test_relative_paths_are_taken_from_the_workdir(self, sandbox: Sandbox) -> None:
        await sandbox.write_file("rel.txt", b"relative")
        absolute = self.spec.workdir.rstrip("/") + "/rel.txt"
        assert await sandbox.read_file(absolute) == b"relative"

    async def test_missing_file_raises(self, sandbox: Sandbox) -> None:
        with pytest.raises(SandboxFileNotFoundError):
            await sandbox.read_file("/tmp/rbx-does-not-exist/nothing.txt")

    async def test_nul_in_path_is_refused(self, sandbox: Sandbox) -> None:
        with pytest.raises(PathOutsideSandboxError):
            await sandbox.write_file("bad\0name", b"x")
        with pytest.raises(PathOutsideSandboxError):
            await sandbox.read_file("bad\0name")

    async def test_upload_and_download(self, sandbox: Sandbox, tmp_path: Path) -> None:
        source = tmp_path / "up.bin"
        source.write_bytes(os.urandom(64 * 1024))
        await sandbox.upload(source, "/tmp/rbx-up.bin")
        target = tmp_path / "down.bin"
        await sandbox.download("/tmp/rbx-up.bin", target)
        assert target.read_bytes() == source.read_bytes()

    @pytest.mark.slow
    async def test_large_file_round_trip(self, sandbox: Sandbox) -> None:
        data = os.urandom(MiB) * 100 + b"tail"
        async with self.within(120, "a 100 MB file round trip"):
            await sandbox.write_file("/tmp/rbx-large.bin", data)
            back = await sandbox.read_file("/tmp/rbx-large.bin")
        assert len(back) == len(data)
        assert back == data

    async def test_dot_dot_does_not_climb_out(self, sandbox: Sandbox, tmp_path: Path) -> None:
        """``../../..`` past the sandbox root stays at the root: it never reaches the host."""
        host_target = tmp_path / "climbed-out.txt"
        sneaky = "../" * 40 + str(host_target).lstrip("/")
        try:
            await sandbox.write_file(sneaky, b"escaped")
        except PathOutsideSandboxError:
            pass
        else:
            assert await sandbox.read_file(sneaky) == b"escaped"
        assert not host_target.exists(), "write_file wrote outside the sandbox"

    async def test_host_files_are_not_readable_through_the_api(
        self, sandbox: Sandbox, tmp_path: Path
    ) -> None:
        secret = new_secret()
        host_file = tmp_path / "api-secret.txt"
        host_file.write_text(secret)
        for path in (str(host_file), "../" * 40 + str(host_file).lstrip("/")):
            try:
                data = await sandbox.read_file(path)
            except REFUSED:
                continue
            assert secret.encode() not in data, f"read_file({path!r}) read a host file"

    # -- with a real shell: permissions and symlinks -------------------------------------

    async def test_file_written_is_seen_by_commands_and_back(
        self, backend: Backend, sandbox: Sandbox
    ) -> None:
        self.require(backend, "shell")
        path = self.scratch("shared")
        await sandbox.write_file(path, b"from api\n")
        result = await self.sh(sandbox, f"cat {path} && echo from shell > {path}.2")
        assert result.stdout == b"from api\n"
        assert await sandbox.read_file(f"{path}.2") == b"from shell\n"

    @pytest.mark.parametrize("mode", [0o755, 0o644, 0o600, 0o700, 0o444])
    async def test_permissions_are_kept(
        self, backend: Backend, sandbox: Sandbox, mode: int
    ) -> None:
        self.require(backend, "shell")
        path = self.scratch("mode")
        await sandbox.write_file(path, b"#!/bin/sh\necho ran\n", mode=mode)
        result = await self.sh(sandbox, f"stat -c %a {path}")
        assert result.text.strip() == f"{mode:o}"

    async def test_executable_file_runs(self, backend: Backend, sandbox: Sandbox) -> None:
        self.require(backend, "shell")
        path = self.scratch("script")
        await sandbox.write_file(path, b"#!/bin/sh\necho ran \"$1\"\n", mode=0o755)
        result = await sandbox.exec([path, "arg"], timeout=30)
        assert result.stdout == b"ran arg\n"

    @pytest.mark.parametrize("style", ["absolute", "relative"])
    async def test_symlink_to_a_host_file_is_refused(
        self, backend: Backend, sandbox: Sandbox, tmp_path: Path, style: str
    ) -> None:
        self.require(backend, "shell")
        secret = new_secret()
        host_file = tmp_path / "link-secret.txt"
        host_file.write_text(secret)
        target = str(host_file) if style == "absolute" else "../" * 40 + str(host_file)[1:]
        link = self.scratch("link")
        assert (await self.sh(sandbox, f"ln -s '{target}' {link}")).ok
        try:
            data = await sandbox.read_file(link)
        except REFUSED:
            return
        assert secret.encode() not in data, "read_file followed a symlink out to the host"

    async def test_write_through_a_symlinked_directory_stays_inside(
        self, backend: Backend, sandbox: Sandbox, tmp_path: Path
    ) -> None:
        self.require(backend, "shell")
        link = self.scratch("dirlink")
        assert (await self.sh(sandbox, f"ln -s '{tmp_path}' {link}")).ok
        with contextlib.suppress(*REFUSED):  # refused, or written to the sandbox's own copy
            await sandbox.write_file(f"{link}/pwned.txt", b"pwned")
        assert not (tmp_path / "pwned.txt").exists(), "write_file followed a symlink out"

    async def test_symlink_loop_fails_cleanly(self, backend: Backend, sandbox: Sandbox) -> None:
        self.require(backend, "shell")
        link = self.scratch("loop")
        assert (await self.sh(sandbox, f"ln -s {link} {link}")).ok
        async with self.within(self.timeout_slack_s, "reading a symlink loop"):
            with pytest.raises((SandboxError, PathOutsideSandboxError)):
                await sandbox.read_file(link)

    # -- special files: devices and FIFOs ---------------------------------------------------

    async def test_devices_are_refused(self, backend: Backend, sandbox: Sandbox) -> None:
        """An endless device read through the API would fill the caller's memory: it is
        refused (any RollboxError), directly or through a symlink, and promptly.

        CAUTION: a backend that reads devices without a bound grows by gigabytes here."""
        paths = ["/dev/zero", "/dev/urandom"]
        if backend.capabilities.shell:
            link = self.scratch("dev")
            made = await self.sh(sandbox, f"ln -s /dev/zero {link}-zero && "
                                          f"ln -s /dev/urandom {link}-urandom")
            assert made.ok, made
            paths += [f"{link}-zero", f"{link}-urandom"]
        for path in paths:
            async with self.within(self.timeout_slack_s, f"read_file({path!r})"):
                with pytest.raises(RollboxError):
                    data = await sandbox.read_file(path)
                    pytest.fail(f"read_file({path!r}) returned {len(data)} bytes")

    async def test_fifos_fail_promptly_and_stall_no_other_sandbox(
        self, backend: Backend, sandbox: Sandbox
    ) -> None:
        """read_file on a FIFO (no writer) fails promptly; write_file on one (no reader)
        fails or replaces it with a regular file. Meanwhile another sandbox's file calls
        go through: no worker of the backend is stuck on them."""
        self.require(backend, "shell")
        base = self.scratch("fifo")
        made = await self.sh(sandbox, "command -v mkfifo >/dev/null || exit 77\n"
                                      f"mkdir -p {base} && for i in 1 2 3 4 5 6 7 8; do "
                                      f"mkfifo {base}/p$i || exit 1; done")
        if made.exit_code == 77:
            pytest.skip("the image has no mkfifo")
        assert made.ok, made
        reads = [asyncio.ensure_future(sandbox.read_file(f"{base}/p{i}")) for i in range(1, 5)]
        writes = [asyncio.ensure_future(sandbox.write_file(f"{base}/p{i}", b"x"))
                  for i in range(5, 9)]
        try:
            await asyncio.sleep(0.5)  # let them reach the backend's workers
            async with self.within(self.spec.timeouts.create_s, "a create beside FIFO calls"):
                other = await backend.create(self.spec)
            beside = self.scratch("beside-fifos")
            try:
                async with self.within(self.timeout_slack_s,
                                       "another sandbox's file calls beside FIFO calls"):
                    await other.write_file(beside, b"fine")
                    assert await other.read_file(beside) == b"fine"
            finally:
                await other.close()
            async with self.within(self.timeout_slack_s, "file calls on FIFOs"):
                read_results: list[object] = await asyncio.gather(*reads, return_exceptions=True)
                write_results: list[object] = await asyncio.gather(*writes,
                                                                   return_exceptions=True)
        finally:
            for task in reads + writes:
                task.cancel()
            await asyncio.gather(*reads, *writes, return_exceptions=True)
        for result in read_results:
            assert isinstance(result, RollboxError), f"read_file on a FIFO gave {result!r}"
        for i, result in enumerate(write_results, start=5):
            if result is None:  # accepted: the FIFO must have become the file written
                async with self.within(self.timeout_slack_s, "reading a replaced FIFO"):
                    assert await sandbox.read_file(f"{base}/p{i}") == b"x"
            else:
                assert isinstance(result, RollboxError), f"write_file on a FIFO: {result!r}"
