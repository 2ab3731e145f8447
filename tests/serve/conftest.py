"""Fixtures for ``rollbox serve`` tests: a server over a real local backend, in this
process (so tests can reach behind it) or in another one (as users run it)."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from rollbox_local import LocalBackend
from rollbox_remote import RemoteBackend
from rollbox_serve import Server
from serve_support import ServeProcess, connect


@pytest.fixture
def state_dir(searchable_dir: Path) -> Path:
    """The server's state directory, reachable by the sandbox user."""
    return searchable_dir


@pytest.fixture
def token() -> str:
    return secrets.token_urlsafe(24)


@pytest.fixture
async def server(state_dir: Path, token: str) -> AsyncIterator[Server]:
    """A server over a local backend, listening on a unix socket in ``state_dir``."""
    server = Server(LocalBackend(state_dir=state_dir / "local"), token=token, idle_ttl_s=600)
    await server.start(f"unix:{state_dir / 'serve.sock'}")
    try:
        yield server
    finally:
        await server.aclose()


@pytest.fixture
async def remote(server: Server, token: str) -> AsyncIterator[RemoteBackend]:
    backend = await connect(server, token)
    try:
        yield backend
    finally:
        await backend.aclose()


@pytest.fixture
def serve_process(state_dir: Path) -> Iterator[ServeProcess]:
    process = ServeProcess(state_dir)
    try:
        yield process
    finally:
        if process.process is not None and process.process.poll() is None:
            process.process.kill()
            process.process.wait()
