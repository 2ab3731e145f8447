"""Objects rendered from a ``SandboxSpec``: template, warm pool, claim, raw pod, RBAC.

Pure functions over plain dicts (what the API server takes as JSON), so the same code
feeds the backend, ``rollbox k8s render`` and the tests.

Mapping from the spec:

- ``image``, ``workdir``, ``env`` → the one container (``workingDir``, ``env``); the
  container only keeps the pod alive (``keepalive``), commands arrive through exec; an
  empty ``keepalive`` leaves the image's own entrypoint, for images that serve
  agent-sandbox's HTTP runtime.
- ``resources`` → requests = limits (cpu, memory, ephemeral-storage), so a sandbox gets
  what it asked for and no more (Guaranteed QoS).
- ``network=none`` → a template ``networkPolicy`` with no rules: upstream's controller
  then denies all ingress and egress. ``network=host`` → no ``networkPolicy``: upstream's
  secure default (public internet only, no cluster-internal or metadata addresses).
- A directly created ``Sandbox`` carries the same ``podTemplate`` (labels included) as
  the template would. A bare Sandbox has no ``networkPolicy`` field, so for
  ``network=none`` its pod (and a raw pod, ``mode="pod"``) gets the label
  ``rollbox.dev/network=none`` and the run's deny-all ``NetworkPolicy`` (``deny_all``)
  selects it; for ``network=host`` nothing
  restricts it (the cluster's own policies apply, not upstream's template default).
- ``KubeOptions`` adds what a spec does not say: runtimeClassName (e.g. ``gvisor``),
  nodeSelector, tolerations, the warm pool size ``rollbox k8s render`` writes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rollbox.errors import InvalidSpecError
from rollbox.sandbox import Sandbox
from rollbox.spec import Network, SandboxSpec

from rollbox_kubernetes.resources import (
    CLAIMS,
    CORE_GROUP,
    EXT_GROUP,
    LABEL_MANAGED,
    LABEL_NETWORK,
    LABEL_PREPULL,
    LABEL_RUN,
    LABEL_SPEC,
    MANAGED_BY,
    NETWORK_POLICIES,
    NODES,
    PODS,
    SANDBOXES,
    TEMPLATES,
    WARM_POOLS,
    check_run_id,
    digest,
    label_problem,
    namespace_problem,
)

Obj = dict[str, Any]
CONTAINER = "sandbox"
DEFAULT_KEEPALIVE = ("sleep", "infinity")


@dataclass(frozen=True)
class KubeOptions:
    """Cluster-side choices a ``SandboxSpec`` does not carry."""

    namespace: str = "default"
    run_id: str = "rollbox"
    runtime_class: str | None = None
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: Sequence[Mapping[str, Any]] = ()
    warm_replicas: int = 2
    """Replicas of a warm pool rendered without an explicit count (``rollbox k8s render
    --replicas``); the backend sizes the pools it creates from the pool policy."""
    keepalive: Sequence[str] = DEFAULT_KEEPALIVE
    image_pull_policy: str = "IfNotPresent"
    service_account: str = "rollbox"

    def __post_init__(self) -> None:
        check_run_id(self.run_id)
        problem = namespace_problem(self.namespace)
        if problem is not None:
            raise InvalidSpecError(f"namespace {self.namespace!r} {problem}")
        for key, value in self.node_selector.items():
            if (problem := label_problem(key, value)) is not None:
                raise InvalidSpecError(f"node selector {key}={value}: {problem}")
        if isinstance(self.warm_replicas, bool) or not isinstance(self.warm_replicas, int) or (
                self.warm_replicas < 0):
            raise InvalidSpecError(f"warm_replicas must be a whole number >= 0, "
                                   f"got {self.warm_replicas!r}")


def labels(options: KubeOptions, spec_key: str | None = None) -> dict[str, str]:
    out = {LABEL_MANAGED: MANAGED_BY, LABEL_RUN: options.run_id}
    if spec_key is not None:
        out[LABEL_SPEC] = spec_key
    return out


def container_env(spec: SandboxSpec) -> dict[str, str]:
    """The environment a plain exec sees: the spec's env over core's defaults.

    Core's ``Sandbox.request`` resolves exec env the same way, so when a caller passes
    no extra env the backend can exec the argv as is (no ``env -i`` wrapper needed).
    """
    probe = _Probe(spec)
    return dict(probe.request(["true"]).env)


def _resources(spec: SandboxSpec) -> Obj:
    res = spec.resources.or_defaults()
    assert res.cpus is not None
    cpu = f"{math.ceil(res.cpus * 1000)}m"
    amounts = {"cpu": cpu, "memory": f"{res.memory_mb}Mi",
               "ephemeral-storage": f"{res.disk_mb}Mi"}
    return {"requests": dict(amounts), "limits": dict(amounts)}


def spec_key(spec: SandboxSpec, options: KubeOptions) -> str:
    """A stable name part for ``spec`` under ``options``: specs that share it share a
    template. The network is part of it: it is not in the pod spec but in the template's
    ``networkPolicy`` (two specs differing only there once shared one template).
    """
    return digest({"pod": pod_spec(spec, options), "network": spec.network.value})


def pod_spec(spec: SandboxSpec, options: KubeOptions) -> Obj:
    container: Obj = {
        "name": CONTAINER,
        "image": spec.image,
        "imagePullPolicy": options.image_pull_policy,
        "workingDir": spec.workdir,
        "env": [{"name": k, "value": v} for k, v in sorted(container_env(spec).items())],
        "resources": _resources(spec),
    }
    if options.keepalive:  # empty: the image's own entrypoint runs (e.g. its HTTP runtime)
        container["command"] = list(options.keepalive)
    out: Obj = {
        "containers": [container],
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 2,
    }
    if options.runtime_class:
        out["runtimeClassName"] = options.runtime_class
    if options.node_selector:
        out["nodeSelector"] = dict(options.node_selector)
    if options.tolerations:
        out["tolerations"] = [dict(t) for t in options.tolerations]
    return out


def template_name(key: str, options: KubeOptions) -> str:
    """Per run, so one run's teardown never deletes a template another run uses."""
    return f"rbx-{options.run_id}-{key}"


