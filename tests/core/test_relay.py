"""``rollbox.relay``: byte relays with half-closes, and loopback listeners that stop
every connection they carry when closed (without asyncio logging an error)."""

from __future__ import annotations

import asyncio
from typing import Any

from rollbox.relay import LoopbackListener, splice, streams


async def echo_until_eof(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(b"got:" + await reader.read())  # reads until the client's half-close
    await writer.drain()
    writer.close()


async def test_a_relay_carries_bytes_and_half_closes() -> None:
    target = await asyncio.start_server(echo_until_eof, "127.0.0.1", 0)
    port = target.sockets[0].getsockname()[1]

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        inner = await asyncio.open_connection("127.0.0.1", port)
        await splice(streams(reader, writer), streams(*inner))

    listener = LoopbackListener(relay)
    await listener.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
        writer.write(b"x" * 300_000)
        writer.write_eof()  # the server answers only after this half-close
        assert await reader.read() == b"got:" + b"x" * 300_000
        writer.close()
    finally:
        await listener.aclose()
        target.close()


async def test_closing_a_listener_ends_its_open_connections_quietly() -> None:
    errors: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda loop, context: errors.append(context))
    started = asyncio.Event()

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        started.set()
        await reader.read()  # until the connection ends

    listener = LoopbackListener(hold)
    await listener.start()
    reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
    await started.wait()
    await listener.aclose()
    async with asyncio.timeout(5):
        assert await reader.read() == b""  # the relay's side closed
    writer.close()
    await asyncio.sleep(0.05)
    assert errors == []
    try:
        await asyncio.open_connection("127.0.0.1", listener.port)
    except OSError:
        pass
    else:
        raise AssertionError("the listener still accepts connections")
