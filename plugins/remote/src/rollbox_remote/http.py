"""A small HTTP/1.1 client on asyncio streams: keep-alive connections to one server,
JSON or raw bodies, streamed uploads and downloads, and WebSocket upgrades.

Core depends on nothing but pluggy, so the ``remote`` backend brings its own client
rather than httpx or aiohttp. It speaks exactly what ``rollbox serve`` answers
(Content-Length or chunked bodies, keep-alive), and turns every way a server can fail
to answer (refused, reset, closed early, silent past the deadline) into a retryable
``ServerUnavailableError``, never a hang.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollbox.errors import AuthenticationError, RollboxError, ServerUnavailableError, UsageError

from rollbox_remote import protocol
from rollbox_remote.address import Address

CHUNK = 1 << 20
READ = 16 << 20
"""Bytes asked of the stream reader at once: more than it ever buffers (2 MiB), so each
read takes the whole buffer and Python 3.11 does not memmove what is left."""
IDLE_KEEP_S = 20.0
"""Connections idle longer are not reused (the server drops idle ones after 75 s)."""
MAX_IDLE = 64
MAX_HEAD = 64 * 1024

Sink = Callable[[bytes], Awaitable[None]]


@dataclass
class Response:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError:
            raise UsageError(
                f"the server answered HTTP {self.status} with a body that is not JSON "
                f"({self.body[:80]!r}); is this a rollbox server?"
            ) from None


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.reused = False
        self.idle_since = 0.0
        self.headers: dict[str, str] = {}
        """The response head of a WebSocket upgrade."""

    def close(self) -> None:
        self.writer.close()


class _Interrupted(Exception):
    """A reused connection failed before the response began: safe to send again."""


class HttpClient:
    """Requests to one rollbox server, with its token, over pooled connections."""

    def __init__(self, address: Address, token: str, *,
                 ssl_context: ssl.SSLContext | None = None,
                 connect_timeout_s: float = 10.0, client_id: str = "") -> None:
        self.address = address
        self.token = token
        self.client_id = client_id
        """Sent as ``X-Rollbox-Client``: the server keeps this client's warm targets
        while it hears from it."""
        self.ssl_context = ssl_context
        self.connect_timeout_s = connect_timeout_s
        self._idle: list[Connection] = []

    # -- connections -------------------------------------------------------------------

    async def _connect(self) -> Connection:
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                reader, writer = await self.address.connect(self.ssl_context)
        except TimeoutError:
            raise self.unavailable(f"no connection within {self.connect_timeout_s}s") from None
        except ssl.SSLError as exc:
            raise UsageError(f"TLS with the rollbox server at {self.address} failed: {exc}; "
                             "pass its certificate authority (ca_file=, $ROLLBOX_CA)") from None
        except OSError as exc:
            raise self.unavailable(f"cannot connect ({exc.strerror or exc})") from None
        return Connection(reader, writer)

    async def _checkout(self) -> Connection:
        now = asyncio.get_running_loop().time()
        while self._idle:
            conn = self._idle.pop()
            if now - conn.idle_since < IDLE_KEEP_S and not conn.reader.at_eof():
                conn.reused = True
                return conn
            conn.close()
        return await self._connect()

    def _checkin(self, conn: Connection) -> None:
        if len(self._idle) >= MAX_IDLE:
            conn.close()
            return
        conn.idle_since = asyncio.get_running_loop().time()
        self._idle.append(conn)

    async def aclose(self) -> None:
        """Close the idle connections (a later request opens a new one)."""
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def unavailable(self, why: str) -> ServerUnavailableError:
        return ServerUnavailableError(
            f"the rollbox server at {self.address} is unavailable: {why}. Is `rollbox serve` "
            "running there? (retryable)"
        )

    # -- requests ----------------------------------------------------------------------

    async def request(
        self,
        method: str,
        path: str,
        *,
        json_body: object = None,
        body: bytes | bytearray | memoryview | None = None,
        upload: Path | None = None,
        sink: Sink | None = None,
        timeout: float,
    ) -> Response:
        """Send one request and read its answer within ``timeout`` seconds.

        The body is ``json_body`` (as JSON), ``body`` (raw bytes) or the file ``upload``
        (streamed). A 2xx answer's body goes to ``sink`` chunk by chunk if given. An
        error answer raises the error it carries, as its own type."""
        if upload is not None:
            size = (await asyncio.to_thread(upload.stat)).st_size
            content_type = "application/octet-stream"
        elif json_body is not None:
            body = json.dumps(json_body, separators=(",", ":")).encode()
            size, content_type = len(body), "application/json"
        else:
            size = len(body) if body is not None else 0
            content_type = "application/octet-stream"
        head = (f"{method} {path} HTTP/1.1\r\nHost: {self.address.host_header}\r\n"
                f"Authorization: Bearer {self.token}\r\nContent-Length: {size}\r\n")
        if self.client_id:
            head += f"X-Rollbox-Client: {self.client_id}\r\n"
        if size:
            head += f"Content-Type: {content_type}\r\n"
        data = (head + "\r\n").encode("latin-1")
        try:
            async with asyncio.timeout(timeout):
                for _ in range(2):
                    conn = await self._checkout()
                    try:
                        return await self._exchange(conn, data, body, upload, size, sink)
                    except _Interrupted:
                        continue
                raise self.unavailable("it closed the connection twice")
        except TimeoutError:
            raise self.unavailable(f"no answer to {method} {path} within {timeout:.0f}s") from None

    async def _exchange(self, conn: Connection, head: bytes,
                        body: bytes | bytearray | memoryview | None,
                        upload: Path | None, upload_size: int,
                        sink: Sink | None) -> Response:
        started = False
        try:
            if body and len(body) <= CHUNK:  # one send: the server wakes once, not twice
                conn.writer.write(head + body)
            else:
                conn.writer.write(head)
                if body:
                    await _send_bytes(conn.writer, body)
            if upload is not None:
                await _send_file(conn.writer, upload, upload_size)
            await conn.writer.drain()
            try:
                head = await conn.reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError as exc:
                if not exc.partial and conn.reused:
                    raise _Interrupted from None
                raise
            started = True
            status, headers = _parse_head(head)
            ok = 200 <= status < 300
            chunks = _read_body(conn.reader, headers)
            if ok and sink is not None:
                async for chunk in chunks:
                    await sink(chunk)
                payload = b""
            else:
                payload = b"".join([c async for c in chunks])
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError) as exc:
            conn.close()
            if conn.reused and not started:
                raise _Interrupted from None
            raise self.unavailable(f"the connection broke ({exc!r})") from None
        except (OSError, ValueError, asyncio.LimitOverrunError) as exc:
            conn.close()
            raise self.unavailable(f"the connection failed ({exc!r})") from None
        except BaseException:  # cancelled mid-exchange: the connection is in an unknown state
            conn.close()
            raise
        if headers.get("connection", "").lower() == "close":
            conn.close()
        else:
            self._checkin(conn)
        response = Response(status, headers, payload)
        if not ok:
            raise self.error_of(response)
        return response

    def error_of(self, response: Response) -> RollboxError:
        """The error an error answer carries (AuthenticationError for any 401)."""
        try:
            data = json.loads(response.body)
            error = protocol.error_from_json(data["error"])
        except (ValueError, KeyError, TypeError):
            error = UsageError(
                f"the server at {self.address} answered HTTP {response.status} "
                f"({response.body[:120]!r}); is this a rollbox server, protocol "
                f"{protocol.VERSION}?"
            )
        if response.status == 401 and not isinstance(error, AuthenticationError):
            return AuthenticationError(
                f"the rollbox server at {self.address} refused the token; set ROLLBOX_TOKEN "
                "(in Python, RemoteBackend(token=...))")
        return error

    async def upgrade(self, path: str, key: str, *, timeout: float) -> Connection:
        """A new connection switched to WebSocket at ``path`` (see ``websocket.py``)."""
        head = (f"GET {path} HTTP/1.1\r\nHost: {self.address.host_header}\r\n"
                f"Authorization: Bearer {self.token}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                "Sec-WebSocket-Version: 13\r\n\r\n").encode("latin-1")
        try:
            async with asyncio.timeout(timeout):
                conn = await self._connect()
                try:
                    conn.writer.write(head)
                    await conn.writer.drain()
                    status, headers = _parse_head(
                        await conn.reader.readuntil(b"\r\n\r\n"))
                    if status != 101:
                        body = b"".join([c async for c in _read_body(conn.reader, headers)])
                        conn.close()
                        raise self.error_of(Response(status, headers, body))
                except (ConnectionError, asyncio.IncompleteReadError, OSError,
                        ValueError, asyncio.LimitOverrunError) as exc:
                    conn.close()
                    raise self.unavailable(f"the connection broke ({exc!r})") from None
                except BaseException:
                    conn.close()
                    raise
        except TimeoutError:
            raise self.unavailable(f"no answer to GET {path} within {timeout:.0f}s") from None
        conn.headers = headers
        return conn


async def _send_bytes(writer: asyncio.StreamWriter,
                      data: bytes | bytearray | memoryview) -> None:
    """Write ``data`` a chunk at a time, draining in between: one huge write would sit in
    the transport's buffer, which Python 3.11 shifts by memmove after every send."""
    view = memoryview(data)
    for start in range(0, len(view), CHUNK):
        writer.write(view[start:start + CHUNK])
        await writer.drain()


