"""Ports: ``Sandbox.endpoint(port)`` reaches a listener inside the sandbox from the host,
a sandbox without network is reachable that way and no other, and the address dies
with the sandbox."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
import urllib.request
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from rollbox import Backend, Endpoint, Network, Sandbox
from rollbox.errors import RollboxError, UsageError

from rollbox_conformance.base import BackendTestBase

ECHO = r"""
import socket, sys, threading
listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("127.0.0.1", int(sys.argv[1])))
listener.listen(64)
open(sys.argv[2], "w").close()
def serve(conn):
    with conn:
        data = b""
        while not data.endswith(b"\n"):
            chunk = conn.recv(1 << 16)
            if not chunk:
                break
            data += chunk
        conn.sendall(b"echo:" + data)
while True:
    threading.Thread(target=serve, args=(listener.accept()[0],), daemon=True).start()
"""

CONNECT = (
    "import socket, sys\n"
    "try:\n"
    "    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close()\n"
    "except OSError:\n"
    "    sys.exit(1)\n"
)


def free_host_port() -> int:
    """A port nothing on the host listens on (right now)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def talk(endpoint: Endpoint, line: bytes, timeout: float = 30.0) -> bytes:
    """Send ``line`` to the endpoint and read until it closes."""
    async with asyncio.timeout(timeout):
        reader, writer = await asyncio.open_connection(endpoint.host, endpoint.port)
        try:
            writer.write(line)
            await writer.drain()
            return await reader.read()
        finally:
            writer.close()


