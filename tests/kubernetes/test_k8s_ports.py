"""``KubeSandbox.endpoint(port)``: the pod's port at its IP, or through a sandbox router
with upstream's headers. The emulator's pods serve agent-sandbox's runtime on their own
loopback address, so the endpoint is checked by a real HTTP request to it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from rollbox.errors import SandboxLostError, UsageError
from rollbox.spec import SandboxSpec
from rollbox_kubernetes.runtime_http import DEFAULT_PORT
from rollbox_kubernetes.testing import ApiServerEmulator, container_runtime
from rollbox_kubernetes.testing.runtime import SandboxRouter


@pytest.fixture
async def served(local_state: Path) -> AsyncIterator[ApiServerEmulator]:
    async with ApiServerEmulator(container_runtime(local_state),
                                 http_runtime=True) as emu:
        yield emu


async def get(url: str, headers: dict[str, str]) -> int:
    async with aiohttp.ClientSession() as session, session.get(url, headers=headers) as reply:
        return reply.status


async def test_endpoint_at_the_pod_ip(served: ApiServerEmulator, backends_on: Any,
                                      spec: SandboxSpec) -> None:
    async with backends_on(served.url, run_id="ports", warm_replicas=0) as make:
        backend = make(transport="exec")
        async with await backend.create(spec) as sandbox:
            endpoint = await sandbox.endpoint(DEFAULT_PORT)
            assert endpoint.port == DEFAULT_PORT and endpoint.headers == {}
            assert await get(f"{endpoint.url}/", {}) == 200
            with pytest.raises(UsageError):
                await sandbox.endpoint(0)
        with pytest.raises(SandboxLostError):
            await sandbox.endpoint(DEFAULT_PORT)


async def test_endpoint_through_a_router(served: ApiServerEmulator, backends_on: Any,
                                         spec: SandboxSpec) -> None:
    runtimes = served.cluster.runtimes
    assert runtimes is not None
    router = SandboxRouter(runtimes, token="s3cret")
    url = await router.start()
    try:
        async with backends_on(served.url, run_id="ports-router", warm_replicas=0) as make:
            backend = make(transport="exec", runtime_url=url, runtime_token="s3cret")
            async with await backend.create(spec) as sandbox:
                endpoint = await sandbox.endpoint(DEFAULT_PORT)
                assert endpoint.url == url
                assert endpoint.headers["X-Sandbox-Port"] == str(DEFAULT_PORT)
                assert await get(f"{endpoint.url}/", dict(endpoint.headers)) == 200
                assert await get(f"{endpoint.url}/", {}) != 200
    finally:
        await router.stop()
