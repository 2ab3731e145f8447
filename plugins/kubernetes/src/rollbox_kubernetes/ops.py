"""Cluster operations behind ``rollbox k8s preflight`` and ``rollbox k8s reap``."""

from __future__ import annotations

from dataclasses import dataclass

from rollbox.backend import Diagnostic

from rollbox_kubernetes.client import ApiError, KubeClient
from rollbox_kubernetes.resources import CLAIMS, CRDS, PODS, TEMPLATES, WARM_POOLS, owned_by

# (verb, group, resource, subresource) the claim mode needs; pod mode needs the pod rows.
NEEDED = (
    [(verb, "extensions.agents.x-k8s.io", plural, "")
     for plural in ("sandboxclaims", "sandboxwarmpools", "sandboxtemplates")
     for verb in ("create", "get", "watch", "delete")]
    + [(verb, "", "pods", "") for verb in ("create", "get", "watch", "delete")]
    + [("create", "", "pods", "exec")]
)


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
    for verb, group, resource, sub in NEEDED:
        attrs = {"namespace": namespace, "verb": verb, "group": group, "resource": resource}
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
    """Delete every object labelled with ``run_id`` (claims first, then pools, templates
    and left-over pods). Objects of other runs are never listed, so never touched."""
    out: list[Reaped] = []
    for res in (CLAIMS, WARM_POOLS, TEMPLATES, PODS):
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
