"""The LLM relay (rollbox_openhands.egress) in a real local sandbox without network: a
forwarded port reaches its host target and nothing else does, and a relay that lies
(it is code in the sandbox) makes the host connect nowhere and fail cleanly."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from rollbox.errors import CreateFailedError
from rollbox.sandbox import Process, Sandbox
from rollbox.spec import Network, SandboxSpec
from rollbox_local import LocalBackend
from rollbox_openhands.egress import RELAY, Egress

PORT_FILE = "/tmp/relay-port"
FRAME = struct.Struct("!IBI")
CONNECT = """
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10)
s.sendall(b"hello from inside")
s.shutdown(socket.SHUT_WR)
print(s.recv(100).decode())
"""


@pytest.fixture
async def sandbox(searchable_dir: Path) -> AsyncIterator[Sandbox]:
    async with LocalBackend(state_dir=searchable_dir) as backend:
        sandbox = await backend.create(SandboxSpec(image="host", network=Network.NONE))
        try:
            yield sandbox
        finally:
            await sandbox.close()


@pytest.fixture
async def target() -> AsyncIterator[tuple[tuple[str, int], list[bytes]]]:
    """A host server that answers what it was sent, upper-cased; and what it was sent."""
    heard: list[bytes] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = await reader.read()
        heard.append(data)
        writer.write(data.upper())
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    async with server:
        yield server.sockets[0].getsockname()[:2], heard


async def start_relay(sandbox: Sandbox, program: str, *ports: int) -> tuple[Process, int]:
    """``program`` run as BOOT runs the relay; its control port once it listens."""
    process = await sandbox.stream(["python3", "-I", "-S", "-c", program, PORT_FILE,
                                    *map(str, ports)], timeout=120)
    for _ in range(500):
        found = await sandbox.exec(["cat", PORT_FILE])
        if found.ok and found.text.strip().isdigit():
            return process, int(found.text)
        await asyncio.sleep(0.02)
    raise AssertionError("the relay never wrote its control port")


async def test_a_forwarded_port_reaches_its_target_and_no_other(
        sandbox: Sandbox, target: tuple[tuple[str, int], list[bytes]]) -> None:
    address, heard = target
    _, control = await start_relay(sandbox, RELAY, 4000)
    egress = Egress(sandbox, {4000: address}, control)
    await egress.start()
    try:
        reached = await sandbox.exec(["python3", "-c", CONNECT, "4000"], timeout=30)
        assert reached.text.strip() == "HELLO FROM INSIDE", reached.stderr
        assert heard == [b"hello from inside"]
        other = await sandbox.exec(["python3", "-c", CONNECT, "4001"], timeout=30)
        assert not other.ok and b"ConnectionRefusedError" in other.stderr
        # The sandbox has no network of its own: the target is not reachable directly.
        direct = await sandbox.exec(["python3", "-c", CONNECT.replace("127.0.0.1",
                                     address[0]), str(address[1])], timeout=30)
        assert not direct.ok
    finally:
        await egress.close()


LIAR = RELAY.replace("for srv, port in listeners:", """\
send(0, OPEN, sys.argv[2].encode())
send(7, OPEN, sys.argv[3].encode())  # a port the host was not given
send(8, OPEN, b"not a port")
import time
time.sleep(0.5)
host.sendall(H.pack(9, DATA, 1 << 30))  # and then no relay would send this
time.sleep(30)
for srv, port in []:""")
"""A relay that asks for a port it was not given, sends garbage, then a 1 GiB frame."""


async def test_a_lying_relay_reaches_nothing_and_ends_the_egress_cleanly(
        sandbox: Sandbox, target: tuple[tuple[str, int], list[bytes]]) -> None:
    address, heard = target
    # The liar asks by number for the target's own port, which is not a port it was given.
    _, control = await start_relay(sandbox, LIAR, 4000, address[1])
    egress = Egress(sandbox, {4000: address}, control)
    await egress.start()
    assert egress._task is not None
    await asyncio.wait_for(egress._task, 10)  # the oversized frame ends it
    assert heard == [] and egress._queues == {}
    await egress.close()


async def test_a_relay_that_never_announces_its_ports_is_a_clear_error(
        sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("rollbox_openhands.egress.HELLO_TIMEOUT_S", 0.5)
    silent = RELAY.replace("host, _ = control.accept()", "host, _ = control.accept()\n"
                           "import time; time.sleep(30)")
    _, control = await start_relay(sandbox, silent, 4000)
    egress = Egress(sandbox, {4000: ("127.0.0.1", 9)}, control)
    with pytest.raises(CreateFailedError, match="did not announce ports"):
        await egress.start()
    await egress.close()
