"""Helpers for the tests against a real control plane."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from typing import Any

from rollbox_kubernetes import KubernetesBackend
from rollbox_kubernetes.resources import LABEL_MANAGED, MANAGED_BY
from rollbox_kubernetes.testing.controlplane import find_kubectl
from rollbox_kubernetes.testing.fixtures import ClusterAccess

# The test cluster's node agent runs "host" over the host's system directories; another
# cluster (ROLLBOX_K8S_KUBECONFIG) pulls ROLLBOX_K8S_IMAGE.
IMAGE = (os.environ.get("ROLLBOX_K8S_IMAGE", "debian:bookworm-slim")
         if os.environ.get("ROLLBOX_K8S_KUBECONFIG") else "host")
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
    """``Kind/name`` of every object of ``KINDS`` that ``selector`` picks."""
    out = kubectl(cluster, "get", ",".join(KINDS), "-l", selector, "-o", "json")
    items: list[dict[str, Any]] = json.loads(out.stdout)["items"]
    return sorted(f"{i['kind']}/{i['metadata']['name']}" for i in items)
