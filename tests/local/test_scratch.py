"""Where writable layers live: memory when the machine allows, disk otherwise, by choice."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from rollbox.errors import UsageError
from rollbox.spec import SandboxSpec
from rollbox_local import LocalBackend, scratch
from rollbox_local.scratch import Scratch, memory_unavailable

HOST = SandboxSpec(image="host")
needs_memory = pytest.mark.skipif(memory_unavailable() is not None,
                                  reason=f"no memory scratch here: {memory_unavailable()}")


def test_disk_and_a_path_are_taken_as_asked(state_dir: Path) -> None:
    assert Scratch.choose("disk", state_dir).place() == state_dir / "sandboxes"
    elsewhere = state_dir / "elsewhere"
    assert Scratch.choose(str(elsewhere), state_dir).place() == elsewhere
    assert elsewhere.is_dir()
    with pytest.raises(UsageError, match="auto, memory, disk or an absolute path"):
        Scratch.choose("somewhere", state_dir)


def test_the_environment_variable_is_the_default(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ROLLBOX_SCRATCH", "disk")
    assert Scratch.choose(None, state_dir).memory is None
    assert Scratch.choose(None, state_dir).place() == state_dir / "sandboxes"


def test_memory_that_is_not_possible_is_an_error_only_when_asked_for(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scratch, "memory_unavailable", lambda: "no tmpfs here")
    with pytest.raises(UsageError, match="no tmpfs here; use auto or disk"):
        Scratch.choose("memory", state_dir)
    assert Scratch.choose("auto", state_dir).place() == state_dir / "sandboxes"


@needs_memory
def test_memory_is_a_private_directory_per_process_and_dead_ones_are_cleared(
    state_dir: Path,
) -> None:
    parent = scratch.SHM / f"rollbox-{os.geteuid()}"
    parent.mkdir(exist_ok=True)
    stale = parent / "999999999-dead"  # above any pid_max: that process cannot exist
    (stale / "lbx-x" / "upper0").mkdir(parents=True, exist_ok=True)
    chosen = Scratch.choose("auto", state_dir)
    place = chosen.place()
    try:
        assert place.parent == parent and place.name.startswith(f"{os.getpid()}-")
        assert not stale.exists()
        assert (parent.stat().st_mode & 0o022) == 0 and parent.stat().st_uid == os.geteuid()
        assert chosen.roots == [state_dir / "sandboxes", place]
    finally:
        chosen.close()
    assert not place.exists()


@needs_memory
def test_memory_asked_for_but_unusable_is_an_error_at_once(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / f"rollbox-{os.geteuid()}").write_text("not a directory")
    monkeypatch.setattr(scratch, "SHM", tmp_path)
    monkeypatch.setattr(scratch, "memory_unavailable", lambda: None)
    with pytest.raises(UsageError, match="cannot use"):
        Scratch.choose("memory", state_dir)


@needs_memory
def test_a_small_tmpfs_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scratch, "MIN_MEMORY_BYTES", 2**60)  # as if /dev/shm were 64 MiB
    assert "holds only" in (memory_unavailable() or "")


@needs_memory
def test_a_nearly_full_tmpfs_sends_new_layers_to_disk(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    chosen = Scratch.choose("memory", state_dir)
    try:
        assert chosen.place() != chosen.disk
        monkeypatch.setattr(scratch, "_free_fraction", lambda _path: 0.05)
        assert chosen.place() == chosen.disk
    finally:
        chosen.close()


@needs_memory
def test_a_directory_someone_else_may_write_is_not_used(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    shared = tmp_path / "shm"
    shared.mkdir()
    (shared / f"rollbox-{os.geteuid()}").mkdir(mode=0o777)
    os.chmod(shared / f"rollbox-{os.geteuid()}", 0o777)
    monkeypatch.setattr(scratch, "SHM", shared)
    chosen = Scratch.choose("auto", state_dir)
    assert chosen.place() == chosen.disk  # and a warning, not a sandbox in a shared place


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
    in_memory = placed.scratch.memory is not None
    assert sandbox.directory.is_relative_to(scratch.SHM) == in_memory
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
