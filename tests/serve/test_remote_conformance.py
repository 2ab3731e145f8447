"""The whole conformance suite against the remote backend, served by ``rollbox serve``
over the local backend (real bubblewrap sandboxes behind a unix socket).

The server runs in the test's event loop, so the hooks reach behind it: the
sandbox's own process is killed on the server's side, as a crash would, and the leak
check looks into the server's backend too."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from rollbox import Backend, Sandbox, SandboxSpec
from rollbox_conformance import BackendTests
from rollbox_local import LocalBackend, LocalSandbox
from rollbox_local.bwrap import Bwrap
from rollbox_remote import RemoteBackend
from rollbox_serve import Server
from serve_support import connect

# The whole suite on two more transports: about 45 % of the fast loop's CPU, so CI's
# (and a named path's) only; the local backend's conformance stays in the fast loop.
pytestmark = pytest.mark.slow


def _server(backend: Backend) -> Server:
    server = getattr(backend, "served_by", None)
    assert isinstance(server, Server)
    return server


class TestRemoteConformance(BackendTests):
    @pytest.fixture
    async def backend(self, state_dir: Path, token: str) -> AsyncIterator[Backend]:
        server = Server(LocalBackend(state_dir=state_dir), token=token)
        await server.start(f"unix:{state_dir / 'serve.sock'}")
        remote = await connect(server, token)
        remote.served_by = server  # type: ignore[attr-defined]
        try:
            yield remote
        finally:
            await remote.aclose()
            await server.aclose()

    def owner_script(self, state: Path) -> str:
        """Not this backend's contract: a remote client is not its sandboxes' owner. The
        server holds them across a client's death (issue 15: a client disconnecting does
        not lose them; the idle TTL reaps them), and the process whose SIGKILL must leave
        nothing is ``rollbox serve`` itself: test_serve_processes.py kills a real one
        and checks that its sandboxes die and that the next start holds nothing."""
        pytest.skip("a killed remote client leaves its sandboxes to the server by design; "
                    "a killed server: test_a_server_killed_with_sigkill_is_cleaned_up_by_the_next")

    async def kill_sandbox(self, backend: Backend, sandbox: Sandbox) -> None:
        """SIGKILL the agent of the local sandbox behind the handle, on the server."""
        held = _server(backend).held(sandbox.id)
        assert held.lease is not None
        local = held.lease.raw
        assert isinstance(local, LocalSandbox)
        current = local._current
        assert current is not None
        current.signal_kill()
        await asyncio.wait(current.exits)

    async def inject_create_failure(self, backend: Backend) -> None:
        """The server's next create runs a bwrap that does not exist."""
        local = _server(backend).backend
        assert isinstance(local, LocalBackend)
        original = local.create

        async def failing_once(spec: SandboxSpec) -> LocalSandbox:
            local.create = original  # type: ignore[method-assign]
            real = local.bwrap
            local._bwrap = Bwrap("/nonexistent/bwrap", real.version)
            try:
                return await original(spec)
            finally:
                local._bwrap = real

        local.create = failing_once  # type: ignore[method-assign]

    async def leak_check(self, backend: Backend) -> list[str]:
        """What the client still holds on the server, and what the server's backend
        still holds once the server has closed its warm sandboxes (a sandbox a client
        closed goes back to the pool, reset; it must not go anywhere else)."""
        assert isinstance(backend, RemoteBackend)
        server = _server(backend)
        found = await backend.leftovers()
        await server.settled()
        await server.drain_idle()
        return found + await server.backend.leftovers()
