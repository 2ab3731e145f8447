"""One running command, seen from the backend: its pipes, its status lines, its end.

All reading happens with ``loop.add_reader`` on non-blocking pipes: no thread per
command, no unbounded buffer (output past the cap is read and dropped, and flagged).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field

CHUNK = 65536


@dataclass
class _Capture:
    limit: int
    data: bytearray = field(default_factory=bytearray)
    truncated: bool = False

    def add(self, chunk: bytes) -> None:
        room = self.limit - len(self.data)
        if room > 0:
            self.data += chunk[:room]
        if len(chunk) > room:
            self.truncated = True


@dataclass
class Status:
    received: bool = False  # a helper took the request up ("R")
    command: int | None = None  # pid of the command inside the sandbox
    exit_code: int | None = None
    error: tuple[int, str] | None = None  # (errno, message) when it could not start
    killed: bool = False


class Execution:
    """Collects a command's stdout/stderr/status; ``on_chunk`` streams instead of capturing."""

    def __init__(
        self,
        *,
        request_id: int,
        stdout: int,
        stderr: int,
        status: int,
        stdin: int | None,
        stdin_data: bytes | None,
        limit: int,
        on_chunk: Callable[[str, bytes], None] | None = None,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self.request_id = request_id
        self.status = Status()
        self.captures = {"stdout": _Capture(limit), "stderr": _Capture(limit)}
        self._on_chunk = on_chunk
        self._open: dict[int, str] = {}
        self._status_buf = b""
        self.ended = self._loop.create_future()  # set on X, E, K or status EOF
        self.streams_closed = self._loop.create_future()
        for fd, name in ((stdout, "stdout"), (stderr, "stderr"), (status, "status")):
            os.set_blocking(fd, False)
            self._open[fd] = name
            self._loop.add_reader(fd, self._readable, fd)
        self._stdin = stdin
        self._stdin_data = memoryview(stdin_data or b"")
        self._eof_pending = False
        if stdin is not None:
            os.set_blocking(stdin, False)
            if self._stdin_data:
                self._loop.add_writer(stdin, self._writable)
            elif on_chunk is None:
                self.close_stdin()

    # -- stdin -------------------------------------------------------------------------

    def _writable(self) -> None:
        assert self._stdin is not None
        try:
            n = os.write(self._stdin, self._stdin_data[:CHUNK])
        except BlockingIOError:
            return
        except OSError:  # the command closed its stdin: the rest is unwanted
            n = len(self._stdin_data)
        self._stdin_data = self._stdin_data[n:]
        if not self._stdin_data:
            self._loop.remove_writer(self._stdin)
            if self._on_chunk is None or self._eof_pending:
                self.close_stdin()

    def feed_stdin(self, data: bytes) -> None:
        if self._stdin is None or self._eof_pending:
            raise BrokenPipeError("stdin is closed")
        pending = bool(self._stdin_data)
        self._stdin_data = memoryview(bytes(self._stdin_data) + data)
        if not pending:
            self._loop.add_writer(self._stdin, self._writable)

    def end_stdin(self) -> None:
        """EOF once what was fed is written (``close_stdin`` drops what is still queued)."""
        if self._stdin is not None and self._stdin_data:
            self._eof_pending = True
        else:
            self.close_stdin()

    def close_stdin(self) -> None:
        if self._stdin is not None:
            self._loop.remove_writer(self._stdin)
            os.close(self._stdin)
            self._stdin = None

    # -- output and status -------------------------------------------------------------

    def _readable(self, fd: int) -> None:
        name = self._open[fd]
        try:
            chunk = os.read(fd, CHUNK)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._close_fd(fd)
            return
        if name == "status":
            self._status_buf += chunk
            *lines, self._status_buf = self._status_buf.split(b"\n")
            for line in lines:
                self._status_line(line.decode(errors="replace"))
        elif self._on_chunk is not None:
            self._on_chunk(name, chunk)
        else:
            self.captures[name].add(chunk)

    def _status_line(self, line: str) -> None:
        """Parse one line from the agent. The agent runs inside the sandbox, so a line
        that makes no sense is ignored rather than trusted."""
        try:
            self._parse_status(line)
        except ValueError:
            return

    def _parse_status(self, line: str) -> None:
        tag, _, rest = line.partition(" ")
        st = self.status
        if tag == "R":
            st.received = True
        elif tag == "S":
            st.command = int(rest)
        elif tag == "X":
            st.exit_code = int(rest)
            _resolve(self.ended, None)
        elif tag == "E":
            code, _, message = rest.partition(" ")
            st.error = (int(code), message)
            _resolve(self.ended, None)
        elif tag == "K":
            st.killed = True
            _resolve(self.ended, None)

    def _close_fd(self, fd: int) -> None:
        name = self._open.pop(fd)
        self._loop.remove_reader(fd)
        os.close(fd)
        if name == "status":
            _resolve(self.ended, None)
        if not any(n != "status" for n in self._open.values()):
            _resolve(self.streams_closed, None)

    def drain(self) -> None:
        """Read whatever output is already buffered, without waiting for EOF.

        Background processes may hold the pipes open long after the command ended;
        what the command itself wrote is in the pipe by the time its exit is reported.
        """
        for fd in [fd for fd, name in self._open.items() if name != "status"]:
            while fd in self._open:
                try:
                    chunk = os.read(fd, CHUNK)
                except BlockingIOError:
                    break
                if not chunk:
                    self._close_fd(fd)
                    break
                name = self._open[fd]
                if self._on_chunk is not None:
                    self._on_chunk(name, chunk)
                else:
                    self.captures[name].add(chunk)

    async def finish(self, grace: float = 0.0) -> None:
        """After the end: give streams ``grace`` seconds to close, then stop reading."""
        if grace and not self.streams_closed.done():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self.streams_closed), grace)
        self.drain()
        self.close()

    def close(self) -> None:
        for fd in list(self._open):
            self._close_fd(fd)
        self.close_stdin()


def _resolve(future: asyncio.Future[None], value: None) -> None:
    if not future.done():
        future.set_result(value)
