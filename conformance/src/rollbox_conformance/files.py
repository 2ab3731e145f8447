"""Files: binary and large content, permissions, and paths or symlinks that lead outside
the sandbox, which are refused (PathOutsideSandboxError) or stay inside it."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest
from rollbox import Backend, Sandbox
from rollbox.errors import PathOutsideSandboxError, SandboxError, SandboxFileNotFoundError

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
