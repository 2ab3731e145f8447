"""The status pipe of one request to a zygote child or a sandbox helper: lines such as
``X 0`` or ``E 2 No such file`` (see ``_agent.py``), read on the event loop."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass

FINAL_TAGS = ("X", "E", "T", "F")


@dataclass(frozen=True)
class Outcome:
    """The helper's last status line: a tag (X, E, T, F) and the rest of the line."""

    tag: str
    rest: str


class StatusLine:
    """Reads a helper's status pipe on the event loop until a final line (or EOF)."""

    def __init__(self, fd: int) -> None:
        self._loop = asyncio.get_running_loop()
        self._fd = fd
        self._buf = b""
        self.final: asyncio.Future[Outcome | None] = self._loop.create_future()
        self.started: asyncio.Future[None] = self._loop.create_future()
        """Set on an ``S`` line (a command began), or with ``final``."""
        os.set_blocking(fd, False)
        self._loop.add_reader(fd, self._readable)

    def _readable(self) -> None:
        try:
            chunk = os.read(self._fd, 4096)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._finish(None)
            return
        self._buf += chunk
        *lines, self._buf = self._buf.split(b"\n")
        for line in lines:
            tag, _, rest = line.decode(errors="replace").partition(" ")
            if tag == "S" and not self.started.done():
                self.started.set_result(None)
            if tag in FINAL_TAGS:
                self._finish(Outcome(tag, rest))

    def _finish(self, outcome: Outcome | None) -> None:
        if not self.final.done():
            self.final.set_result(outcome)
        if not self.started.done():
            self.started.set_result(None)
        self.close()

    def close(self) -> None:
        if self._fd >= 0:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1
