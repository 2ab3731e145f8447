"""The conformance suite against the local (bubblewrap) backend: every test, every
escape attempt, on this machine."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from rollbox import Backend, Sandbox, SandboxSpec
from rollbox_conformance import BackendTests
from rollbox_local import LocalBackend, LocalSandbox
from rollbox_local.bwrap import Bwrap


class TestLocalConformance(BackendTests):
    @pytest.fixture
    async def backend(self, state_dir: Path) -> AsyncIterator[Backend]:
        backend = LocalBackend(state_dir=state_dir)
        yield backend
        await backend.aclose()

    async def kill_sandbox(self, backend: Backend, sandbox: Sandbox) -> None:
        """SIGKILL the sandbox's agent (the init of its processes) and its namespace
        holder from the host, as the OOM killer or a crash would."""
        assert isinstance(sandbox, LocalSandbox)
        current = sandbox._current
        assert current is not None
        current.signal_kill()
        await asyncio.wait(current.exits)

    async def inject_create_failure(self, backend: Backend) -> None:
        """The next create runs a bwrap that does not exist; later ones are normal."""
        assert isinstance(backend, LocalBackend)
        original = backend.create

        async def failing_once(spec: SandboxSpec) -> LocalSandbox:
            backend.create = original  # type: ignore[method-assign]
            real = backend.bwrap
            backend._bwrap = Bwrap("/nonexistent/bwrap", real.version)
            try:
                return await original(spec)
            finally:
                backend._bwrap = real

        backend.create = failing_once  # type: ignore[method-assign]

    def owner_script(self, state: Path) -> str:
        return ("from rollbox_local import LocalBackend\n\n\n"
                f"def make_backend():\n    return LocalBackend(state_dir={str(state)!r})\n")
