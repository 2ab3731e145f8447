"""The shared conformance suite against the kubernetes backend (claim mode).

Without a cluster: each test gets an API server emulator on loopback whose test-only
controller binds claims to warm pools, and whose pods are real local sandboxes
(``rollbox_local.LocalBackend``: bubblewrap, no network unless the template allows it).

Against a real cluster (kind, GKE): set ``ROLLBOX_K8S_KUBECONFIG=/path/to/kubeconfig``
(or ``ROLLBOX_K8S_CONFORMANCE=1`` to use ``$KUBECONFIG``), plus optionally
``ROLLBOX_K8S_NAMESPACE`` (default ``rollbox-test``), ``ROLLBOX_K8S_IMAGE`` (default
``debian:bookworm-slim``) and ``ROLLBOX_K8S_RUNTIME_CLASS`` (``gvisor`` on GKE). The
emulator is not started then. See docs/kubernetes.md.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import pytest_asyncio
from rollbox import Backend, SandboxSpec
from rollbox_conformance import BackendTests
from rollbox_kubernetes import KubernetesBackend
from rollbox_kubernetes.testing import ApiServerEmulator
from rollbox_kubernetes.testing.conformance import KubernetesHooks
from rollbox_local import LocalBackend


def real_cluster() -> dict[str, Any] | None:
    """Connection options for a real cluster, or None to use the emulator."""
    kubeconfig = os.environ.get("ROLLBOX_K8S_KUBECONFIG")
    if not kubeconfig and os.environ.get("ROLLBOX_K8S_CONFORMANCE") != "1":
        return None
    return {"kubeconfig": kubeconfig or None,
            "context": os.environ.get("ROLLBOX_K8S_CONTEXT") or None,
            "namespace": os.environ.get("ROLLBOX_K8S_NAMESPACE", "rollbox-test"),
            "runtime_class": os.environ.get("ROLLBOX_K8S_RUNTIME_CLASS") or None}


CLUSTER = real_cluster()
IMAGE = os.environ.get("ROLLBOX_K8S_IMAGE", "debian:bookworm-slim") if CLUSTER else "host"


class TestKubernetesConformance(KubernetesHooks, BackendTests):
    spec: ClassVar[SandboxSpec] = SandboxSpec(image=IMAGE, workdir="/work")

    @pytest_asyncio.fixture
    async def backend(  # type: ignore[override]  # a fixture: extra fixtures are fine
        self, local_state: Path
    ) -> AsyncIterator[Backend]:
        run_id = f"conf-{uuid.uuid4().hex[:8]}"
        if CLUSTER is not None:
            backend = KubernetesBackend(run_id=run_id, **CLUSTER)
            try:
                yield backend
            finally:
                await backend.aclose()
            return
        async with ApiServerEmulator(LocalBackend(state_dir=local_state)) as emulator:
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
    (``transport="http"``), against the emulator, whose pods then serve it. Against a
    real cluster it is skipped: the image would have to run the runtime."""

    @pytest_asyncio.fixture
    async def backend(  # type: ignore[override]  # a fixture: extra fixtures are fine
        self, local_state: Path
    ) -> AsyncIterator[Backend]:
        if CLUSTER is not None:
            pytest.skip("transport='http' needs an image that serves the runtime")
        backing = LocalBackend(state_dir=local_state)
        async with ApiServerEmulator(backing, http_runtime=True) as emulator:
            backend = KubernetesBackend(host=emulator.url, run_id=f"conf-{uuid.uuid4().hex[:8]}",
                                        warm_replicas=1, qps=500, burst=500,
                                        probe_after_s=0.3, transport="http")
            try:
                yield backend
            finally:
                await backend.aclose()
