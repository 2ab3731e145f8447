"""The server's WebSocket routes: streaming commands and port tunnels.

A streaming command (``GET /v1/sandboxes/{id}/stream``)::

    client → {"type": "start", "request": ExecRequest}     first message
    server → {"type": "started"} | {"type": "error", "error": ...}
    server → binary: 0x01 + stdout bytes | 0x02 + stderr bytes    as output arrives
    client → binary: 0x00 + stdin bytes; {"type": "close_stdin"}; {"type": "signal", "signum": N}
    server → {"type": "exit", "exit_code": N} | {"type": "error", "error": ...}   last

A client that goes away does not stop the command: it runs on (its output read and
dropped) until it ends or its timeout kills it, and the sandbox stays usable.

A port tunnel (``GET /v1/sandboxes/{id}/ports/{port}``) is one TCP connection to the
port: binary messages are its bytes each way, a text ``{"type": "eof"}`` a half-close.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import TYPE_CHECKING

from aiohttp import WSMsgType, web
from rollbox.errors import RollboxError, SandboxError, UsageError
from rollbox.relay import splice, streams
from rollbox.sandbox import Process, check_port
from rollbox_remote import protocol

if TYPE_CHECKING:
    from rollbox_serve.registry import Held
    from rollbox_serve.server import Server

log = logging.getLogger("rollbox.serve")
MAX_MESSAGE = 8 << 20
"""Largest WebSocket message a client may send (one stdin write, one tunnel chunk)."""
START_TIMEOUT_S = 30.0
CODES = {"stdout": bytes([protocol.STDOUT]), "stderr": bytes([protocol.STDERR])}


def _error_message(error: RollboxError, held: Held) -> dict[str, object]:
    if isinstance(error, SandboxError) and error.sandbox_id is not None:
        error.sandbox_id = held.id
    return {"type": "error", "error": protocol.error_to_json(error)}


async def stream_handler(server: Server, request: web.Request) -> web.StreamResponse:
    held = server.held(request.match_info["id"])
    ws = await _accept(server, request)
    with server.registry.using(held):
        try:
            process = await _start(ws, held)
        except RollboxError as exc:
            with contextlib.suppress(ConnectionError, RuntimeError):
                await ws.send_json(_error_message(exc, held))
            await ws.close()
            return ws
        await _run(ws, held, process)
    return ws


async def _accept(server: Server, request: web.Request) -> web.WebSocketResponse:
    """The WebSocket, open; this handler tracked, so that shutdown cancels it."""
    # aiohttp refuses a message of max_msg_size bytes itself: one more lets MAX_MESSAGE in
    ws = web.WebSocketResponse(max_msg_size=MAX_MESSAGE + 1)
    await ws.prepare(request)
    task = asyncio.current_task()
    assert task is not None
    server.track(task)
    return ws


async def _start(ws: web.WebSocketResponse, held: Held) -> Process:
    try:
        message = await ws.receive(timeout=START_TIMEOUT_S)
    except TimeoutError:
        raise UsageError(f"no start message within {START_TIMEOUT_S}s") from None
    if message.type != WSMsgType.TEXT:
        raise UsageError("the first message of a stream is {type: start, request}")
    try:
        data = json.loads(message.data)
    except ValueError:
        raise UsageError("the start message is not JSON") from None
    if not isinstance(data, dict) or data.get("type") != "start":
        raise UsageError("the first message of a stream is {type: start, request}")
    return await held.sandbox.start(protocol.request_from_json(data.get("request")))


async def _run(ws: web.WebSocketResponse, held: Held, process: Process) -> None:
    connected = True

    async def send(payload: bytes | dict[str, object]) -> None:
        nonlocal connected
        if not connected:
            return
        try:
            if isinstance(payload, bytes):
                await ws.send_bytes(payload)
            else:
                await ws.send_json(payload)
        except (ConnectionError, RuntimeError):
            connected = False  # the client left: keep draining, stop sending

    await send({"type": "started"})
    control = asyncio.ensure_future(_control(ws, process))
    try:
        async for chunk in process:
            await send(CODES[chunk.stream] + chunk.data)
        try:
            end: dict[str, object] = {"type": "exit", "exit_code": await process.wait()}
        except RollboxError as exc:
            end = _error_message(exc, held)
        await send(end)
    finally:
        control.cancel()
        await asyncio.gather(control, return_exceptions=True)
        await ws.close()


async def _control(ws: web.WebSocketResponse, process: Process) -> None:
    """Stdin and signals from the client, in order, until it closes the WebSocket."""
    async for message in ws:
        try:
            if message.type == WSMsgType.BINARY:
                data = bytes(message.data)
                if data[:1] == bytes([protocol.STDIN]):
                    await process.write_stdin(data[1:])
            elif message.type == WSMsgType.TEXT:
                command = json.loads(message.data)
                if command.get("type") == "close_stdin":
                    await process.close_stdin()
                elif command.get("type") == "signal":
                    signum = command.get("signum")
                    if isinstance(signum, int) and 0 < signum < 65:
                        await process.send_signal(signum)
        except (ValueError, AttributeError, RollboxError, OSError) as exc:
            log.debug("ignored a stream control message: %r", exc)


async def tunnel_handler(server: Server, request: web.Request) -> web.StreamResponse:
    try:
        port = check_port(int(request.match_info["port"]))
    except ValueError:
        raise UsageError("a port is a number in 1-65535") from None
    held = server.held(request.match_info["id"])
    with server.working_on(held):
        host, target, _ = await server.endpoint(held, port)
    ws = await _accept(server, request)
    with server.registry.using(held):
        try:
            reader, writer = await asyncio.open_connection(host, target)
        except OSError as exc:
            await ws.close(code=1011, message=f"cannot connect: {exc}".encode()[:120])
            return ws
        try:
            await splice((_WsSource(ws), _WsSink(ws)), streams(reader, writer))
        finally:
            await ws.close()
    return ws


class _WsSource:
    def __init__(self, ws: web.WebSocketResponse) -> None:
        self.ws = ws

    async def read(self, n: int) -> bytes:
        while True:
            message = await self.ws.receive()
            if message.type != WSMsgType.BINARY:
                return b""  # {"type": "eof"}, or the WebSocket closed
            if message.data:
                return bytes(message.data)


class _WsSink:
    def __init__(self, ws: web.WebSocketResponse) -> None:
        self.ws = ws
        self._closing: asyncio.Task[bool] | None = None

    async def send(self, data: bytes) -> None:
        try:
            await self.ws.send_bytes(data)
        except RuntimeError as exc:  # aiohttp: the WebSocket is closing
            raise ConnectionResetError(str(exc)) from None

    async def send_eof(self) -> None:
        with contextlib.suppress(ConnectionError, RuntimeError):
            await self.ws.send_json({"type": "eof"})

    def close(self) -> None:
        if self._closing is None and not self.ws.closed:
            self._closing = asyncio.ensure_future(self.ws.close())
