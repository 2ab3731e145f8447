"""The shared conformance suite on a real control plane, in each of the backend's modes,
commands and files through the in-sandbox HTTP runtime (``transport="http"``) on the test
cluster: the node agent serves it at each pod's IP, backed by a real local sandbox;
streaming and stdin go through pod exec, which the real API server hands to the node
agent. On another cluster (``ROLLBOX_K8S_KUBECONFIG``) ``$ROLLBOX_K8S_TRANSPORT``.

- claims: every create a SandboxClaim on the spec's warm pool (template and pool made by
  the backend from the warm target, as under a pool policy);
- sandboxes: every create a direct ``Sandbox`` (no template, pool or claim);
- pods: one bare pod per sandbox (``mode="pod"``), no agent-sandbox controller involved.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import pytest
import pytest_asyncio
from cluster_support import IMAGE
from rollbox import Backend, SandboxSpec
from rollbox_conformance import BackendTests
from rollbox_kubernetes import KubernetesBackend
from rollbox_kubernetes.testing.conformance import ClaimingBackend, KubernetesHooks
from rollbox_kubernetes.testing.fixtures import ClusterAccess

pytestmark = pytest.mark.slow


class ClusterConformance(KubernetesHooks, BackendTests):
    backend_class: ClassVar[type[KubernetesBackend]] = KubernetesBackend
    options: ClassVar[dict[str, Any]] = {}
    spec: ClassVar[SandboxSpec] = SandboxSpec(image=IMAGE, workdir="/work")

    @pytest_asyncio.fixture
    async def backend(  # type: ignore[override]  # a fixture: extra fixtures are fine
        self, k8s_cluster: ClusterAccess
    ) -> AsyncIterator[Backend]:
        backend = self.backend_class(
            kubeconfig=k8s_cluster.kubeconfig, namespace=k8s_cluster.namespace,
            runtime_class=k8s_cluster.runtime_class, run_id=f"conf-{uuid.uuid4().hex[:8]}",
            transport=k8s_cluster.transport, **self.options)
        try:
            yield backend
        finally:
            await backend.aclose()


class TestClaimsFromWarmPools(ClusterConformance):
    backend_class = ClaimingBackend
    options: ClassVar[dict[str, Any]] = {"warm_pool_min": 1}


class TestDirectSandboxes(ClusterConformance):
    pass


class TestRawPods(ClusterConformance):
    options: ClassVar[dict[str, Any]] = {"mode": "pod"}
