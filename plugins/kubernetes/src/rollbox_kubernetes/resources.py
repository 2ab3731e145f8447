"""The API resources rollbox touches, the labels it writes, and how objects are named.

Groups and versions follow kubernetes-sigs/agent-sandbox v1beta1: ``Sandbox`` lives in
``agents.x-k8s.io``; ``SandboxTemplate``, ``SandboxWarmPool`` and ``SandboxClaim`` in
``extensions.agents.x-k8s.io``.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from rollbox.errors import InvalidSpecError

CORE_GROUP = "agents.x-k8s.io"
EXT_GROUP = "extensions.agents.x-k8s.io"
VERSION = "v1beta1"

# Labels rollbox writes. ``run`` marks ownership: teardown and the reaper delete only
# objects whose run label is theirs (a fix for upstream issue #1736).
LABEL_MANAGED = "app.kubernetes.io/managed-by"
LABEL_RUN = "rollbox.dev/run"
LABEL_SPEC = "rollbox.dev/spec"
# On the pods of directly created Sandboxes whose spec says network=none: the run's
# deny-all NetworkPolicy selects them (a bare Sandbox has no networkPolicy field).
LABEL_NETWORK = "rollbox.dev/network"
# On the pods that pull an image onto a node ahead of need (hydration.py): no sandbox.
LABEL_PREPULL = "rollbox.dev/prepull"
MANAGED_BY = "rollbox"

# Upstream's annotations: on a claim, the Sandbox it adopted; on a Sandbox, its pod.
ANNOTATION_SANDBOX_NAME = "agents.x-k8s.io/sandbox-name"
ANNOTATION_POD_NAME = "agents.x-k8s.io/pod-name"


@dataclass(frozen=True)
class Resource:
    """One namespaced API resource: enough to build its URL paths."""

    group: str
    version: str
    plural: str
    kind: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None, name: str | None = None,
             sub: str | None = None) -> str:
        """The URL path; ``namespace`` None: across all namespaces (list and watch)."""
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        path = f"{base}/namespaces/{namespace}/{self.plural}" if namespace is not None \
            else f"{base}/{self.plural}"
        if name is not None:
            path += f"/{name}"
        if sub is not None:
            path += f"/{sub}"
        return path


PODS = Resource("", "v1", "pods", "Pod")
NODES = Resource("", "v1", "nodes", "Node")
"""Cluster-scoped: pass namespace None."""
SANDBOXES = Resource(CORE_GROUP, VERSION, "sandboxes", "Sandbox")
TEMPLATES = Resource(EXT_GROUP, VERSION, "sandboxtemplates", "SandboxTemplate")
WARM_POOLS = Resource(EXT_GROUP, VERSION, "sandboxwarmpools", "SandboxWarmPool")
CLAIMS = Resource(EXT_GROUP, VERSION, "sandboxclaims", "SandboxClaim")
NETWORK_POLICIES = Resource("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy")

# The CRDs the claim mode needs, by their full names (what ``preflight`` looks up).
CRDS = tuple(f"{r.plural}.{r.group}" for r in (SANDBOXES, TEMPLATES, WARM_POOLS, CLAIMS))

_RUN_ID = re.compile(r"^[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_LABEL_KEY = re.compile(rf"^([a-z0-9]([-a-z0-9.]{{0,251}}[a-z0-9])?/)?{_LABEL_NAME}$")
_LABEL_VALUE = re.compile(rf"^({_LABEL_NAME})?$")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def run_id_problem(run_id: str) -> str | None:
    """Why ``run_id`` cannot be a run id, or None: it must be a valid label value and
    short enough to prefix object names."""
    if _RUN_ID.match(run_id):
        return None
    return ("must be 1-32 lowercase letters, digits or '-', starting and ending with a "
            "letter or digit")


def check_run_id(run_id: str) -> str:
    problem = run_id_problem(run_id)
    if problem is not None:
        raise InvalidSpecError(f"run id {run_id!r} {problem}")
    return run_id


def namespace_problem(namespace: str) -> str | None:
    """Why ``namespace`` cannot name a namespace (an RFC 1123 label), or None."""
    if _DNS_LABEL.match(namespace):
        return None
    return "must be 1-63 lowercase letters, digits or '-', starting and ending with one of those"


def label_problem(key: str, value: str) -> str | None:
    """Why ``key=value`` cannot be a label (or node selector), or None."""
    if not _LABEL_KEY.match(key):
        return (f"key {key!r} must be an optional DNS prefix and '/', then 1-63 letters, "
                "digits, '-', '_' or '.' starting and ending with a letter or digit")
    if not _LABEL_VALUE.match(value):
        return (f"value {value!r} must be empty or 1-63 letters, digits, '-', '_' or '.' "
                "starting and ending with a letter or digit")
    return None


def digest(obj: Any, length: int = 10) -> str:
    """A short stable hash of a JSON-able object (names templates by their content)."""
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:length]


def owned_by(run_id: str) -> str:
    """The label selector for every object one run created."""
    return f"{LABEL_MANAGED}={MANAGED_BY},{LABEL_RUN}={run_id}"
