"""A WebSocket client (RFC 6455) over the remote backend's HTTP client: what streaming
commands and port tunnels of ``rollbox serve`` ride on.

Messages are whole (fragments are joined); pings are answered; client frames are
masked as the RFC requires (with one big-integer XOR, not a Python loop per byte).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import os
import struct
from typing import Any

from rollbox.errors import ServerUnavailableError, UsageError

from rollbox_remote.http import Connection, HttpClient

TEXT, BINARY, CLOSE, PING, PONG = 0x1, 0x2, 0x8, 0x9, 0xA
MAX_MESSAGE = 64 << 20
FRAME = 1 << 20
"""Largest frame this client sends; longer messages go out in several."""
_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class WebSocketClosed(Exception):
    """The other side closed the WebSocket (``code`` and ``reason`` say why)."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"WebSocket closed ({code}: {reason})")
        self.code, self.reason = code, reason


class WebSocket:
    def __init__(self, conn: Connection, client: HttpClient) -> None:
        self._conn = conn
        self._client = client
        self._send_lock = asyncio.Lock()
        self.closed = False

    @classmethod
    async def connect(cls, client: HttpClient, path: str, *, timeout: float = 30.0) -> WebSocket:
        key = base64.b64encode(os.urandom(16)).decode()
        conn = await client.upgrade(path, key, timeout=timeout)
        expected = base64.b64encode(hashlib.sha1(key.encode() + _GUID).digest()).decode()
        if conn.headers.get("sec-websocket-accept") != expected:
            conn.close()
            raise UsageError(f"the server at {client.address} answered a WebSocket upgrade "
                             "wrongly; is this a rollbox server?")
        return cls(conn, client)

    # -- sending -----------------------------------------------------------------------

    async def send_bytes(self, data: bytes) -> None:
        for start in range(0, max(len(data), 1), FRAME):
            await self._send(BINARY, data[start:start + FRAME])

    async def send_json(self, message: dict[str, Any]) -> None:
        await self._send(TEXT, json.dumps(message, separators=(",", ":")).encode())

    async def _send(self, opcode: int, payload: bytes) -> None:
        if self.closed:
            raise self._client.unavailable("the stream to it is closed")
        mask = os.urandom(4)
        n = len(payload)
        if n < 126:
            head = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
        elif n < 65536:
            head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
        else:
            head = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
        async with self._send_lock:
            try:
                self._conn.writer.write(head + mask + _masked(payload, mask))
                await self._conn.writer.drain()
            except (ConnectionError, OSError) as exc:
                self.abort()
                raise self._client.unavailable(f"the stream broke ({exc!r})") from None

    # -- receiving ---------------------------------------------------------------------

    async def receive(self) -> tuple[int, bytes]:
        """The next message, as (TEXT or BINARY, payload). Raises WebSocketClosed when
        the server closes, ServerUnavailableError when the connection breaks."""
        parts: list[bytes] = []
        kind = 0
        try:
            while True:
                fin, opcode, payload = await self._frame()
                if opcode == PING:
                    await self._send(PONG, payload)
                    continue
                if opcode == PONG:
                    continue
                if opcode == CLOSE:
                    code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1005
                    reason = payload[2:].decode("utf-8", "replace")
                    await self.close(code)
                    raise WebSocketClosed(code, reason)
                if opcode in (TEXT, BINARY):
                    kind, parts = opcode, [payload]
                elif opcode == 0 and kind:
                    parts.append(payload)
                else:
                    raise ValueError(f"unexpected WebSocket opcode {opcode}")
                if sum(map(len, parts)) > MAX_MESSAGE:
                    raise ValueError("WebSocket message too large")
                if fin:
                    return kind, b"".join(parts)
        except (ConnectionError, asyncio.IncompleteReadError, OSError, ValueError) as exc:
            self.abort()
            raise self._client.unavailable(f"the stream broke ({exc!r})") from None

    async def _frame(self) -> tuple[bool, int, bytes]:
        reader = self._conn.reader
        b0, b1 = await reader.readexactly(2)
        n = b1 & 0x7F
        if n == 126:
            n = struct.unpack("!H", await reader.readexactly(2))[0]
        elif n == 127:
            n = struct.unpack("!Q", await reader.readexactly(8))[0]
        if n > MAX_MESSAGE:
            raise ValueError("WebSocket frame too large")
        mask = await reader.readexactly(4) if b1 & 0x80 else b""
        payload = await reader.readexactly(n)
        return bool(b0 & 0x80), b0 & 0x0F, _masked(payload, mask) if mask else payload

    # -- closing -----------------------------------------------------------------------

    async def close(self, code: int = 1000) -> None:
        if self.closed:
            return
        with contextlib.suppress(ServerUnavailableError):
            await self._send(CLOSE, struct.pack("!H", code))
        self.abort()

    def abort(self) -> None:
        """Drop the connection without a closing handshake."""
        self.closed = True
        self._conn.close()


def _masked(data: bytes, mask: bytes) -> bytes:
    n = len(data)
    if not n:
        return b""
    key = (mask * (n // 4 + 1))[:n]
    return (int.from_bytes(data, "little") ^ int.from_bytes(key, "little")).to_bytes(n, "little")
