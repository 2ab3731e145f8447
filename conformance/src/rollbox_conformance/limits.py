"""Limits: fork bombs, memory bombs, disk fills and CPU hogs are contained by the
resources in the spec (each test shrinks one limit so the bomb stays cheap)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from rollbox import Backend, SandboxSpec
from rollbox.errors import ExecTimeoutError

from rollbox_conformance.base import BackendTestBase

MiB = 1024 * 1024


class LimitsTests(BackendTestBase):
    """What a runaway command can consume is bounded by ``spec.resources``."""

    def limited(self, **resources: Any) -> SandboxSpec:
        return self.spec.replace(resources=dataclasses.replace(self.spec.resources, **resources))

    @pytest.fixture
    def limits_backend(self, backend: Backend) -> Backend:
        self.require(backend, "shell")
        return backend

    async def test_fork_bomb_is_contained_by_the_pids_limit(self, limits_backend: Backend) -> None:
        self.require(limits_backend, "pids_limit")
        async with await limits_backend.create(self.limited(pids=64)) as sandbox:
            script = (
                "i=0; while [ $i -lt 400 ]; do "
                "sleep 20 </dev/null >/dev/null 2>&1 & i=$((i+1)); done; echo all-started"
            )
            try:
                result = await self.sh(sandbox, script, timeout=20)
            except ExecTimeoutError:
                return  # the shell kept retrying its forks: contained
            assert "all-started" not in result.text, "400 processes ran under pids=64"

    async def test_memory_bomb_is_contained(self, limits_backend: Backend) -> None:
        self.require(limits_backend, "memory_limit")
        async with await limits_backend.create(self.limited(memory_mb=128)) as sandbox:
            # tail keeps a newline-free stream whole: 600 MB of memory under a 128 MB limit
            result = await self.sh(sandbox, "head -c 600M /dev/zero | tail -n 1 >/dev/null",
                                   timeout=60)
        assert result.exit_code != 0, "600 MB were allocated under memory_mb=128"

    async def test_disk_fill_is_contained_by_the_file_size_limit(
        self, limits_backend: Backend
    ) -> None:
        self.require(limits_backend, "file_size_limit")
        path = self.scratch("fill")
        async with await limits_backend.create(self.limited(file_size_mb=8)) as sandbox:
            result = await self.sh(
                sandbox,
                f"head -c 32M /dev/zero > {path}; echo rc=$?; wc -c < {path}; rm -f {path}",
                timeout=60,
            )
        lines = result.text.split()
        assert lines[0] != "rc=0", "a 32 MB file was written under file_size_mb=8"
        assert int(lines[-1]) <= 8 * MiB

    async def test_cpu_hog_is_stopped_by_the_cpu_time_limit(
        self, limits_backend: Backend
    ) -> None:
        self.require(limits_backend, "cpu_time_limit")
        async with await limits_backend.create(self.limited(cpu_seconds=1)) as sandbox:
            try:
                result = await self.sh(sandbox, "while :; do :; done", timeout=20)
            except ExecTimeoutError:
                pytest.fail("a busy loop ran 20 s under cpu_seconds=1")
        assert result.exit_code != 0