async def _send_file(writer: asyncio.StreamWriter, path: Path, size: int) -> None:
    """The first ``size`` bytes of ``path``, by ``sendfile`` where the transport allows
    (no copy through Python), else read and written a chunk at a time."""
    await writer.drain()
    with await asyncio.to_thread(path.open, "rb") as f:
        sent = await asyncio.get_running_loop().sendfile(writer.transport, f, 0, size)
    if sent != size:
        raise ConnectionResetError(f"{path} changed size while it was sent")


def _parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    """Status and headers (lower-case names) of a response head read whole."""
    if len(head) > MAX_HEAD:
        raise ValueError("oversized response head")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(None, 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise ValueError(f"not an HTTP response: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers


async def _read_body(reader: asyncio.StreamReader,
                     headers: dict[str, str]) -> AsyncIterator[bytes]:
    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:
            size = int((await reader.readline()).split(b";", 1)[0].strip() or b"x", 16)
            if size == 0:
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass
                return
            while size:
                chunk = await reader.read(min(size, READ))
                if not chunk:
                    raise asyncio.IncompleteReadError(chunk, size)
                size -= len(chunk)
                yield chunk
            await reader.readexactly(2)
    elif "content-length" in headers:
        left = int(headers["content-length"])
        while left:
            chunk = await reader.read(min(left, READ))
            if not chunk:
                raise asyncio.IncompleteReadError(chunk, left)
            left -= len(chunk)
            yield chunk
    elif headers.get("connection", "").lower() == "close":
        while chunk := await reader.read(READ):
            yield chunk
