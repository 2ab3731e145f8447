"""SandboxSpec.entrypoint on the local backend: a service every fresh sandbox starts
before it is handed out, again after each reset (booted with the standby generation)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from rollbox import Pool, SandboxSpec, StaticPoolPolicy, Timeouts
from rollbox.errors import CreateFailedError
from rollbox_local import LocalBackend
from rollbox_local.sandbox import LocalSandbox

PORT = 18123
SERVER = SandboxSpec(image="host", workdir="/srv",
                     entrypoint=("python3", "-m", "http.server", str(PORT), "--bind",
                                 "127.0.0.1"), ready_port=PORT)


async def get(sandbox: LocalSandbox, path: str) -> bytes:
    loop = asyncio.get_running_loop()
    with await sandbox.open_port(PORT) as conn:
        await loop.sock_sendall(conn, f"GET {path} HTTP/1.0\r\n\r\n".encode())
        reply = b""
        while chunk := await loop.sock_recv(conn, 65536):
            reply += chunk
    return reply


@pytest.fixture
async def server(backend: LocalBackend) -> AsyncIterator[LocalSandbox]:
    sandbox = await backend.create(SERVER)
    try:
        yield sandbox
    finally:
        await sandbox.close()


async def test_the_service_is_up_when_create_returns(server: LocalSandbox) -> None:
    await server.write_file("/srv/hello.txt", b"hello")
    assert (await get(server, "/hello.txt")).endswith(b"hello")


async def test_a_reset_hands_over_a_sandbox_whose_service_is_already_up(
    server: LocalSandbox,
) -> None:
    await server.exec("echo one > /srv/one.txt")  # used: its standby boots now, service too
    await asyncio.sleep(1.5)
    started = time.monotonic()
    await server.reset()
    reply = await get(server, "/")
    assert reply.startswith(b"HTTP/1.0 200"), reply[:80]
    assert b"one.txt" not in reply  # a fresh layer, a fresh service
    assert time.monotonic() - started < 5


async def test_a_pool_keeps_sandboxes_with_their_service_warm(backend: LocalBackend) -> None:
    async with Pool(backend, policy=StaticPoolPolicy(size=1)) as pool:
        await pool.prewarm(SERVER, 1)
        async with pool.lease(SERVER) as sandbox:
            assert (await get(sandbox, "/")).startswith(b"HTTP/1.0 200")


@pytest.mark.parametrize(("entrypoint", "why"), [
    (("/no/such/program",), "could not start"),
    (("sh", "-c", "exit 3"), "exited with 3"),
])
async def test_an_entrypoint_that_fails_fails_the_create(
    backend: LocalBackend, entrypoint: tuple[str, ...], why: str
) -> None:
    spec = SandboxSpec(image="host", entrypoint=entrypoint, ready_port=PORT)
    with pytest.raises(CreateFailedError, match=why):
        await backend.create(spec)
    assert await backend.leftovers() == []


async def test_a_service_that_never_listens_times_out(backend: LocalBackend) -> None:
    spec = SandboxSpec(image="host", entrypoint=("sleep", "60"), ready_port=PORT,
                       timeouts=Timeouts(create_s=1.5))
    with pytest.raises(CreateFailedError, match="not ready on port"):
        await backend.create(spec)
    assert await backend.leftovers() == []