class PortTests(BackendTestBase):
    """``endpoint(port)`` is the host's one way to a port inside a sandbox."""

    @pytest_asyncio.fixture
    async def listening(self, backend: Backend) -> AsyncIterator[tuple[Sandbox, int]]:
        """A sandbox without network running a line-echo server on a port the host
        does not use, and that port."""
        self.require(backend, "ports", "shell")
        sandbox = await backend.create(self.spec.replace(network=Network.NONE))
        try:
            port = free_host_port()
            await self.start_echo(sandbox, port)
            yield sandbox, port
        finally:
            await sandbox.close()

    async def start_echo(self, sandbox: Sandbox, port: int) -> None:
        if not (await self.sh(sandbox, "command -v python3")).ok:
            pytest.skip("the image has no python3 to listen with")
        script, ready = self.scratch("echo.py"), self.scratch("ready")
        await sandbox.write_file(script, ECHO.encode())
        started = await self.sh(sandbox, (
            f"nohup python3 {script} {port} {ready} >/dev/null 2>&1 &\n"
            f"i=0; while [ ! -e {ready} ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done; "
            f"[ -e {ready} ]"))
        assert started.ok, "the echo server inside did not start"

    async def test_endpoint_reaches_a_listener_inside(
        self, listening: tuple[Sandbox, int]
    ) -> None:
        sandbox, port = listening
        endpoint = await sandbox.endpoint(port)
        assert endpoint.url.startswith("http")
        assert await talk(endpoint, b"hello\n") == b"echo:hello\n"
        big = b"x" * (1 << 20) + b"\n"
        assert await talk(endpoint, big) == b"echo:" + big
        again = await sandbox.endpoint(port)
        assert await talk(again, b"twice\n") == b"echo:twice\n"

    async def test_many_connections_at_once(self, listening: tuple[Sandbox, int]) -> None:
        sandbox, port = listening
        endpoint = await sandbox.endpoint(port)
        lines = [f"line {i}\n".encode() for i in range(20)]
        answers = await asyncio.gather(*(talk(endpoint, line) for line in lines))
        assert answers == [b"echo:" + line for line in lines]

    async def test_http_through_the_endpoint(self, backend: Backend) -> None:
        self.require(backend, "ports", "shell")
        async with await backend.create(self.spec.replace(network=Network.NONE)) as sandbox:
            if not (await self.sh(sandbox, "command -v python3")).ok:
                pytest.skip("the image has no python3 to serve HTTP with")
            root, port = self.scratch("www"), free_host_port()
            await sandbox.write_file(f"{root}/index.html", b"served from inside")
            await self.sh(sandbox, f"cd {root} && nohup python3 -m http.server {port} "
                                   "--bind 127.0.0.1 >/dev/null 2>&1 &")
            endpoint = await sandbox.endpoint(port)
            request = urllib.request.Request(f"{endpoint.url}/index.html",
                                             headers=dict(endpoint.headers))

            def get() -> bytes:
                for _ in range(100):
                    with contextlib.suppress(OSError), urllib.request.urlopen(
                        request, timeout=10
                    ) as response:
                        body: bytes = response.read()
                        return body
                    time.sleep(0.1)
                raise AssertionError("the HTTP server inside never answered")

            assert await asyncio.to_thread(get) == b"served from inside"

    async def test_a_sandbox_without_network_is_reachable_only_through_its_endpoint(
        self, backend: Backend, listening: tuple[Sandbox, int]
    ) -> None:
        sandbox, port = listening
        endpoint = await sandbox.endpoint(port)
        with pytest.raises(OSError):  # not on the host's own loopback
            await talk(Endpoint(f"http://127.0.0.1:{port}"), b"direct\n", timeout=5)
        async with await backend.create(self.spec.replace(network=Network.NONE)) as other:
            assert (await self.connect_from(other, "127.0.0.1", port)) == 1, (
                "another sandbox reached the listener")
        assert (await self.connect_from(sandbox, endpoint.host, endpoint.port)) == 1, (
            "the sandbox reached the host side of its endpoint")
        assert await talk(endpoint, b"still\n") == b"echo:still\n"

    async def connect_from(self, sandbox: Sandbox, host: str, port: int) -> int:
        """0 if a TCP connection from inside ``sandbox`` to ``host:port`` succeeds."""
        script = self.scratch("connect.py")
        await sandbox.write_file(script, CONNECT.encode())
        return (await self.sh(sandbox, f"python3 {script} {host} {port}")).exit_code

    async def test_nothing_listening_is_a_closed_connection(self, backend: Backend) -> None:
        self.require(backend, "ports")
        async with await backend.create(self.spec.replace(network=Network.NONE)) as sandbox:
            endpoint = await sandbox.endpoint(free_host_port())
            async with self.within(self.timeout_slack_s, "a connection to nothing"):
                try:
                    answer = await talk(endpoint, b"anyone?\n")
                except OSError:
                    answer = b""
            assert answer == b""

    async def test_the_endpoint_dies_with_the_sandbox(
        self, backend: Backend, listening: tuple[Sandbox, int]
    ) -> None:
        sandbox, port = listening
        endpoint = await sandbox.endpoint(port)
        assert await talk(endpoint, b"alive\n") == b"echo:alive\n"
        await sandbox.close()
        async with self.within(self.timeout_slack_s, "a connection to a closed sandbox"):
            try:
                answer = await talk(endpoint, b"gone?\n")
            except OSError:
                answer = b""
        assert answer == b""
        with pytest.raises(RollboxError):
            await sandbox.endpoint(port)

    async def test_reset_closes_the_endpoints(
        self, backend: Backend, listening: tuple[Sandbox, int]
    ) -> None:
        """A reset sandbox exposes nothing: its endpoints close, ``endpoint`` opens anew."""
        self.require(backend, "reset_in_place")
        sandbox, port = listening
        old = await sandbox.endpoint(port)
        assert await talk(old, b"before\n") == b"echo:before\n"
        await sandbox.reset()
        async with self.within(self.timeout_slack_s, "a connection to a reset endpoint"):
            try:
                answer = await talk(old, b"after\n")
            except OSError:
                answer = b""
        assert answer == b""
        await self.start_echo(sandbox, port)
        assert await talk(await sandbox.endpoint(port), b"anew\n") == b"echo:anew\n"

    async def test_invalid_ports_are_refused(self, backend: Backend, sandbox: Sandbox) -> None:
        self.require(backend, "ports")
        for port in (0, -1, 65536, "80"):
            with pytest.raises(UsageError):
                await sandbox.endpoint(port)  # type: ignore[arg-type]
