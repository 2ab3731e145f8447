"""Tests against a real control plane (``k8s_cluster``: tests/cluster/build.sh's binaries,
or ``ROLLBOX_K8S_KUBECONFIG``'s cluster). Every module here must leave nothing with
rollbox's labels behind: ``no_leftovers`` checks after each one."""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from rollbox_kubernetes import KubernetesBackend
from rollbox_kubernetes.resources import LABEL_MANAGED, MANAGED_BY
from rollbox_kubernetes.testing.controlplane import find_kubectl
from rollbox_kubernetes.testing.fixtures import ClusterAccess

KINDS = ("sandboxclaims", "sandboxes", "sandboxwarmpools", "sandboxtemplates",
         "networkpolicies", "pods")
BackendFactory = Callable[..., KubernetesBackend]


def kubectl(cluster: ClusterAccess, *args: str, input: bytes | None = None,
            check: bool = True) -> subprocess.CompletedProcess[bytes]:
    result = subprocess.run([find_kubectl(), "--kubeconfig", cluster.kubeconfig,
                             "-n", cluster.namespace, *args], input=input,
                            capture_output=True, timeout=120)
    if check and result.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)}: {result.stderr.decode()}")
    return result


def rollbox_objects(cluster: ClusterAccess, selector: str = f"{LABEL_MANAGED}={MANAGED_BY}"
                    ) -> list[str]:
    out = kubectl(cluster, "get", ",".join(KINDS), "-l", selector, "-o", "json")
    items: list[dict[str, Any]] = json.loads(out.stdout)["items"]
    return sorted(f"{i['kind']}/{i['metadata']['name']}" for i in items)


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
        subprocess.run(["sleep", "0.2"], check=True)
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
