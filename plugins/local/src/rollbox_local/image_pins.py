"""Pins every process sharing an image store can see: one lock file per image.

A process that pins an image (a sandbox of it is running) holds a shared ``flock`` on
``pins/<digest>`` for as long as its pin count is above zero. Removing or evicting an
image takes that lock exclusively without waiting, and refuses (or picks another image)
when it cannot: some process, this one or another, is using it. Locks die with their
process, so a crashed job never leaves an image pinned for ever.

Lock files are never deleted: a deleted one could be locked by one process through its
old inode while another locks a new file of the same name.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path


class SharedPins:
    """This process's shared locks on the images it pins, by digest."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._held: dict[str, int] = {}

    def _open(self, digest: str) -> int:
        return os.open(self.directory / digest.removeprefix("sha256:"),
                       os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)

    def try_hold(self, digest: str) -> bool:
        """Take the shared lock of ``digest`` if nobody holds it exclusively right now
        (a removal in progress); False if someone does. Holding it twice is a no-op."""
        if digest in self._held:
            return True
        fd = self._open(digest)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._held[digest] = fd
        return True

    def hold(self, digest: str) -> None:
        """Take the shared lock of ``digest``, waiting out a removal in progress
        (blocking: call it in a thread)."""
        if digest in self._held:
            return
        fd = self._open(digest)
        fcntl.flock(fd, fcntl.LOCK_SH)
        self._held[digest] = fd

    def release(self, digest: str) -> None:
        fd = self._held.pop(digest, None)
        if fd is not None:
            os.close(fd)

    @contextlib.contextmanager
    def exclusive(self, digest: str) -> Iterator[bool]:
        """Yields True while holding ``digest`` exclusively: no process pins it; False
        (holding nothing) when one does."""
        fd = self._open(digest)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(fd)

    def close(self) -> None:
        for digest in list(self._held):
            self.release(digest)
