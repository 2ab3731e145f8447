"""A server on loopback TCP with TLS: clients that trust its certificate get in, others
get a clear error; the token is still required."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from rollbox import SandboxSpec
from rollbox.errors import AuthenticationError, UsageError
from rollbox_local import LocalBackend
from rollbox_serve import Server
from serve_support import connect

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[Path, Path]:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    return cert, key


@pytest.fixture
async def tls_server(state_dir: Path, token: str,
                     certificate: tuple[Path, Path]) -> AsyncIterator[Server]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*certificate)
    server = Server(LocalBackend(state_dir=state_dir), token=token)
    await server.start("127.0.0.1:0", ssl_context=context)
    try:
        yield server
    finally:
        await server.aclose()


async def test_tls_with_a_trusted_certificate(tls_server: Server, token: str,
                                              certificate: tuple[Path, Path]) -> None:
    assert tls_server.address is not None and tls_server.address.scheme == "https"
    remote = await connect(tls_server, token, ca_file=certificate[0])
    try:
        async with await remote.create(SandboxSpec(image="host")) as sandbox:
            assert (await sandbox.exec(["echo", "over tls"])).stdout == b"over tls\n"
            process = await sandbox.stream(["echo", "streamed"])
            assert b"".join([c.data async for c in process]) == b"streamed\n"
            assert await process.wait() == 0
    finally:
        await remote.aclose()
    with pytest.raises(AuthenticationError):
        await connect(tls_server, "wrong-token", ca_file=certificate[0])


async def test_an_untrusted_certificate_is_refused(tls_server: Server, token: str) -> None:
    with pytest.raises(UsageError, match="TLS"):
        await connect(tls_server, token)
