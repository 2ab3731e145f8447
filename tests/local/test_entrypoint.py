"""SandboxSpec.entrypoint on the local backend: a service every fresh sandbox starts
before it is handed out, again after each reset (booted with the standby generation)."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
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


SELF_CONNECT = """
import fcntl, socket, struct, sys
from rollbox_local import _agent
# A fresh network namespace whose loopback is up and whose only ephemeral port is 60000.
with socket.socket() as s:
    fcntl.ioctl(s, 0x8914, struct.pack("16sH", b"lo", 0x1 | 0x8 | 0x40))  # SIOCSIFFLAGS
try:
    with open("/proc/sys/net/ipv4/ip_local_port_range", "w") as f:
        f.write("60000 60001")
except OSError as e:
    sys.exit(f"SKIP cannot pin the ephemeral ports: {e}")
# Nothing listens on 60000; a plain connect to it meets itself (TCP simultaneous open).
with socket.create_connection(("127.0.0.1", 60000), timeout=5) as plain:
    print("plain", plain.getsockname() == plain.getpeername())
ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
_agent.connect({"port": 60000}, [theirs.detach()])
print("agent", ours.recv(100).decode())
"""


def test_a_port_nothing_listens_on_is_refused_even_when_a_connect_meets_itself() -> None:
    """A port in the ephemeral range with nothing listening yet (OpenHands' 60000, say):
    a connect can be given that very port as its own, connect to itself and succeed.
    The agent's connect (behind ``ready_port``, ``open_port`` and ``endpoint``) must
    call that refused, or a service is handed out before it listens."""
    if shutil.which("unshare") is None:
        pytest.skip("needs util-linux's unshare")
    result = subprocess.run(["unshare", "--user", "--map-root-user", "--net", sys.executable,
                             "-c", SELF_CONNECT], capture_output=True, text=True, timeout=60)
    if result.returncode != 0 and ("SKIP" in result.stderr
                                   or "unshare failed" in result.stderr):
        pytest.skip(f"no network namespace of our own here: {result.stderr.strip()}")
    assert result.returncode == 0, result.stderr
    assert "plain True" in result.stdout  # the trap is real ...
    assert "agent E 111 Connection refused" in result.stdout  # ... and the agent sees it