def template(spec: SandboxSpec, options: KubeOptions) -> Obj:
    key = spec_key(spec, options)
    body: Obj = {
        "apiVersion": TEMPLATES.api_version,
        "kind": TEMPLATES.kind,
        "metadata": _meta(template_name(key, options), options, key),
        "spec": {
            "podTemplate": {"metadata": {"labels": labels(options, key)},
                            "spec": pod_spec(spec, options)},
        },
    }
    if spec.network is Network.NONE:
        body["spec"]["networkPolicy"] = {"ingress": [], "egress": []}
    return body


def warm_pool(spec: SandboxSpec, options: KubeOptions, replicas: int | None = None) -> Obj:
    key = spec_key(spec, options)
    return {
        "apiVersion": WARM_POOLS.api_version,
        "kind": WARM_POOLS.kind,
        "metadata": _meta(template_name(key, options), options, key),
        "spec": {
            "replicas": options.warm_replicas if replicas is None else replicas,
            "sandboxTemplateRef": {"name": template_name(key, options)},
            "updateStrategy": {"type": "OnReplenish"},
        },
    }


def claim(name: str, pool_name: str, key: str, options: KubeOptions) -> Obj:
    """A claim on ``pool_name``. It sets no env or volumes: those force a cold start.
    Nor ``additionalPodMetadata``: the pool's pods carry rollbox's labels from the
    template already, and upstream's controller rejects labels there whose domain is not
    in its allowlist (``sandbox.users.io`` by default) with ``InvalidMetadata``."""
    return {
        "apiVersion": CLAIMS.api_version,
        "kind": CLAIMS.kind,
        "metadata": _meta(name, options, key),
        "spec": {
            "warmPoolRef": {"name": pool_name},
            "lifecycle": {"shutdownPolicy": "Delete"},
        },
    }


def sandbox(name: str, spec: SandboxSpec, options: KubeOptions) -> Obj:
    """A Sandbox made directly, no template or claim: the pod template is the one
    ``template`` renders for ``spec``, so both paths start identical pods."""
    key = spec_key(spec, options)
    pod_labels = labels(options, key)
    if spec.network is Network.NONE:
        pod_labels[LABEL_NETWORK] = Network.NONE.value
    return {
        "apiVersion": SANDBOXES.api_version,
        "kind": SANDBOXES.kind,
        "metadata": _meta(name, options, key),
        "spec": {"podTemplate": {"metadata": {"labels": pod_labels},
                                 "spec": pod_spec(spec, options)}},
    }


def deny_all_name(options: KubeOptions) -> str:
    return f"rbx-{options.run_id}-deny-all"


def deny_all(options: KubeOptions) -> Obj:
    """The run's NetworkPolicy for directly created Sandboxes with ``network=none``: no
    ingress, no egress (what a template's empty ``networkPolicy`` makes upstream)."""
    selector = {**labels(options), LABEL_NETWORK: Network.NONE.value}
    return {
        "apiVersion": NETWORK_POLICIES.api_version,
        "kind": NETWORK_POLICIES.kind,
        "metadata": {"name": deny_all_name(options), "namespace": options.namespace,
                     "labels": labels(options)},
        "spec": {"podSelector": {"matchLabels": selector},
                 "policyTypes": ["Ingress", "Egress"], "ingress": [], "egress": []},
    }


def raw_pod(name: str, spec: SandboxSpec, options: KubeOptions) -> Obj:
    """The baseline: one bare pod per sandbox, no controller involved. Like a direct
    Sandbox's pod, one with ``network=none`` is labelled for the run's deny-all policy."""
    key = spec_key(spec, options)
    meta = _meta(name, options, key)
    if spec.network is Network.NONE:
        meta["labels"][LABEL_NETWORK] = Network.NONE.value
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {**pod_spec(spec, options), "restartPolicy": "Never"},
    }


