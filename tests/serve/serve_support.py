"""Helpers for ``rollbox serve`` tests (imported by the tests and conftest.py)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

from rollbox.remote import RemoteBackend
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
