"""The image store's bookkeeping on disk: refs → digest (``index.json``) and each
image's last use (the mtime of its ``meta.json``).

Both are caches for other processes and later runs; this process keeps the truth in
memory. Saving them means reading, writing, fsyncing and renaming files, and on a busy
disk a journal commit can hold such calls for tens of milliseconds. So on an event loop
changes are saved in a thread a moment later, coalesced; without a running loop (the
``rollbox images`` commands) they are saved at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

SAVE_DELAY_S = 0.5
"""How long changes made on an event loop wait, so that a burst of them is one save."""

Refs = dict[str, dict[str, Any]]


class ImagesIndex:
    def __init__(self, path: Path, images: Path) -> None:
        self.path = path
        self._images = images
        self.refs: Refs = self._read()
        self._unsaved: dict[str, dict[str, Any] | None] = {}
        self._last_use: dict[str, float] = {}  # digest → time, not written yet
        self._pending_lock = threading.Lock()
        self._file_lock = threading.Lock()
        self._saving: asyncio.Task[None] | None = None
        self._hurry: asyncio.Event | None = None

    def update(self, changes: Mapping[str, dict[str, Any] | None]) -> None:
        """Apply ``changes`` to the refs (None deletes one) and save them."""
        for key, rec in changes.items():
            if rec is None:
                self.refs.pop(key, None)
            else:
                self.refs[key] = rec
        with self._pending_lock:
            self._unsaved.update(changes)
        self._save_soon()

    def used(self, digest: str, when: float) -> None:
        """Record that the image ``digest`` was used at ``when`` (seconds since the epoch)."""
        with self._pending_lock:
            self._last_use[digest] = when
        self._save_soon()

    async def flush(self) -> None:
        """Save everything changed so far, now (off the loop)."""
        if self._saving_here() and self._saving is not None and self._hurry is not None:
            self._hurry.set()
            await asyncio.shield(self._saving)
        if self._pending():
            await asyncio.to_thread(self.save)

    def save(self) -> None:
        """Write what changed since the last save (any thread)."""
        with self._pending_lock:
            changes, self._unsaved = self._unsaved, {}
            last_use, self._last_use = self._last_use, {}
        for digest, when in last_use.items():
            with contextlib.suppress(OSError):  # evicted meanwhile
                os.utime(self._images / digest.removeprefix("sha256:") / "meta.json",
                         (when, when))
        if changes:
            try:
                with self._file_lock:
                    self._write(changes)
            except BaseException:
                with self._pending_lock:  # keep them for the next save; newer ones win
                    self._unsaved = {**changes, **self._unsaved}
                raise

    def _saving_here(self) -> bool:
        """A save is scheduled on the running loop (one left on a loop that has since
        closed never runs: the next change schedules a new one)."""
        task = self._saving
        return task is not None and not task.done() and (
            task.get_loop() is asyncio.get_running_loop())

    def _pending(self) -> bool:
        return bool(self._unsaved or self._last_use)

    def _save_soon(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.save()
            return
        if not self._saving_here():
            self._hurry = asyncio.Event()
            self._saving = loop.create_task(self._save_later(self._hurry))

    async def _save_later(self, hurry: asyncio.Event) -> None:
        try:
            while self._pending():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(hurry.wait(), SAVE_DELAY_S)
                await asyncio.to_thread(self.save)
        except Exception:  # a full disk must not crash the loop; the next save retries
            log.exception("saving the image index %s failed", self.path)
        finally:
            if self._saving is asyncio.current_task():
                self._saving = None

    def _read(self) -> Refs:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("image index %s unreadable (%s); starting a new one", self.path, exc)
            return {}
        refs = data.get("refs") if isinstance(data, dict) else None
        return {str(k): v for k, v in (refs or {}).items() if isinstance(v, dict)}

    def _write(self, changes: Mapping[str, dict[str, Any] | None]) -> None:
        """Merge ``changes`` into the file, atomically: another process sharing the store
        may have written it since we read it."""
        refs = self._read()
        for key, rec in changes.items():
            if rec is None:
                refs.pop(key, None)
            else:
                refs[key] = rec
        tmp = self.path.with_name(f".index.{os.getpid()}.{secrets.token_hex(4)}")
        with open(tmp, "w") as f:
            json.dump({"version": 1, "refs": refs}, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
