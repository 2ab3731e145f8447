"""The Runtime API as a face of `rollbox serve` (its end-to-end run with OpenHands' own
clients is in test_openhands_env.py): registered by rollbox_openhands' plugin, mounted
under /openhands beside the remote backend's API, its settings checked, and refused on
a backend that cannot run agent-servers."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from rollbox.errors import CapabilityNotSupportedError, InvalidSettingError
from rollbox.plugins import get_plugin_manager, serve_faces
from rollbox.pool import Pool
from rollbox.testing import FakeBackend
from rollbox_local import LocalBackend
from rollbox_openhands.face import attach
from rollbox_openhands.server import WarmTargets, agent_servers_on
from rollbox_serve.server import Server


def test_the_plugin_registers_the_openhands_face() -> None:
    assert serve_faces(get_plugin_manager())["openhands"] is attach


@pytest.fixture
def backend() -> Iterator[LocalBackend]:
    """World-searchable state (the sandbox user must reach the local backend's)."""
    path = Path(tempfile.mkdtemp(prefix="rollbox-openhands-face-"))
    path.chmod(0o711)
    try:
        yield LocalBackend(state_dir=path)
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def test_the_face_answers_under_openhands_with_its_own_key(
        backend: LocalBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLLBOX_OPENHANDS_API_KEY", "oh-key")
    server = Server(backend, token="server-token")
    attach(server)
    address = await server.start("127.0.0.1:0")
    base = f"http://{address.host}:{address.port}"
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{base}/openhands/list",
                                headers={"X-API-Key": "oh-key"}) as reply:
                assert reply.status == 200
                assert await reply.json() == {"runtimes": []}
            async with http.get(f"{base}/openhands/rollbox/warm",
                                headers={"X-API-Key": "oh-key"}) as reply:
                assert await reply.json() == {"ready": 0}
            for key in ("server-token", "wrong", ""):
                async with http.get(f"{base}/openhands/list",
                                    headers={"X-API-Key": key}) as reply:
                    assert reply.status == 401
            # OpenHands' key opens nothing else of the server; the server's API still
            # answers beside the face.
            async with http.get(f"{base}/v1/sandboxes",
                                headers={"Authorization": "Bearer oh-key"}) as reply:
                assert reply.status == 401
            async with http.get(f"{base}/v1/health",
                                headers={"Authorization": "Bearer server-token"}) as reply:
                assert reply.status == 200
            async with http.post(f"{base}/openhands/start", headers={"X-API-Key": "oh-key"},
                                 json={"image": "img"}) as reply:
                assert reply.status == 400
                assert "command" in (await reply.json())["detail"]
    finally:
        await server.aclose()


@pytest.mark.parametrize("variable, value", [
    ("ROLLBOX_OPENHANDS_WARM", "two"), ("ROLLBOX_OPENHANDS_NETWORK", "bridge")])
def test_bad_face_settings_are_refused(backend: LocalBackend, monkeypatch: pytest.MonkeyPatch,
                                       variable: str, value: str) -> None:
    monkeypatch.setenv(variable, value)
    server = Server(backend, token="t")
    with pytest.raises(InvalidSettingError, match=variable) as caught:
        attach(server)
    assert caught.value.variable == variable


async def test_a_backend_without_entrypoints_and_ports_is_refused() -> None:
    async with Pool(FakeBackend(), policy=WarmTargets()) as pool:
        with pytest.raises(CapabilityNotSupportedError, match="entrypoint"):
            agent_servers_on(pool)


async def test_without_a_key_of_its_own_the_face_takes_the_servers_token(
        backend: LocalBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ROLLBOX_OPENHANDS_API_KEY", raising=False)
    server = Server(backend, token="server-token")
    attach(server)
    address = await server.start("127.0.0.1:0")
    try:
        async with aiohttp.ClientSession() as http, http.get(
                f"http://{address.host}:{address.port}/openhands/list",
                headers={"X-API-Key": "server-token"}) as reply:
            assert reply.status == 200
    finally:
        await server.aclose()
