"""Pod exec served as a kubelet serves it, over the WebSocket channel protocol (v5, v4):
the emulator's API server and the test cluster's node agent both answer exec with it.

With a backing sandbox that streams: output frames leave as the command writes them,
stdin comes in on channel 0 and closes on v5's close message (255, 0); a client that goes
away does not stop the command (as on Kubernetes), it only closes its stdin. Otherwise the
command runs to completion on the stdin sent before the close message, then its output is
sent. The exit status goes out on channel 3; a container runtime reports death by signal
N as exit code 128+N, and so does this.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterable
from typing import Any

from aiohttp import WSMsgType, web
from rollbox.sandbox import Process, Sandbox

from rollbox_kubernetes.podexec import CLOSE, STDIN, V5

Obj = dict[str, Any]
EXEC_OUTPUT_CEILING = 512 * 1024 * 1024


async def serve_exec(request: web.Request, sandbox: Sandbox, *, streaming: bool,
                     protocols: Iterable[str], open_streams: set[asyncio.BaseTransport]
                     ) -> web.WebSocketResponse:
    """Answer one exec request (``command``, ``stdin`` or ``input`` in the query) in ``sandbox``
    (``streaming``: its backend can stream); its transport is in ``open_streams`` while
    the command runs."""
    ws = web.WebSocketResponse(protocols=tuple(protocols), max_msg_size=0)
    await ws.prepare(request)
    argv = request.query.getall("command", [])
    # The API server's pod exec says ``stdin=true``; the kubelet endpoint it forwards to
    # says ``input=1``.
    flag = request.query.get("stdin", request.query.get("input", ""))
    wants_stdin = flag.lower() in ("true", "1")
    transport = request.transport
    if transport is not None:
        open_streams.add(transport)
    try:
        if streaming:
            code = await _exec_streamed(ws, sandbox, argv, wants_stdin)
        else:
            code = await _exec_collected(ws, sandbox, argv, wants_stdin)
        status = _exit_status(code)
    except Exception as exc:  # the runtime could not start it
        status = {"metadata": {}, "status": "Failure", "reason": "InternalError",
                  "message": f"exec failed: {exc}"}
    finally:
        if transport is not None:
            open_streams.discard(transport)
    with contextlib.suppress(ConnectionError):
        await ws.send_bytes(b"\x03" + json.dumps(status).encode())
        await ws.close()
    return ws


def _exit_status(code: int) -> Obj:
    """The status-channel ``Status``. A container runtime reports death by signal N as
    exit code 128+N."""
    code = 128 - code if code < 0 else code
    if code == 0:
        return {"metadata": {}, "status": "Success"}
    return {"metadata": {}, "status": "Failure", "reason": "NonZeroExitCode",
            "message": f"command terminated with non-zero exit code: {code}",
            "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]}}


async def _exec_streamed(ws: web.WebSocketResponse, sandbox: Sandbox, argv: list[str],
                         wants_stdin: bool) -> int:
    # A kubelet streams whatever the command writes: no cap here (the client caps).
    process = await sandbox.stream(argv, timeout=3600, output_limit=EXEC_OUTPUT_CEILING)
    if not wants_stdin:
        await process.close_stdin()
    feeder = asyncio.ensure_future(
        _feed_stdin(ws, process, v5=ws.ws_protocol == V5) if wants_stdin else _drain(ws))
    try:
        async for chunk in process:
            channel = b"\x01" if chunk.stream == "stdout" else b"\x02"
            with contextlib.suppress(ConnectionError):  # gone: keep draining the command
                await ws.send_bytes(channel + chunk.data)
        return await process.wait()
    finally:
        feeder.cancel()
        await asyncio.wait({feeder})


async def _exec_collected(ws: web.WebSocketResponse, sandbox: Sandbox, argv: list[str],
                          wants_stdin: bool) -> int:
    stdin = bytearray()
    if wants_stdin:
        async for msg in ws:
            if msg.type != WSMsgType.BINARY or not msg.data:
                break
            if msg.data[0] == STDIN:
                stdin += msg.data[1:]
            elif msg.data[0] == CLOSE:
                break
    result = await sandbox.exec(argv, stdin=bytes(stdin) if wants_stdin else None,
                                timeout=3600, output_limit=EXEC_OUTPUT_CEILING)
    with contextlib.suppress(ConnectionError):
        if result.stdout:
            await ws.send_bytes(b"\x01" + result.stdout)
        if result.stderr:
            await ws.send_bytes(b"\x02" + result.stderr)
    return result.exit_code


async def _feed_stdin(ws: web.WebSocketResponse, process: Process, *, v5: bool) -> None:
    """Channel 0 to the command's stdin; (255, 0) closes it on v5. When the client goes
    away, stdin is closed."""
    try:
        async for msg in ws:
            if msg.type != WSMsgType.BINARY or not msg.data:
                continue
            if msg.data[0] == STDIN:
                with contextlib.suppress(BrokenPipeError):
                    await process.write_stdin(msg.data[1:])
            elif msg.data[:2] == bytes([CLOSE, STDIN]) and v5:
                await process.close_stdin()
    finally:
        await process.close_stdin()


async def _drain(ws: web.WebSocketResponse) -> None:
    """Read (and ignore) what a client without stdin sends, so its close is seen."""
    async for _ in ws:
        pass
