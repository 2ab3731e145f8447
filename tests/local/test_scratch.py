"""Where writable layers live: a tmpfs of their own per generation when the machine
allows, a directory on disk otherwise or when asked; sandbox directories per process."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from rollbox import Resources
from rollbox.errors import UsageError
from rollbox.spec import SandboxSpec
from rollbox_local import LocalBackend, scratch
from rollbox_local.owners import owner_name
from rollbox_local.scratch import Scratch, memory_unavailable

HOST = SandboxSpec(image="host")
needs_memory = pytest.mark.skipif(memory_unavailable() is not None,
                                  reason=f"no memory scratch here: {memory_unavailable()}")


def test_disk_and_a_path_are_taken_as_asked(state_dir: Path) -> None:
    chosen = Scratch.choose("disk", state_dir)
    assert not chosen.tmpfs_layers
    assert chosen.place() == state_dir / "sandboxes" / owner_name()
    elsewhere = state_dir / "elsewhere"
    assert Scratch.choose(str(elsewhere), state_dir).place() == elsewhere / owner_name()
    with pytest.raises(UsageError, match="auto, memory, disk or an absolute path"):
        Scratch.choose("somewhere", state_dir)


def test_the_environment_variable_is_the_default(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ROLLBOX_SCRATCH", "disk")
    assert not Scratch.choose(None, state_dir).tmpfs_layers


def test_memory_that_is_not_possible_is_an_error_only_when_asked_for(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scratch, "memory_unavailable", lambda: "no tmpfs here")
    with pytest.raises(UsageError, match="no tmpfs here; use auto or disk"):
        Scratch.choose("memory", state_dir)
    assert not Scratch.choose("auto", state_dir).tmpfs_layers


@needs_memory
def test_directories_of_dead_processes_are_cleared_at_start(state_dir: Path) -> None:
    disk = state_dir / "sandboxes"
    stale = disk / "999999999.12345-deadbeef"  # above any pid_max: that process is gone
    (stale / "lbx-x" / "g0").mkdir(parents=True)
    alive = disk / f"{owner_name()}"
    alive.mkdir(parents=True, exist_ok=True)
    chosen = Scratch.choose("auto", state_dir)
    assert not stale.exists() and alive.exists()
    place = chosen.place()
    assert place.name == owner_name()
    chosen.close()
    assert not place.exists()


@needs_memory
def test_a_directory_someone_else_may_write_is_not_used(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    shared = tmp_path / "shm"
    shared.mkdir()
    (shared / f"rollbox-{os.geteuid()}").mkdir(mode=0o777)
    os.chmod(shared / f"rollbox-{os.geteuid()}", 0o777)
    monkeypatch.setattr(scratch, "SHM", shared)
    monkeypatch.setattr(scratch, "_is_tmpfs", lambda _path: True)
    chosen = Scratch.choose("auto", state_dir)
    assert chosen.place().parent == state_dir / "sandboxes"  # not in a shared place


@pytest.fixture(params=["memory", "disk"])
async def placed(request: pytest.FixtureRequest, state_dir: Path) -> AsyncIterator[LocalBackend]:
    if request.param == "memory" and memory_unavailable() is not None:
        pytest.skip(f"no memory scratch here: {memory_unavailable()}")
    backend = LocalBackend(state_dir=state_dir, scratch=request.param)
    try:
        yield backend
    finally:
        await backend.aclose()


async def test_sandboxes_write_reset_snapshot_and_fork_wherever_their_layers_are(
    placed: LocalBackend,
) -> None:
    sandbox = await placed.create(HOST)
    assert placed.capabilities.disk_limit == placed.scratch.tmpfs_layers
    await sandbox.exec("mkdir -p /work && echo one > /work/a && echo gone > /work/del")
    snap = await sandbox.snapshot()
    await sandbox.exec("rm /work/del")
    await sandbox.reset()
    assert (await sandbox.exec("ls /work")).exit_code != 0  # reset: back to the image
    forked = await placed.fork(snap)
    try:
        await forked.exec("rm /work/del")  # a whiteout in memory, copied to disk below
        again = await placed.fork(await forked.snapshot())
        async with again:
            assert (await again.exec("ls /work")).text == "a\n"
    finally:
        await forked.close()
        await sandbox.close()
    assert await placed.leftovers() == []


@needs_memory
async def test_a_tmpfs_layer_holds_the_disk_and_inode_limits(state_dir: Path) -> None:
    async with LocalBackend(state_dir=state_dir, scratch="memory") as backend:
        spec = HOST.replace(resources=Resources(disk_mb=16, inodes=500))
        async with await backend.create(spec) as sandbox:
            big = await sandbox.exec("head -c 64M /dev/zero > /tmp/big; echo $?; "
                                     "wc -c < /tmp/big; rm /tmp/big")
            rc, size = big.text.split()
            assert rc != "0" and int(size) <= 16 * 2**20
            shm = await sandbox.exec("head -c 64M /dev/zero > /dev/shm/big; echo $?")
            assert shm.text.strip() != "0", "/dev/shm is outside the disk limit"
            files = await sandbox.exec("i=0; while [ $i -lt 2000 ]; do "
                                       "mkdir /tmp/d$i 2>/dev/null || break; i=$((i+1)); done; "
                                       "echo $i")
            assert int(files.text) < 500
            assert (await sandbox.exec("touch /dev/x; echo $?")).text.strip() != "0"
