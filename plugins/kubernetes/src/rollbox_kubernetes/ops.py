"""Cluster operations behind ``rollbox k8s preflight`` and ``rollbox k8s reap``, and the
backend's ``leftovers`` (what a run still holds)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from rollbox.backend import Diagnostic

from rollbox_kubernetes.client import ApiError, KubeClient, Obj
from rollbox_kubernetes.resources import (
    CLAIMS,
    CRDS,
    LABEL_MANAGED,
    LABEL_RUN,
    MANAGED_BY,
    NETWORK_POLICIES,
    PODS,
    SANDBOXES,
    TEMPLATES,
    WARM_POOLS,
    Resource,
    owned_by,
)

# (verb, group, resource, subresource) the claim mode needs; pod mode needs the pod rows.
NEEDED = (
    [(verb, "extensions.agents.x-k8s.io", plural, "")
     for plural in ("sandboxclaims", "sandboxwarmpools", "sandboxtemplates")
     for verb in ("create", "get", "watch", "delete")]
    + [("patch", "extensions.agents.x-k8s.io", "sandboxwarmpools", "")]
    + [(verb, "agents.x-k8s.io", "sandboxes", "") for verb in ("create", "get", "watch",
                                                                 "delete")]
    + [(verb, "networking.k8s.io", "networkpolicies", "") for verb in ("create", "delete")]
    + [(verb, "", "pods", "") for verb in ("create", "get", "list", "watch", "delete")]
    + [("create", "", "pods", "exec")]
)
PLANNING = [("list", "", "nodes", "")]
"""What ``image_planning`` needs besides: nodes are cluster-scoped (a ClusterRole)."""


async def preflight(client: KubeClient, namespace: str) -> list[Diagnostic]:
    """Namespace, CRDs and permissions, each with the fix when it fails."""
    out: list[Diagnostic] = []
    try:
        await client.call("get", "GET", f"/api/v1/namespaces/{namespace}", idempotent=True)
        out.append(Diagnostic("namespace", True, f"{namespace!r} exists"))
    except ApiError as err:
        if err.status == 0:
            return [Diagnostic("api server", False, f"unreachable: {err.message}",
                               fix="check KUBECONFIG / --context and network access")]
        ok = err.status == 403  # exists, but we may not read namespaces: fine
        out.append(Diagnostic("namespace", ok, f"{namespace!r}: {err.message}",
                              fix=f"kubectl create namespace {namespace}"))
    for crd in CRDS:
        path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}"
        try:
            await client.call("get", "GET", path, idempotent=True)
            out.append(Diagnostic(f"CRD {crd}", True, "installed"))
        except ApiError as err:
            out.append(Diagnostic(
                f"CRD {crd}", False, err.message or str(err.status),
                fix="install agent-sandbox (core and extensions manifests, see "
                    "docs/kubernetes.md), or use mode='pod'",
                required=err.status != 403))
    for verb, group, resource, sub in (*NEEDED, *PLANNING):
        attrs = {"verb": verb, "group": group, "resource": resource}
        if resource != "nodes":  # cluster-scoped
            attrs["namespace"] = namespace
        if sub:
            attrs["subresource"] = sub
        body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                "spec": {"resourceAttributes": attrs}}
        label = f"can {verb} {resource}{'/' + sub if sub else ''}"
        try:
            review = await client.call(
                "create", "POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                body=body, idempotent=True)
            allowed = bool((review.get("status") or {}).get("allowed"))
        except ApiError as err:
            out.append(Diagnostic(label, False, f"review failed: {err}", required=False))
            continue
        if resource == "nodes":
            out.append(Diagnostic(
                f"{label} (image_planning only)", allowed, "allowed" if allowed else "denied",
                fix="kubectl apply the ClusterRole from `rollbox k8s render --image-planning`",
                required=False))
            continue
        out.append(Diagnostic(label, allowed, "allowed" if allowed else "denied",
                              fix="kubectl apply the Role from `rollbox k8s render`"))
    out.append(Diagnostic(
        "controller", True, "not checked from here",
        fix="kubectl -n agent-sandbox-system get deploy agent-sandbox-controller",
        required=False))
    return out


@dataclass
class Reaped:
    kind: str
    names: list[str]


async def reap(client: KubeClient, namespace: str, run_id: str, *,
               dry_run: bool = False) -> list[Reaped]:
    """Delete every object labelled with ``run_id`` (claims first, then directly made
    Sandboxes, pools, templates, the run's NetworkPolicy and left-over pods). Objects of
    other runs are never listed, so never touched."""
    out: list[Reaped] = []
    for res in (CLAIMS, SANDBOXES, WARM_POOLS, TEMPLATES, NETWORK_POLICIES, PODS):
        try:
            listing = await client.list_objects(res, namespace, label_selector=owned_by(run_id))
        except ApiError as err:
            if err.status == 404 and res is not PODS:
                continue  # CRDs not installed: nothing of that kind can exist
            raise
        names = [item["metadata"]["name"] for item in listing.get("items") or []]
        if not dry_run:
            for name in names:
                await client.delete(res, namespace, name)
        out.append(Reaped(res.kind, names))
    return out


async def leftovers(client: KubeClient, namespace: str, run_id: str, *,
                    settle_s: float = 10.0) -> list[str]:
    """What one run still holds in the cluster: its claims, its directly made Sandboxes,
    and its pods that are not warm capacity of one of its live pools (one line each,
    ``Kind/name``).

    Objects on their way out (a deletionTimestamp, or an owner already gone, so the
    garbage collector will remove them) get ``settle_s`` to disappear before they count.
    Templates and warm pools are the backend's cache, not leaks: ``aclose`` deletes them.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + settle_s
    while True:
        held, pending = await _held(client, namespace, run_id)
        if not pending or loop.time() >= deadline:
            return sorted(held)
        await asyncio.sleep(0.1)


async def _items(client: KubeClient, res: Resource, namespace: str,
                 selector: str = "") -> list[Obj]:
    try:
        listing = await client.list_objects(res, namespace, label_selector=selector)
    except ApiError as err:
        if err.status == 404 and res is not PODS:
            return []  # CRDs not installed: nothing of that kind can exist
        raise
    return list(listing.get("items") or [])


async def _held(client: KubeClient, namespace: str, run_id: str) -> tuple[list[str], bool]:
    claims = await _items(client, CLAIMS, namespace, owned_by(run_id))
    pools = {p["metadata"]["name"] for p in await _items(client, WARM_POOLS, namespace,
                                                          owned_by(run_id))}
    sandboxes = {s["metadata"]["name"]: s for s in await _items(client, SANDBOXES, namespace)}
    claim_names = {c["metadata"]["name"] for c in claims}
    pods = await _items(client, PODS, namespace, owned_by(run_id))
    held = [f"SandboxClaim/{c['metadata']['name']}" for c in claims]
    pending = any(c["metadata"].get("deletionTimestamp") for c in claims)
    direct = {name for name, s in sandboxes.items() if _is_direct(s, run_id)}
    held += [f"Sandbox/{name}" for name in sorted(direct)]
    pending |= any(sandboxes[name]["metadata"].get("deletionTimestamp") for name in direct)
    for pod in pods:
        meta = pod["metadata"]
        owners = [o for o in meta.get("ownerReferences") or [] if o.get("kind") == "Sandbox"]
        sandbox = sandboxes.get(owners[0]["name"]) if owners else None
        sandbox_owners = (sandbox or {}).get("metadata", {}).get("ownerReferences") or []
        if any(o.get("kind") == "SandboxWarmPool" and o.get("name") in pools
               for o in sandbox_owners):
            continue  # warm capacity of a live pool
        if owners and owners[0]["name"] in direct:
            continue  # listed as its Sandbox
        held.append(f"Pod/{meta['name']}")
        gone_owner = (owners and sandbox is None) or (sandbox is not None and not any(
            (o.get("kind") == "SandboxClaim" and o.get("name") in claim_names)
            or (o.get("kind") == "SandboxWarmPool" and o.get("name") in pools)
            for o in sandbox_owners))
        pending |= bool(meta.get("deletionTimestamp")) or bool(gone_owner)
    return held, pending


def _is_direct(sandbox: Obj, run_id: str) -> bool:
    """A Sandbox this run created itself: its labels, and no claim or pool owns it."""
    meta = sandbox["metadata"]
    labels = meta.get("labels") or {}
    return (labels.get(LABEL_RUN) == run_id and labels.get(LABEL_MANAGED) == MANAGED_BY
            and not meta.get("ownerReferences"))
