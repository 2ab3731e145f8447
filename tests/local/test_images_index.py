"""The image store's index: saved off the event loop, coalesced, never lost."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
from rollbox_local import images_index
from rollbox_local.images_index import ImagesIndex


def on_disk(path: Path) -> dict[str, object]:
    return json.loads(path.read_text())["refs"] if path.exists() else {}


def make_index(tmp_path: Path) -> ImagesIndex:
    (tmp_path / "images").mkdir(exist_ok=True)
    return ImagesIndex(tmp_path / "index.json", tmp_path / "images")


def test_without_an_event_loop_changes_are_saved_at_once(tmp_path: Path) -> None:
    index = make_index(tmp_path)
    index.update({"py": {"digest": "sha256:aa"}})
    assert on_disk(index.path) == {"py": {"digest": "sha256:aa"}}
    index.update({"py": None})
    assert on_disk(index.path) == {}


async def test_on_an_event_loop_a_burst_of_changes_is_one_save_off_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    index = make_index(tmp_path)
    loop_thread = asyncio.get_running_loop()._thread_id  # type: ignore[attr-defined]
    writes: list[tuple[int, list[str]]] = []
    real_write = ImagesIndex._write

    def counting_write(self: ImagesIndex, changes: dict[str, object]) -> None:
        import threading

        writes.append((threading.get_ident(), sorted(changes)))
        real_write(self, changes)  # type: ignore[arg-type]

    monkeypatch.setattr(ImagesIndex, "_write", counting_write)
    for n in range(50):
        index.update({f"ref{n}": {"digest": f"sha256:{n:02x}"}})
    assert not index.path.exists()  # nothing written on the loop
    assert index.refs["ref7"] == {"digest": "sha256:07"}  # but known at once in memory
    await index.flush()
    assert len(writes) == 1 and writes[0][0] != loop_thread
    assert len(writes[0][1]) == 50 and len(on_disk(index.path)) == 50


async def test_changes_are_saved_a_moment_later_without_a_flush(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(images_index, "SAVE_DELAY_S", 0.01)
    index = make_index(tmp_path)
    index.update({"py": {"digest": "sha256:aa"}})
    for _ in range(200):
        await asyncio.sleep(0.01)
        if index.path.exists():
            break
    assert on_disk(index.path) == {"py": {"digest": "sha256:aa"}}


async def test_last_use_lands_on_meta_json_mtime(tmp_path: Path) -> None:
    index = make_index(tmp_path)
    meta = tmp_path / "images" / "ab" / "meta.json"
    meta.parent.mkdir()
    meta.write_text("{}")
    index.used("sha256:ab", 1_000_000.0)
    index.used("sha256:gone", 2_000_000.0)  # evicted meanwhile: ignored
    assert meta.stat().st_mtime != 1_000_000.0
    await index.flush()
    assert meta.stat().st_mtime == 1_000_000.0


async def test_a_failed_save_keeps_the_changes_for_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    index = make_index(tmp_path)
    real_write = ImagesIndex._write

    def disk_full(*_: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ImagesIndex, "_write", disk_full)
    index.update({"a": {"digest": "sha256:01"}})
    with pytest.raises(OSError):
        await index.flush()
    index.update({"b": {"digest": "sha256:02"}})
    monkeypatch.setattr(ImagesIndex, "_write", real_write)
    await index.flush()
    assert set(on_disk(index.path)) == {"a", "b"}


def test_a_save_merges_what_another_process_wrote_meanwhile(tmp_path: Path) -> None:
    index = make_index(tmp_path)
    other = make_index(tmp_path)
    other.update({"theirs": {"digest": "sha256:01"}})
    index.update({"ours": {"digest": "sha256:02"}})
    assert set(on_disk(index.path)) == {"theirs", "ours"}
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".index.")]


def test_a_save_left_on_a_closed_loop_is_made_on_the_next(tmp_path: Path) -> None:
    index = make_index(tmp_path)

    async def change(key: str) -> None:
        index.update({key: {"digest": "sha256:01"}})  # the loop ends before it is saved

    asyncio.run(change("first"))
    assert not index.path.exists()

    async def change_and_flush() -> None:
        index.update({"second": {"digest": "sha256:02"}})
        await index.flush()

    asyncio.run(change_and_flush())
    assert set(on_disk(index.path)) == {"first", "second"}