def prefer_nodes(pod: Obj, nodes: Sequence[str]) -> Obj:
    """``pod`` (a pod spec) preferring ``nodes`` (the ones that hold its image): a
    preferred node affinity of the highest weight, by node name. Preferred, not
    required: a node that is full or gone leaves the pod to the scheduler, which still
    scores image locality."""
    if not nodes:
        return pod
    term = {"weight": 100, "preference": {"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": sorted(nodes)}]}}
    return {**pod, "affinity": {"nodeAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [term]}}}


PREPULL_COMMAND = ("sh", "-c", "exit 0")
"""What a prepull pod's container runs once its image is there. Whether it runs at all
does not matter: a container that starts, ends or fails to start has its image."""


def prepull_pod(name: str, image: str, node: str, options: KubeOptions) -> Obj:
    """A pod that pulls ``image`` onto ``node`` and does nothing else: bound by
    ``nodeName`` (no scheduler), the smallest requests, labelled as the run's so the
    reaper removes one a crash left behind."""
    pod_labels = {**labels(options), LABEL_PREPULL: "true"}
    amounts = {"cpu": "10m", "memory": "16Mi"}
    spec: Obj = {
        "nodeName": node,
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "prepull", "image": image,
                        "imagePullPolicy": options.image_pull_policy,
                        "command": list(PREPULL_COMMAND),
                        "resources": {"requests": amounts, "limits": amounts}}],
    }
    if options.runtime_class:
        spec["runtimeClassName"] = options.runtime_class
    if options.tolerations:
        spec["tolerations"] = [dict(t) for t in options.tolerations]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": options.namespace, "labels": pod_labels},
            "spec": spec}


def node_rbac(options: KubeOptions) -> list[Obj]:
    """What image planning needs beyond the namespace's Role: reading nodes (their images
    and capacity), which are cluster-scoped. ``rollbox k8s render --image-planning``."""
    name = f"rollbox-{options.namespace}-{options.service_account}-nodes"
    meta = {"name": name, "labels": {LABEL_MANAGED: MANAGED_BY}}
    return [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": meta, "rules": [{"apiGroups": [""], "resources": [NODES.plural],
                                      "verbs": ["get", "list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": meta,
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": options.service_account,
                       "namespace": options.namespace}]},
    ]


def rbac(options: KubeOptions) -> list[Obj]:
    """ServiceAccount, Role and RoleBinding with exactly what the backend calls."""
    ns, sa = options.namespace, options.service_account
    rules = [
        {"apiGroups": [EXT_GROUP], "resources": [TEMPLATES.plural, WARM_POOLS.plural,
                                                 CLAIMS.plural],
         "verbs": ["get", "list", "watch", "create", "patch", "delete"]},
        {"apiGroups": [CORE_GROUP], "resources": [SANDBOXES.plural],
         "verbs": ["get", "list", "watch", "create", "delete"]},
        {"apiGroups": [NETWORK_POLICIES.group], "resources": [NETWORK_POLICIES.plural],
         "verbs": ["get", "list", "create", "delete"]},
        {"apiGroups": [""], "resources": [PODS.plural],
         "verbs": ["get", "list", "watch", "create", "delete"]},
        {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create", "get"]},
    ]
    meta = {"namespace": ns, "labels": {LABEL_MANAGED: MANAGED_BY}}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa, **meta}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": sa, **meta}, "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": sa, **meta},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": sa},
         "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]},
    ]


def render_all(specs: Iterable[SandboxSpec], options: KubeOptions, *,
               include_rbac: bool = True, image_planning: bool = False) -> list[Obj]:
    """What ``rollbox k8s render`` prints: RBAC (with ``image_planning``, the node
    reading it needs), then a template and a pool per spec."""
    out = rbac(options) if include_rbac else []
    if include_rbac and image_planning:
        out += node_rbac(options)
    seen: set[str] = set()
    for spec in specs:
        key = spec_key(spec, options)
        if key not in seen:
            seen.add(key)
            out += [template(spec, options), warm_pool(spec, options)]
    return out


def dump(objects: Sequence[Obj]) -> str:
    """YAML documents if PyYAML is importable (it comes with kubernetes-asyncio), else a
    JSON ``List`` (``kubectl apply -f`` takes either)."""
    try:
        import yaml  # type: ignore[import-untyped,unused-ignore]
    except ImportError:  # pragma: no cover - kubernetes-asyncio depends on PyYAML
        import json

        return json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)},
                          indent=2) + "\n"
    return str(yaml.safe_dump_all(list(objects), sort_keys=False))


def _meta(name: str, options: KubeOptions, key: str) -> Obj:
    return {"name": name, "namespace": options.namespace, "labels": labels(options, key)}


class _Probe(Sandbox):
    """Only used to ask core how it resolves exec env for a spec; never runs anything."""

    async def run(self, request: Any) -> Any:
        raise NotImplementedError

    async def read_file(self, path: str) -> bytes:
        raise NotImplementedError

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        raise NotImplementedError

    async def reset(self) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        return None

    def __init__(self, spec: SandboxSpec) -> None:
        super().__init__("probe", spec)
