"""rollbox backend for Kubernetes: kubernetes-sigs/agent-sandbox warm pools and claims
(or raw pods, the baseline) through kubernetes-asyncio.

The names below are imported on first access: the ``rollbox`` entry point loads
``rollbox_kubernetes.plugin`` for every command, and this package's ``__init__`` runs
with it, so it must not pull in kubernetes-asyncio.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rollbox_kubernetes.backend import KubernetesBackend
    from rollbox_kubernetes.client import ApiError, KubeClient, RequestStats
    from rollbox_kubernetes.render import KubeOptions

_WHERE = {
    "KubernetesBackend": "rollbox_kubernetes.backend",
    "ApiError": "rollbox_kubernetes.client",
    "KubeClient": "rollbox_kubernetes.client",
    "RequestStats": "rollbox_kubernetes.client",
    "KubeOptions": "rollbox_kubernetes.render",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'rollbox_kubernetes' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = ["ApiError", "KubeClient", "KubeOptions", "KubernetesBackend", "RequestStats"]
