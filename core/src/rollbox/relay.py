"""Byte relays between two connections, and loopback listeners that start them.

``Sandbox.endpoint(port)`` hands out an address on the host's loopback; behind it a
relay carries each accepted connection to the port inside the sandbox (over the local
backend's agent, or a WebSocket tunnel through ``rollbox serve``). Half-closes pass
through, so request/response protocols that shut their write side still work.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Protocol

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
CHUNK = 256 * 1024


class Source(Protocol):
    """One direction of a connection, read side (``asyncio.StreamReader`` is one)."""

    async def read(self, n: int) -> bytes:
        """Up to ``n`` bytes; b"" at the end."""


class Sink(Protocol):
    """One direction of a connection, write side."""

    async def send(self, data: bytes) -> None: ...

    async def send_eof(self) -> None:
        """Half-close: nothing more will be sent."""

    def close(self) -> None:
        """Close the whole connection, now."""


class StreamSink:
    """An ``asyncio.StreamWriter`` as a Sink."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def send_eof(self) -> None:
        if self.writer.can_write_eof():
            self.writer.write_eof()

    def close(self) -> None:
        self.writer.close()


Connection = tuple[Source, Sink]


def streams(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> Connection:
    return reader, StreamSink(writer)


async def pipe(source: Source, sink: Sink) -> None:
    """Copy ``source`` to ``sink`` until EOF, then half-close ``sink``."""
    try:
        while data := await source.read(CHUNK):
            await sink.send(data)
        await sink.send_eof()
    except (ConnectionError, OSError):
        sink.close()


async def splice(a: Connection, b: Connection) -> None:
    """Relay both ways until both directions end, then close both connections."""
    try:
        await asyncio.gather(pipe(a[0], b[1]), pipe(b[0], a[1]))
    finally:
        a[1].close()
        b[1].close()


class LoopbackListener:
    """A TCP listener on 127.0.0.1 (a free port) that runs ``handler`` per connection;
    ``aclose`` stops it and every relay it started."""

    def __init__(self, handler: Handler) -> None:
        self._handler = handler
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._handler(reader, writer)
        except (ConnectionError, OSError):
            pass
        except asyncio.CancelledError:
            # ``aclose`` cancelled it: end as done, since asyncio (3.11) logs a connection
            # handler that ends cancelled as an error in a callback.
            pass
        finally:
            writer.close()
            self._tasks.discard(task)

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        tasks, self._tasks = list(self._tasks), set()
        for task in tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)
