"""The shared conformance suite against the kubernetes backend on the API server
emulator: each test gets an emulator on loopback whose test-only controller binds claims
to warm pools, and whose pods are real local sandboxes (``rollbox_local.LocalBackend``:
bubblewrap, no network unless the template allows it). Fast; the same suite against the
real control plane (or a cluster of ``ROLLBOX_K8S_KUBECONFIG``) is tests/cluster's.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import ClassVar

import pytest
import pytest_asyncio
from rollbox import Backend, SandboxSpec
from rollbox_conformance import BackendTests
from rollbox_kubernetes import KubernetesBackend
from rollbox_kubernetes.testing import ApiServerEmulator, container_runtime
from rollbox_kubernetes.testing.conformance import KnownHoles, KubernetesHooks

# The whole suite on two more transports: about 45 % of the fast loop's CPU, so CI's
# (and a named path's) only; the local backend's conformance stays in the fast loop.
pytestmark = pytest.mark.slow

class TestKubernetesConformance(KnownHoles, KubernetesHooks, BackendTests):
    spec: ClassVar[SandboxSpec] = SandboxSpec(image="host", workdir="/work")

    @pytest_asyncio.fixture
    async def backend(  # type: ignore[override]  # a fixture: extra fixtures are fine
        self, local_state: Path
    ) -> AsyncIterator[Backend]:
        run_id = f"conf-{uuid.uuid4().hex[:8]}"
        async with ApiServerEmulator(container_runtime(local_state)) as emulator:
            # A loopback API server: no need for a real cluster's pacing, and pod
            # status is current at once, so a slow claim's pod is read sooner.
            backend = KubernetesBackend(host=emulator.url, run_id=run_id, qps=500,
                                        burst=500, probe_after_s=0.3)
            try:
                yield backend
            finally:
                await backend.aclose()


@pytest.mark.slow
class TestKubernetesConformanceHttp(TestKubernetesConformance):
    """The same suite with commands and files through the in-sandbox HTTP runtime
    (``transport="http"``), against the emulator, whose pods then serve it."""

    @pytest_asyncio.fixture
    async def backend(  # type: ignore[override]  # a fixture: extra fixtures are fine
        self, local_state: Path
    ) -> AsyncIterator[Backend]:
        backing = container_runtime(local_state)
        async with ApiServerEmulator(backing, http_runtime=True) as emulator:
            backend = KubernetesBackend(host=emulator.url, run_id=f"conf-{uuid.uuid4().hex[:8]}",
                                        warm_replicas=1, qps=500, burst=500,
                                        probe_after_s=0.3, transport="http")
            try:
                yield backend
            finally:
                await backend.aclose()
