"""Helpers for ``rollbox serve`` tests (imported by the tests and conftest.py)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from rollbox_remote import RemoteBackend
from rollbox_serve import Server


async def connect(server: Server, token: str, **options: object) -> RemoteBackend:
    """A remote backend for ``server`` (built in a thread: its constructor waits for the
    server's answer, which this very event loop gives)."""
    return await asyncio.to_thread(RemoteBackend, str(server.address), token, **options)  # type: ignore[arg-type]


class ServeProcess:
    """``rollbox serve`` in a child process, as a user starts it."""

    def __init__(self, state: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.state = state
        self.home = state / "home"
        self.home.mkdir(exist_ok=True, mode=0o711)
        self.env = {**os.environ, "ROLLBOX_HOME": str(self.home), **(env or {})}
        self.env.pop("ROLLBOX_BACKEND", None)
        self.log = state / "serve.log"
        self.args = ["--state-dir", str(state / "serve"), *args]
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def socket(self) -> Path:
        return self.state / "serve" / "serve.sock"

    @property
    def url(self) -> str:
        return f"unix:{self.socket}"

    @property
    def token(self) -> str:
        return (self.state / "serve" / "token").read_text().strip()

    def start(self, timeout: float = 60.0) -> ServeProcess:
        offset = self.log.stat().st_size if self.log.exists() else 0
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "rollbox", "serve", *self.args],
                env=self.env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while b"use it:" not in self.log.read_bytes()[offset:]:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"rollbox serve did not start:\n{self.log.read_text()}")
            time.sleep(0.05)
        return self

    def stop(self, signum: int = 15, timeout: float = 60.0) -> int:
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signum)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise

    def client_env(self, token: str | None = None) -> dict[str, str]:
        return {**self.env, "ROLLBOX_BACKEND": "remote", "ROLLBOX_URL": self.url,
                "ROLLBOX_TOKEN": token or self.token}


async def raw(server: Server, data: bytes, *, read_timeout: float = 10.0) -> bytes:
    """Send ``data`` on a fresh connection and return what the server answers."""
    assert server.address is not None
    reader, writer = await asyncio.open_unix_connection(server.address.path)
    try:
        writer.write(data)
        await writer.drain()
        async with asyncio.timeout(read_timeout):
            return await reader.read(1 << 16)
    except (ConnectionError, TimeoutError):
        return b""
    finally:
        writer.close()


def request(method: str, path: str, token: str | None, body: bytes = b"",
            headers: str = "") -> bytes:
    auth = f"Authorization: Bearer {token}\r\n" if token is not None else ""
    return (f"{method} {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: {len(body)}\r\n"
            f"Connection: close\r\n{headers}\r\n").encode() + body


def status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


def error_of(answer: bytes) -> dict[str, object]:
    body = json.loads(answer.split(b"\r\n\r\n", 1)[1])
    assert isinstance(body["error"], dict)
    return body["error"]
