"""Tests against a real control plane (``k8s_cluster``: tests/cluster/build.sh's binaries,
or ``ROLLBOX_K8S_KUBECONFIG``'s cluster). Every module here must leave nothing with
rollbox's labels behind: ``no_leftovers`` checks after each one."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from cluster_support import BackendFactory, rollbox_objects
from rollbox_kubernetes import KubernetesBackend
from rollbox_kubernetes.testing.fixtures import ClusterAccess


@pytest.fixture(scope="module", autouse=True)
def no_leftovers(k8s_cluster: ClusterAccess) -> Iterator[None]:
    """After the module: no object labelled managed-by=rollbox in the namespace (given
    the garbage collector some seconds for pods whose owner is gone)."""
    yield
    left: list[str] = []
    for _ in range(150):
        left = rollbox_objects(k8s_cluster)
        if not left:
            return
        time.sleep(0.2)
    pytest.fail(f"objects with rollbox's labels left behind: {left}")


@pytest.fixture
async def make_backend(k8s_cluster: ClusterAccess) -> AsyncIterator[BackendFactory]:
    """Backends on the cluster, each with its own run id, all closed at the end."""
    made: list[KubernetesBackend] = []

    def make(cls: type[KubernetesBackend] = KubernetesBackend, **options: Any
             ) -> KubernetesBackend:
        defaults: dict[str, Any] = {
            "kubeconfig": k8s_cluster.kubeconfig, "namespace": k8s_cluster.namespace,
            "runtime_class": k8s_cluster.runtime_class,
            "run_id": f"t-{uuid.uuid4().hex[:8]}"}
        backend = cls(**{**defaults, **options})
        made.append(backend)
        return backend

    try:
        yield make
    finally:
        await asyncio.gather(*(b.aclose() for b in made), return_exceptions=True)
