"""Limits: fork bombs, memory bombs, disk fills and CPU hogs are contained by the
resources in the spec (each test shrinks one limit so the bomb stays cheap). Each limit
holds for the sandbox as a whole: memory of all its processes, tmpfs files and memfds
together; bytes and inodes of all its writable filesystems together. A limit the backend
does not declare is refused at create, never silently ignored."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import pytest
from rollbox import Backend, SandboxSpec
from rollbox.backend import LIMIT_CAPABILITY
from rollbox.errors import ExecTimeoutError, SandboxLostError, UnsupportedSpecError

from rollbox_conformance.attacks import PYTHON_PRELUDE, PYTHON_RUNNER
from rollbox_conformance.base import BackendTestBase

MiB = 1024 * 1024

DEMANDS: dict[str, float] = {
    "cpus": 0.5, "memory_mb": 512, "pids": 128, "disk_mb": 256, "inodes": 20_000,
    "file_size_mb": 64, "cpu_seconds": 60,
}
"""A modest value for each ``Resources`` field, for the tests of refusal."""

HOLD_TOGETHER = """\
d=$(mktemp -d) || exit 1
hold() {
  { head -c 100663296 /dev/zero; touch "$d/$1"; n=0
    while [ "$(ls "$d" | wc -l)" -lt 4 ] && [ $n -lt 300 ]; do sleep 0.1; n=$((n + 1)); done
    sleep 1; } | tail -n 1 | wc -c
}
for i in 1 2 3 4; do hold $i & done; wait; rm -rf "$d"
"""
"""Four ``tail`` processes each hold a 96 MiB line until all four have theirs (or 30 s
passed, or one died), then print how much each held."""

MEMFD_FILL = """\
fd = os.memfd_create("rbx-conformance")
chunk = b"\\1" * (1 << 20)
for mib in range(1, 257):
    os.write(fd, chunk)
print("wrote", mib, flush=True)
"""

CPU_BURN = """\
import time
start = time.monotonic()
children = []
for _ in range(2):
    pid = os.fork()
    if pid == 0:
        while time.monotonic() - start < 2.0:
            pass
        os._exit(0)
    children.append(pid)
for pid in children:
    os.waitpid(pid, 0)
