"""rollbox backend for Kubernetes: kubernetes-sigs/agent-sandbox warm pools and claims
(or raw pods, the baseline) through kubernetes-asyncio."""

from rollbox_kubernetes.backend import KubernetesBackend
from rollbox_kubernetes.client import ApiError, KubeClient, RequestStats
from rollbox_kubernetes.render import KubeOptions

__all__ = ["ApiError", "KubeClient", "KubeOptions", "KubernetesBackend", "RequestStats"]
