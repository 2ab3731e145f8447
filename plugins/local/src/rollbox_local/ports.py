"""``LocalSandbox.endpoint(port)``: a listener on the host's loopback per exposed port,
relaying each connection it accepts to a new connection to the port inside.

The inside end comes from ``LocalSandbox.open_port``: the sandbox's agent connects to
127.0.0.1:PORT in the sandbox's own network namespace and passes the connected socket
back. The sandbox gains no network by this: nothing in it can reach the host side, and
nothing on the host reaches the port but through this relay.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from socket import socket

from rollbox.errors import RollboxError, SandboxLostError
from rollbox.relay import LoopbackListener, splice, streams
from rollbox.sandbox import Endpoint, check_port

Opener = Callable[[int], Awaitable[socket]]


class PortRelays:
    """The exposed ports of one sandbox. ``reset`` (at the sandbox's reset) and
    ``aclose`` (at its close) stop them and every connection they carry."""

    def __init__(self, sandbox_id: str, open_port: Opener) -> None:
        self.sandbox_id = sandbox_id
        self._open_port = open_port
        self._listeners: dict[int, LoopbackListener] = {}
        self._starting: dict[int, asyncio.Future[LoopbackListener]] = {}
        self.closed = False

    async def endpoint(self, port: int) -> Endpoint:
        check_port(port)
        listener = self._listeners.get(port)
        if listener is None:
            if port not in self._starting:
                self._starting[port] = asyncio.ensure_future(self._start(port))
            try:
                listener = await asyncio.shield(self._starting[port])
            finally:
                self._starting.pop(port, None)
        return Endpoint(listener.url)

    async def _start(self, port: int) -> LoopbackListener:
        listener = LoopbackListener(lambda r, w: self._relay(port, r, w))
        await listener.start()
        if self.closed:
            await listener.aclose()
            raise SandboxLostError(f"sandbox {self.sandbox_id} is closed",
                                   sandbox_id=self.sandbox_id)
        self._listeners[port] = listener
        return listener

    async def _relay(self, port: int, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
        try:
            inside = await self._open_port(port)
        except (RollboxError, OSError):
            return  # nothing listens there (or the sandbox is gone): close the connection
        try:
            inner_reader, inner_writer = await asyncio.open_connection(sock=inside)
        except OSError:
            inside.close()
            return
        await splice(streams(reader, writer), streams(inner_reader, inner_writer))

    @property
    def listening(self) -> list[int]:
        """The host ports of the listeners (for ``leftovers``)."""
        return [listener.port for listener in self._listeners.values()]

    async def reset(self) -> None:
        """Stop every relay (a reset sandbox exposes nothing); ``endpoint`` opens anew."""
        if not self._starting and not self._listeners:
            return  # what nearly every reset finds: it runs on the reset's path
        for future in self._starting.values():
            future.cancel()
        listeners, self._listeners = list(self._listeners.values()), {}
        with contextlib.suppress(Exception):
            await asyncio.gather(*(listener.aclose() for listener in listeners))

    async def aclose(self) -> None:
        self.closed = True
        await self.reset()
