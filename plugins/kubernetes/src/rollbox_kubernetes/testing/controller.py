"""The cluster behind the emulator: a test-only agent-sandbox controller and kubelet.

Controller, following upstream's documented behaviour (not its code):
- every Sandbox gets one pod of the same name from its ``podTemplate``, owned by it, and
  a ``Ready`` condition that mirrors the pod; a Sandbox created directly (no claim, no
  pool) is handled exactly like one the extensions made; a Sandbox's pod deleted while
  the Sandbox lives is made again under the same name, empty (a new uid and IP);
- a SandboxWarmPool keeps ``replicas`` warm Sandboxes, labelled with the pool and owned
  by it: scaling up creates more, scaling down deletes the surplus unclaimed ones (those
  not ready first, then the newest);
- a SandboxClaim adopts a warm Sandbox of its pool, ready ones first, oldest first:
  annotates the claim with ``agents.x-k8s.io/sandbox-name``, moves the Sandbox's
  ownership from pool to claim, drops the pool label, sets ``launch-type=warm``; the pool
  then replenishes. With no warm Sandbox it cold-starts one from the template. A claim on
  a pool that does not exist gets ``Ready=False, reason WarmPoolNotFound``, and one
  whose ``additionalPodMetadata`` has a label outside upstream's default allowlist
  (``sandbox.users.io``) ``Ready=False, reason InvalidMetadata``. Upstream's cache can
  lag behind a template created a moment before the claim: ``unseen_templates`` claims
  get ``Ready=False, reason TemplateNotFound`` although it exists, and, as upstream, an
  unbound claim in that state is reconciled again at its next metadata update;
- Sandbox ``Ready`` mirrors the pod (Running, Ready, with an IP), and the claim mirrors
  its Sandbox's ``Ready`` plus ``status.sandbox.name``; deleting a claim deletes its
  Sandbox and pod through owner references.

Kubelet: each new pod is scheduled (unless its nodeSelector does not match
``node_labels``: ``PodScheduled=False, Unschedulable``), then backed by a sandbox of the
backing rollbox backend. An image the backend cannot find leaves the pod waiting in
``ImagePullBackOff``; images in ``stall_images`` never become ready. The container's
memory, cpu and ephemeral-storage limits become the backing sandbox's (a cgroup and the
kubelet's eviction do that on a node); a
pod whose template carries a deny-all ``networkPolicy``, or that a deny-all
NetworkPolicy of its namespace selects when it starts, gets no network (a CNI that
enforces NetworkPolicy does that), others the host's.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from pathlib import Path
from typing import Any

from rollbox.backend import Backend
from rollbox.errors import ImageError, RollboxError
from rollbox.sandbox import Sandbox
from rollbox.spec import Network, Resources, SandboxSpec

from rollbox_kubernetes.quantities import MIB, quantity
from rollbox_kubernetes.testing.runtime import Runtimes
from rollbox_kubernetes.testing.store import Conflict, Obj, Store

CORE = "agents.x-k8s.io/v1beta1"
POOL_LABEL = "agents.x-k8s.io/warm-pool"
LAUNCH_LABEL = "agents.x-k8s.io/launch-type"
SANDBOX_ANNOTATION = "agents.x-k8s.io/sandbox-name"
# Label domains a claim's additionalPodMetadata may use (upstream's default allowlist).
LABEL_DOMAINS = ("sandbox.users.io",)


REMAKE_AFTER_S = 0.5
"""How long after its pod is gone a live Sandbox gets a new one (upstream: a reconcile, a
schedule and a kubelet's start; seconds)."""


def _owner(obj: Obj, kind: str) -> dict[str, Any]:
    return {"apiVersion": obj.get("apiVersion", ""), "kind": kind,
            "name": obj["metadata"]["name"], "uid": obj["metadata"]["uid"],
            "controller": True}


# A kubelet sets no per-pod process limit unless ``--pod-max-pids`` is given; the backing
# sandbox gets a generous one, so a pod's exec wrappers (several processes per command, 100
# commands at once in the conformance suite) never hit the local backend's smaller default.
POD_MAX_PIDS = 4096


def limits(container: Obj) -> Resources:
    """The container's limits as the backing sandbox's resources: memory, cpu and
    ephemeral-storage (the kubelet evicts a pod past it; the sandbox's writable layer
    stops there with ENOSPC)."""
    found = (container.get("resources") or {}).get("limits") or {}
    memory_mb: int | None = None  # absent: the backing backend's default
    cpus: float | None = None
    disk_mb: int | None = None
    if "memory" in found:
        memory_mb = max(1, int(quantity(str(found["memory"])) / MIB))
    if "cpu" in found:
        cpus = quantity(str(found["cpu"]))
    if "ephemeral-storage" in found:
        disk_mb = max(1, int(quantity(str(found["ephemeral-storage"])) / MIB))
    return Resources(cpus=cpus, memory_mb=memory_mb, disk_mb=disk_mb, pids=POD_MAX_PIDS)


def container_runtime(state_dir: str | Path) -> Backend:
    """The local backend as a test node's container runtime: pods are its sandboxes.
    Without ``exec_isolation``: a pod's execs are not kept apart from each other (on a
    node they are not), and the Kubernetes backend finds a command's processes by
    reading their ``/proc/PID/environ`` from another exec."""
    from rollbox_local import LocalBackend

    return LocalBackend(state_dir=state_dir, exec_isolation=False)


def _cond(kind: str, ok: bool, reason: str, message: str = "") -> Obj:
    return {"type": kind, "status": "True" if ok else "False", "reason": reason,
            "message": message}


class FakeCluster:
    def __init__(self, store: Store, backing: Backend, *,
                 node_labels: dict[str, str], runtimes: Runtimes | None = None) -> None:
        self.store = store
        self.backing = backing
        self.node_labels = node_labels
        self.stall_images: set[str] = set()
        self.sandboxes: dict[tuple[str, str], Sandbox] = {}
        self.pods_started = 0
        self.networks: dict[tuple[str, str], Network] = {}
        self._queue: asyncio.Queue[tuple[str, str, Obj]] = asyncio.Queue()
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.Task[None] | None = None
        self._ips = 0
        # Pod IPs are loopback addresses in 127.1-127.x.x: with no runtime served there,
        # a probe of the in-sandbox HTTP runtime is refused at once and never leaves the
        # machine. Served runtimes take addresses from 127.128 up (runtime.py).
        self._ip_base = f"127.{secrets.randbelow(127) + 1}"
        self.runtimes = runtimes
        self.unseen_templates = 0
        """How many of the next claims the controller binds as if its cache had not yet
        seen their template (upstream: ``TemplateNotFound``, retried a minute later or at
        the claim's next update)."""
        self._claim_meta: dict[tuple[str, str], object] = {}

    def start(self) -> None:
        self.store.listeners.append(lambda kind, plural, obj: self._queue.put_nowait(
            (kind, plural, obj)))
        self._loop = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._loop is not None:
            self._loop.cancel()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._loop is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop
        if self.runtimes is not None:
            await self.runtimes.stop_all()
        for sandbox in list(self.sandboxes.values()):
            with contextlib.suppress(RollboxError, OSError):
                await sandbox.close()
        self.sandboxes.clear()
        await self.backing.aclose()

    def backing_sandbox(self, ns: str, pod: str) -> Sandbox | None:
        return self.sandboxes.get((ns, pod))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self) -> None:
        while True:
            kind, plural, obj = await self._queue.get()
            with contextlib.suppress(Conflict):
                self._react(kind, plural, obj)

    def _react(self, kind: str, plural: str, obj: Obj) -> None:
        meta = obj["metadata"]
        ns, name = meta["namespace"], meta["name"]
        if plural == "pods":
            if kind == "ADDED":
                self._spawn(self._start_pod(ns, name))
            elif kind == "DELETED":
                self.networks.pop((ns, name), None)
                sandbox = self.sandboxes.pop((ns, name), None)
                if self.runtimes is not None:
                    self._spawn(self.runtimes.stop((ns, name)))
                if sandbox is not None:
                    self._spawn(sandbox.close())
            self._sync_sandbox(ns, name)
            if kind == "DELETED":  # its Sandbox lives on: a pod of its own again, after
                self._spawn(self._remake_pod(ns, name))  # a reconcile, as upstream's
        elif plural == "sandboxwarmpools" and kind != "DELETED":
            self._fill_pool(ns, name)
        elif plural == "sandboxes":
            pool = (meta.get("labels") or {}).get(POOL_LABEL)
            if kind == "ADDED":
                self._make_pod(ns, name)
            if pool and kind == "DELETED":
                self._fill_pool(ns, pool)
            self._sync_claims(ns, name)
        elif plural == "sandboxclaims":
            seen = (meta.get("annotations"), meta.get("labels"))
            if kind == "DELETED":
                self._claim_meta.pop((ns, name), None)
            elif kind == "ADDED" or (self._claim_meta.get((ns, name)) != seen
                                     and self._waiting_for_dependency(obj)):
                self._bind(obj)
            if kind != "DELETED":
                self._claim_meta[(ns, name)] = seen

    # -- warm pools and claims ---------------------------------------------------------

    def _new_sandbox(self, ns: str, template_name: str, owner: Obj, owner_kind: str,
                     labels: dict[str, str]) -> Obj | None:
        template = self.store.get("sandboxtemplates", ns, template_name)
        if template is None:
            return None
        name = f"{template_name[:40]}-{secrets.token_hex(3)}"
        pod_template = template["spec"]["podTemplate"]
        policy = template["spec"].get("networkPolicy")
        if policy is not None and not policy.get("egress") and not policy.get("ingress"):
            self.networks[(ns, name)] = Network.NONE
        return self.store.create("sandboxes", ns, {
            "apiVersion": CORE, "kind": "Sandbox",
            "metadata": {"name": name, "labels": labels,
                         "ownerReferences": [_owner(owner, owner_kind)]},
            "spec": {"podTemplate": pod_template},
        })

    async def _remake_pod(self, ns: str, name: str) -> None:
        await asyncio.sleep(REMAKE_AFTER_S)
        self._make_pod(ns, name)

    def _make_pod(self, ns: str, name: str) -> None:
        """The Sandbox's one pod, named after it, from its pod template."""
        sandbox = self.store.get("sandboxes", ns, name)
        if sandbox is None or self.store.get("pods", ns, name) is not None:
            return
        pod_template = sandbox["spec"]["podTemplate"]
        labels = dict((pod_template.get("metadata") or {}).get("labels") or {})
        if self._denied(ns, labels):
            self.networks[(ns, name)] = Network.NONE
        self.store.create("pods", ns, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": labels,
                         "ownerReferences": [_owner(sandbox, "Sandbox")]},
            "spec": pod_template["spec"],
        })

    def _network(self, ns: str, name: str, pod: Obj) -> Network:
        """A pod's network: decided when its Sandbox made it, else (a bare pod) by the
        NetworkPolicies that select it now, as an enforcing CNI would."""
        if (ns, name) not in self.networks and self._denied(
                ns, dict(pod["metadata"].get("labels") or {})):
            self.networks[(ns, name)] = Network.NONE
        return self.networks.get((ns, name), Network.HOST)

    def _denied(self, ns: str, labels: dict[str, str]) -> bool:
        """A NetworkPolicy of ``ns`` selects these labels and allows no egress."""
        for policy in self.store.list("networkpolicies", ns):
            spec = policy.get("spec") or {}
            wanted = (spec.get("podSelector") or {}).get("matchLabels") or {}
            if (all(labels.get(k) == v for k, v in wanted.items())
                    and "Egress" in (spec.get("policyTypes") or []) and not spec.get("egress")):
                return True
        return False

    def _warm(self, ns: str, pool: str) -> list[Obj]:
        return [s for s in self.store.list("sandboxes", ns)
                if (s["metadata"].get("labels") or {}).get(POOL_LABEL) == pool]

    def _fill_pool(self, ns: str, name: str) -> None:
        pool = self.store.get("sandboxwarmpools", ns, name)
        if pool is None:
            return
        warm = self._warm(ns, name)
        missing = int(pool["spec"].get("replicas", 0)) - len(warm)
        template = pool["spec"]["sandboxTemplateRef"]["name"]
        for _ in range(max(0, missing)):
            self._new_sandbox(ns, template, pool, "SandboxWarmPool", {POOL_LABEL: name})
        surplus = sorted(warm, key=lambda s: (self._ready(s),
                                              -int(s["metadata"]["resourceVersion"])))
        for sandbox in surplus[:max(0, -missing)]:
            self.store.delete("sandboxes", ns, sandbox["metadata"]["name"])

    @staticmethod
    def _waiting_for_dependency(claim: Obj) -> bool:
        """Unbound, with its template or pool reported missing."""
        if SANDBOX_ANNOTATION in (claim["metadata"].get("annotations") or {}):
            return False
        return any(c.get("type") == "Ready" and c.get("reason") in (
            "TemplateNotFound", "WarmPoolNotFound")
            for c in (claim.get("status") or {}).get("conditions") or [])

    def _bind(self, claim: Obj) -> None:
        ns, name = claim["metadata"]["namespace"], claim["metadata"]["name"]
        pool_name = claim["spec"]["warmPoolRef"]["name"]
        if self.unseen_templates > 0:
            self.unseen_templates -= 1
            self.store.patch("sandboxclaims", ns, name, {"status": {"conditions": [_cond(
                "Ready", False, "TemplateNotFound",
                f'SandboxTemplate "{pool_name}" not found')]}})
            return
        extra = (claim["spec"].get("additionalPodMetadata") or {}).get("labels") or {}
        refused = [k for k in extra if k.partition("/")[0].lower() not in LABEL_DOMAINS
                   and not any(k.partition("/")[0].lower().endswith("." + d)
                               for d in LABEL_DOMAINS)]
        if refused:  # upstream checks these before anything else
            self.store.patch("sandboxclaims", ns, name, {"status": {"conditions": [_cond(
                "Ready", False, "InvalidMetadata",
                f"invalid additionalPodMetadata: label domain of {refused[0]!r} is not in "
                "the allowlist")]}})
            return
        pool = self.store.get("sandboxwarmpools", ns, pool_name)
        if pool is None:
            self.store.patch("sandboxclaims", ns, name, {"status": {"conditions": [_cond(
                "Ready", False, "WarmPoolNotFound",
                f'SandboxWarmPool "{pool_name}" not found')]}})
            return
        warm = sorted(self._warm(ns, pool_name), key=lambda s: (
            not self._ready(s), int(s["metadata"]["resourceVersion"])))
        if warm:
            chosen = warm[0]
            labels = {k: v for k, v in (chosen["metadata"].get("labels") or {}).items()
                      if k != POOL_LABEL}
            labels.update({LAUNCH_LABEL: "warm", **extra})
            sandbox = self.store.patch("sandboxes", ns, chosen["metadata"]["name"], {
                "metadata": {"labels": {POOL_LABEL: None, **labels},
                             "ownerReferences": [_owner(claim, "SandboxClaim")]}})
            self._fill_pool(ns, pool_name)
        else:
            sandbox = self._new_sandbox(ns, pool["spec"]["sandboxTemplateRef"]["name"], claim,
                                        "SandboxClaim", {LAUNCH_LABEL: "cold", **extra})
        if sandbox is None:
            self.store.patch("sandboxclaims", ns, name, {"status": {"conditions": [_cond(
                "Ready", False, "TemplateNotFound", "SandboxTemplate not found")]}})
            return
        sandbox_name = sandbox["metadata"]["name"]
        self.store.patch("sandboxclaims", ns, name, {
            "metadata": {"annotations": {SANDBOX_ANNOTATION: sandbox_name}}})
        self._sync_claims(ns, sandbox_name)

    @staticmethod
    def _ready(sandbox: Obj) -> bool:
        for cond in (sandbox.get("status") or {}).get("conditions") or []:
            if cond.get("type") == "Ready":
                return bool(cond.get("status") == "True")
        return False

    def _sync_sandbox(self, ns: str, pod_name: str) -> None:
        sandbox = self.store.get("sandboxes", ns, pod_name)
        if sandbox is None:
            return
        pod = self.store.get("pods", ns, pod_name)
        status = (pod or {}).get("status") or {}
        ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                    for c in status.get("conditions") or [])
        if pod is None:
            message = "Pod does not exist"
        elif ready and status.get("podIP"):
            message = "Pod is Ready"
        else:
            message = f"Pod exists with phase: {status.get('phase', 'Pending')}"
        ok = message == "Pod is Ready"
        cond = _cond("Ready", ok, "DependenciesReady" if ok else "DependenciesNotReady", message)
        old = (sandbox.get("status") or {}).get("conditions")
        if old != [cond]:
            self.store.patch("sandboxes", ns, pod_name, {"status": {
                "conditions": [cond], "podIPs": [status["podIP"]] if ok else []}})

    def _sync_claims(self, ns: str, sandbox_name: str) -> None:
        sandbox = self.store.get("sandboxes", ns, sandbox_name)
        if sandbox is None:
            return
        for ref in sandbox["metadata"].get("ownerReferences") or []:
            if ref.get("kind") != "SandboxClaim":
                continue
            claim = self.store.get("sandboxclaims", ns, ref["name"])
            if claim is None:
                continue
            conds = (sandbox.get("status") or {}).get("conditions") or [
                _cond("Ready", False, "SandboxNotReady", "Sandbox is not ready")]
            status = {"conditions": conds, "sandbox": {
                "name": sandbox_name, "podIPs": (sandbox.get("status") or {}).get("podIPs")}}
            if (claim.get("status") or {}) != status:
                self.store.patch("sandboxclaims", ns, ref["name"], {"status": status})

    # -- kubelet -----------------------------------------------------------------------

    async def _start_pod(self, ns: str, name: str) -> None:
        pod = self.store.get("pods", ns, name)
        if pod is None:
            return
        spec = pod["spec"]
        selector = spec.get("nodeSelector") or {}
        if any(self.node_labels.get(k) != v for k, v in selector.items()):
            self.store.patch("pods", ns, name, {"status": {"phase": "Pending", "conditions": [
                _cond("PodScheduled", False, "Unschedulable",
                      "0/1 nodes are available: 1 node(s) didn't match Pod's node "
                      "affinity/selector.")]}})
            return
        container = spec["containers"][0]
        self.store.patch("pods", ns, name, {"status": {"phase": "Pending", "conditions": [
            _cond("PodScheduled", True, "")], "containerStatuses": [
            {"name": container["name"], "ready": False,
             "state": {"waiting": {"reason": "ContainerCreating"}}}]}})
        image = container["image"]
        if image in self.stall_images:
            return
        env = {e["name"]: e.get("value", "") for e in container.get("env") or []}
        sandbox_spec = SandboxSpec(image=image, workdir=container.get("workingDir") or "/",
                                   env=env, resources=limits(container),
                                   network=self._network(ns, name, pod))
        try:
            sandbox = await self.backing.create(sandbox_spec)
        except ImageError as exc:
            self.store.patch("pods", ns, name, {"status": {"containerStatuses": [
                {"name": container["name"], "ready": False, "state": {"waiting": {
                    "reason": "ImagePullBackOff",
                    "message": f'Back-off pulling image "{image}": {exc.message}'}}}]}})
            return
        except RollboxError as exc:
            self.store.patch("pods", ns, name, {"status": {"phase": "Failed",
                                                           "message": exc.message}})
            return
        if self.store.get("pods", ns, name) is None:
            await sandbox.close()
            return
        self.sandboxes[(ns, name)] = sandbox
        self.pods_started += 1
        self._ips += 1
        ip = f"{self._ip_base}.{(self._ips >> 8) & 255}.{self._ips & 255}"
        if self.runtimes is not None:
            ip = await self.runtimes.start((ns, name), sandbox, env)
            if self.store.get("pods", ns, name) is None:
                await self.runtimes.stop((ns, name))
                return
        self.store.patch("pods", ns, name, {"status": {
            "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
            "conditions": [_cond("PodScheduled", True, ""), _cond("Ready", True, "")],
            "containerStatuses": [{"name": container["name"], "ready": True,
                                   "state": {"running": {}}}]}})