wall = time.monotonic() - start
times = os.times()
print(round((times.children_user + times.children_system) / wall, 3))
"""


class LimitsTests(BackendTestBase):
    """What a runaway command can consume is bounded by ``spec.resources``."""

    def limited(self, **resources: Any) -> SandboxSpec:
        """``spec`` with some resources changed."""
        return self.spec.replace(resources=dataclasses.replace(self.spec.resources, **resources))

    def memory_limited(self, backend: Backend, memory_mb: int) -> SandboxSpec:
        """``spec`` under ``memory_mb``, with a small ``disk_mb`` where the backend limits
        disk: a backend whose writable layer lives in memory may add its ``disk_mb`` to
        the memory limit (so that a full layer is ENOSPC, not an out-of-memory kill)."""
        small_disk = {"disk_mb": 16} if backend.capabilities.disk_limit else {}
        return self.limited(memory_mb=memory_mb, **small_disk)

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
        spec = self.memory_limited(limits_backend, 128)
        async with await limits_backend.create(spec) as sandbox:
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

    # -- memory of the sandbox as a whole ----------------------------------------------------

    async def test_memory_of_all_processes_together_is_limited(
        self, limits_backend: Backend
    ) -> None:
        """Four processes of 96 MiB each (each under the limit) hold memory at once under
        memory_mb=256: they do not all get it."""
        self.require(limits_backend, "memory_limit")
        script = HOLD_TOGETHER
        spec = self.memory_limited(limits_backend, 256)
        async with await limits_backend.create(spec) as sandbox:
            try:
                result = await self.sh(sandbox, script, timeout=60)
            except SandboxLostError:
                return  # the sandbox died of it: contained too
        held = [int(n) for n in result.text.split()]
        assert held.count(96 * MiB) < 4, "4 x 96 MiB were held at once under memory_mb=256"

    async def test_memory_in_dev_shm_is_counted(self, limits_backend: Backend) -> None:
        self.require(limits_backend, "memory_limit")
        path = f"/dev/shm/rbx-fill-{uuid.uuid4().hex}"
        script = ("[ -d /dev/shm ] || exit 77\n"
                  f"head -c 268435456 /dev/zero > {path}; rc=$?\n"
                  f"size=$(stat -c %s {path} 2>/dev/null || echo 0); rm -f {path}\n"
                  "echo $rc $size")
        spec = self.memory_limited(limits_backend, 128)
        async with await limits_backend.create(spec) as sandbox:
            try:
                result = await self.sh(sandbox, script, timeout=60)
            except SandboxLostError:
                return  # the sandbox died of it: contained too
        if result.exit_code == 77:
            pytest.skip("the sandbox has no /dev/shm")
        assert result.text.split() != ["0", str(256 * MiB)], (
            "256 MiB went into /dev/shm under memory_mb=128")

    async def test_memory_in_a_memfd_is_counted(self, limits_backend: Backend) -> None:
        self.require(limits_backend, "memory_limit")
        spec = self.memory_limited(limits_backend, 128)
        async with await limits_backend.create(spec) as sandbox:
            try:
                result = await self.sh(sandbox, PYTHON_RUNNER, timeout=60,
                                       stdin=(PYTHON_PRELUDE + MEMFD_FILL).encode())
            except SandboxLostError:
                return  # the sandbox died of it: contained too
        if result.exit_code == 77:
            pytest.skip("the image has no python3")
        assert "wrote 256" not in result.text, "a 256 MiB memfd was filled under memory_mb=128"

    # -- disk bytes and inodes of the sandbox as a whole -------------------------------------

    def _writable_dirs(self) -> str:
        """Directories a command may write, one of each filesystem a backend may give."""
        return " ".join(dict.fromkeys([self.scratch_dir, "/tmp", "/var/tmp", "/dev/shm"]))

    async def test_disk_writes_past_disk_mb_fail(self, limits_backend: Backend) -> None:
        """12 MiB files go round /tmp, /var/tmp, /dev/shm and the scratch directory under
        disk_mb=32: all of them together hold at most 32 MiB."""
        self.require(limits_backend, "disk_limit")
        dirs, files = self._writable_dirs(), f"rbx-disk-{uuid.uuid4().hex}"
        script = (f"set -- {dirs}; total=0\n"
                  "for i in 1 2 3 4 5 6 7 8; do\n"
                  '  d=$1; shift; set -- "$@" "$d"; [ -d "$d" ] && [ -w "$d" ] || continue\n'
                  f'  f="$d/{files}-$i"; head -c 12582912 /dev/zero > "$f"; rc=$?\n'
                  '  total=$((total + $(wc -c < "$f")))\n'
                  "  [ $rc = 0 ] || break\n"
                  f'done; for d in {dirs}; do rm -f "$d/{files}"-*; done; echo $total')
        async with await limits_backend.create(self.limited(disk_mb=32)) as sandbox:
            result = await self.sh(sandbox, script, timeout=60)
        total = int(result.text.split()[-1])
        assert total >= 12 * MiB, f"not even 12 MiB could be written under disk_mb=32: {result}"
        assert total <= 32 * MiB, f"{total} bytes were written under disk_mb=32"

    async def test_inodes_past_the_limit_fail(self, limits_backend: Backend) -> None:
        """Empty files, made in the scratch directory and /dev/shm by turns, stop before
        inodes=2000 are used."""
        self.require(limits_backend, "inode_limit")
        token = uuid.uuid4().hex
        dirs = [f"{d}/rbx-inodes-{token}" for d in dict.fromkeys([self.scratch_dir, "/dev/shm"])]
        # `true > file`, not `: > file`: a failed redirection of the special builtin `:`
        # would end the shell
        script = (f"mkdir -p {dirs[0]} || exit 1; mkdir -p {' '.join(dirs[1:])} 2>/dev/null\n"
                  f"set -- {' '.join(dirs)}; i=0\n"
                  "while [ $i -lt 6000 ]; do\n"
                  '  d=$1; shift; set -- "$@" "$d"; [ -d "$d" ] || continue\n'
                  '  true > "$d/$i" 2>/dev/null || break; i=$((i + 1))\n'
                  f"done; rm -rf {' '.join(dirs)}; echo $i")
        async with await limits_backend.create(self.limited(inodes=2000)) as sandbox:
            result = await self.sh(sandbox, script, timeout=60)
        made = int(result.text.split()[-1])
        assert made >= 100, f"hardly any file could be made under inodes=2000: {result}"
        assert made < 2000, f"{made} files were made under inodes=2000"

    # -- CPU ------------------------------------------------------------------------------

    async def test_cpu_quota_holds_a_busy_loop_to_its_share(
        self, limits_backend: Backend
    ) -> None:
        """Two busy processes under cpus=0.1 get about a tenth of a CPU between them
        (measured inside: their CPU time over the wall time). A small quota, so that
        ignoring it shows even where a busy machine gives a process half a CPU; only the
        upper bound is checked, as a busy machine gives less anyway."""
        self.require(limits_backend, "cpu_limit")
        async with await limits_backend.create(self.limited(cpus=0.1)) as sandbox:
            result = await self.sh(sandbox, PYTHON_RUNNER, timeout=60,
                                   stdin=(PYTHON_PRELUDE + CPU_BURN).encode())
        if result.exit_code == 77:
            pytest.skip("the image has no python3")
        assert result.exit_code == 0, result
        share = float(result.text.split()[-1])
        assert share <= 0.25, f"two busy processes used {share:.2f} CPUs under cpus=0.1"

    # -- what the backend cannot enforce -----------------------------------------------------

    @pytest.mark.parametrize("field", sorted(DEMANDS))
    async def test_a_limit_the_backend_cannot_enforce_is_refused(
        self, backend: Backend, field: str
    ) -> None:
        """No silently ignored limit: a spec demanding one the backend does not declare
        is refused at create (UnsupportedSpecError naming the field), and accepted only
        with ``resources.best_effort=True``."""
        capability = LIMIT_CAPABILITY[field]
        if getattr(backend.capabilities, capability):
            pytest.skip(f"the backend declares {capability}: the tests above enforce it")
        before = set(await self.leak_check(backend))
        with pytest.raises(UnsupportedSpecError) as caught:
            sandbox = await backend.create(self.limited(**{field: DEMANDS[field]}))
            await sandbox.close()
        assert caught.value.field == f"resources.{field}"
        assert not caught.value.retryable
        assert set(await self.leak_check(backend)) - before == set()
        best_effort = self.limited(**{field: DEMANDS[field]}, best_effort=True)
        async with await backend.create(best_effort) as sandbox:
            assert (await sandbox.exec(["true"], timeout=30)).ok
