"""A node agent in place of the kubelet, for a test cluster whose control plane is real
(kube-apiserver, etcd, kube-controller-manager, kube-scheduler, kwok, the agent-sandbox
controller: tests/cluster/).

kwok keeps the fake nodes alive (status, heartbeats, leases). This agent does the
kubelet's part for the pods the scheduler binds to those nodes:

- **start**: each pod is backed by a sandbox of a rollbox backend (the tests use
  ``rollbox_local.LocalBackend``: bubblewrap) made from the pod's image, working
  directory, env and limits; then the pod gets an IP inside a loopback CIDR, the
  agent serves agent-sandbox's in-sandbox HTTP runtime (runtime.py) on that address,
  and writes the pod's status (Running, Ready, the IP), as a kubelet does. An image the
  backend cannot find leaves the pod waiting in ``ErrImagePull``.
- **network**: decided as a CNI that enforces NetworkPolicy egress would: a pod that a
  policy of its namespace selects with Egress and no egress rule is denied; others may
  use the network. A pod of a SandboxTemplate waits (up to ``policy_wait_s``) for the
  template's managed policy, which the controller makes after the template. The
  decision is the pod's condition ``rollbox.dev/EgressDenied`` (tests read it). Unless
  ``allow_network`` is set, no sandbox gets a network either way: the test cluster runs
  where nothing may leave the machine. Ingress is not enforced: the runtime is served
  from outside the sandbox.
- **exec**: the agent is the nodes' kubelet endpoint (kwok writes its port into node
  status). With the ``ExtendWebSocketsToKubelet`` feature that the nodes declare, the
  API server hands pod exec's WebSocket (v5/v4 channel protocol) straight through, and
  execserver.py runs the command in the pod's sandbox. Only the API server's client
  certificate (signed by ``client_ca``) is let in.
- **images**: with an image manifest (``--image-manifest``), each node has an image
  filesystem of its own and a pod of a manifest's image waits for its pull
  (``ContainerCreating``, events ``Pulling``/``Pulled``, ``Node.status.images``,
  garbage collection, ``ErrImagePull`` for what no disk holds): imagepulls.py.
- **stop**: a pod with a deletionTimestamp has its runtime stopped and its sandbox
  closed, then is deleted for good (grace 0, UID precondition), as a kubelet does.

The container's own command (``sleep infinity``, an image's entrypoint) is not run:
the sandbox is the container, commands arrive by exec or the runtime.

    python -m rollbox_kubernetes.testing.nodeagent --kubeconfig K --node n0 \\
        --listen 127.0.0.1:10250 --tls-cert C --tls-key K --client-ca CA \\
        --pod-cidr 127.77.0.0/16 --state-dir D
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import errno
import ipaddress
import logging
import os
import signal
import ssl
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiohttp import web
from rollbox.backend import Backend
from rollbox.errors import ImageError, RollboxError
from rollbox.sandbox import Sandbox
from rollbox.spec import Network, SandboxSpec

from rollbox_kubernetes.client import ApiError, KubeClient, RequestStats
from rollbox_kubernetes.podexec import V4, V5
from rollbox_kubernetes.resources import NETWORK_POLICIES, NODES, PODS, Resource
from rollbox_kubernetes.testing.controller import container_runtime, limits
from rollbox_kubernetes.testing.execserver import serve_exec
from rollbox_kubernetes.testing.imagepulls import GB, MB, ImageModel, ImagePulls, PodRef
from rollbox_kubernetes.testing.loopback import listener_of
from rollbox_kubernetes.testing.runtime import SandboxRuntime

Obj = dict[str, Any]
log = logging.getLogger("rollbox.nodeagent")

TEMPLATE_HASH_LABEL = "agents.x-k8s.io/sandbox-template-ref-hash"
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
AGENT_LABEL = "rollbox.dev/node-agent"
EGRESS_CONDITION = "rollbox.dev/EgressDenied"
ADDRESS_TRIES = 16
"""Pod IPs tried in a row before a pod fails to start because its address is taken."""


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _cond(kind: str, ok: bool, reason: str = "", message: str = "") -> Obj:
    out: Obj = {"type": kind, "status": "True" if ok else "False",
                "lastTransitionTime": _now()}
    if reason:
        out["reason"] = reason
    if message:
        out["message"] = message
    return out


def selects(selector: Obj, labels: dict[str, str]) -> bool:
    """A Kubernetes LabelSelector (matchLabels, matchExpressions) against ``labels``."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key", ""), expr.get("operator", ""), expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and labels.get(key) in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def denies_egress(policy: Obj) -> bool:
    spec = policy.get("spec") or {}
    return "Egress" in (spec.get("policyTypes") or []) and not spec.get("egress")


@dataclass
class PodState:
    namespace: str
    name: str
    uid: str
    sandbox: Sandbox | None = None
    runtime: SandboxRuntime | None = None
    ip: str = ""
    pulled: tuple[str, str] | None = None
    """(node, image) this pod holds on its node's image disk."""
    stopping: bool = False
    task: asyncio.Task[None] | None = field(default=None, repr=False)
    """The pod's start."""
    released: asyncio.Future[None] | None = field(default=None, repr=False)
    """Its release (``NodeAgent._release``): one, however many ask."""


class IpPool:
    """Pod IPs from a loopback CIDR (all of 127/8 reaches ``lo`` on Linux).

    Like the host-local IPAM plugin, a freed address is the last to come back: handed out
    again at once, a Sandbox's pod that the controller makes again under the same name
    would get its predecessor's address, and a client still talking to the old runtime
    there could not tell the pod had changed."""

    def __init__(self, cidr: str) -> None:
        net = ipaddress.ip_network(cidr)
        if not isinstance(net, ipaddress.IPv4Network) or not net.subnet_of(
                ipaddress.ip_network("127.0.0.0/8")):  # type: ignore[arg-type]
            raise ValueError(f"pod CIDR {cidr} must lie inside 127.0.0.0/8")
        self._hosts = net.hosts()
        self._free: collections.deque[str] = collections.deque()
        self.in_use: set[str] = set()

    def take(self) -> str:
        fresh = next(self._hosts, None)
        if fresh is not None:
            ip = str(fresh)
        elif self._free:
            ip = self._free.popleft()
        else:
            raise RuntimeError("the pod CIDR has no free address left")
        self.in_use.add(ip)
        return ip

    def give_back(self, ip: str) -> None:
        if ip in self.in_use:
            self.in_use.discard(ip)
            self._free.append(ip)


class NodeAgent:
    """The kubelet's part for pods bound to ``nodes``; see the module docstring."""

    def __init__(self, client: KubeClient, backing: Backend, *, nodes: Sequence[str],
                 listen: tuple[str, int], tls: ssl.SSLContext | None, pod_cidr: str,
                 node_labels: dict[str, str] | None = None, runtime_port: int = 8888,
                 policy_wait_s: float = 5.0, max_starting: int = 8,
                 allow_network: bool = False, images: ImageModel | None = None) -> None:
        self.client = client
        self.backing = backing
        self.nodes = frozenset(nodes)
        self.listen = listen
        self.tls = tls
        self.ips = IpPool(pod_cidr)
        self.node_labels = dict(node_labels or {})
        self.runtime_port = runtime_port
        self.policy_wait_s = policy_wait_s
        self.allow_network = allow_network
        self.pulls = ImagePulls(client, sorted(self.nodes), images) if images else None
        self.pods: dict[str, PodState] = {}  # by uid
        self.by_name: dict[tuple[str, str], str] = {}  # (namespace, name) -> uid
        self.policies: dict[tuple[str, str], Obj] = {}
        self._starting = asyncio.Semaphore(max_starting)
        self._execs: set[asyncio.BaseTransport] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._runner: web.AppRunner | None = None

    # -- lifecycle -----------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        await self._serve()
        await self._register()
        if self.pulls is not None:
            self.pulls.start()
        watchers = [asyncio.ensure_future(self._watch(PODS, self._on_pod)),
                    asyncio.ensure_future(self._watch(NETWORK_POLICIES, self._on_policy))]
        log.info("node agent up: nodes %s, kubelet endpoint %s:%d", sorted(self.nodes),
                 *self.listen)
        try:
            done, _ = await asyncio.wait([*watchers, asyncio.ensure_future(stop.wait())],
                                         return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task in watchers:
                    task.result()  # a watcher that died: say why
        finally:
            for task in watchers:
                task.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)
            await self.aclose()

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for state in list(self.pods.values()):
            await self._release(state)
        if self.pulls is not None:
            await self.pulls.aclose()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self.backing.aclose()

    async def _serve(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/exec/{ns}/{pod}/{container}", self._exec)
        app.router.add_get("/healthz", self._healthz)
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.5)
        await self._runner.setup()
        host, port = self.listen
        await web.TCPSite(self._runner, host, port, ssl_context=self.tls).start()

    async def _register(self) -> None:
        """Create the nodes (kwok, which manages nodes with its annotation, then keeps
        their status and leases)."""
        for name in sorted(self.nodes):
            body = {"apiVersion": "v1", "kind": "Node", "metadata": {
                "name": name,
                "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                           "type": "kwok", AGENT_LABEL: "true", **self.node_labels},
                "annotations": {KWOK_ANNOTATION: "fake"}}}
            try:
                await self.client.call("create", "POST", NODES.path(None), body=body,
                                       idempotent=True)
            except ApiError as err:
                if err.status != 409:
                    raise

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- informers -----------------------------------------------------------------------

    async def _watch(self, res: Resource, handle: Any) -> None:
        """List, then watch from the list's resourceVersion; relist on 410 and after the
        API server was away (a restart), as an informer does."""
        while True:
            try:
                listing = await self.client.list_objects(res, None)
            except ApiError as err:
                log.warning("list %s: %s; again in 1 s", res.plural, err)
                await asyncio.sleep(1.0)
                continue
            items = listing.get("items") or []
            handle("SYNC", {"items": items})  # what went away while not watching
            for obj in items:
                handle("ADDED", obj)
            rv = listing["metadata"]["resourceVersion"]
            try:
                async for kind, obj in self.client.watch(res, None, resource_version=rv):
                    handle(kind, obj)
            except ApiError as err:
                log.warning("watch %s: %s; relisting", res.plural, err)

    def _on_policy(self, kind: str, obj: Obj) -> None:
        if kind == "SYNC":
            self.policies.clear()
            return
        key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
        if kind == "DELETED":
            self.policies.pop(key, None)
        else:
            self.policies[key] = obj

    def _on_pod(self, kind: str, pod: Obj) -> None:
        if kind == "SYNC":
            listed = {p["metadata"]["uid"] for p in pod["items"]}
            for gone in [st for st in self.pods.values() if st.uid not in listed]:
                self._spawn(self._release(gone))
            return
        meta, spec = pod["metadata"], pod.get("spec") or {}
        if spec.get("nodeName") not in self.nodes:
            return
        uid = meta["uid"]
        state = self.pods.get(uid)
        if kind == "DELETED":
            if state is not None:
                self._spawn(self._release(state))
            return
        if meta.get("deletionTimestamp"):
            if state is None:
                state = self._track(meta)
            if not state.stopping:
                state.stopping = True
                self._spawn(self._terminate(state))
            return
        phase = (pod.get("status") or {}).get("phase")
        if state is None and phase not in ("Succeeded", "Failed"):
            state = self._track(meta)
            state.task = self._spawn(self._start(state, pod))

    def _track(self, meta: Obj) -> PodState:
        state = PodState(meta["namespace"], meta["name"], meta["uid"])
        self.pods[state.uid] = state
        self.by_name[(state.namespace, state.name)] = state.uid
        return state

    # -- pods ----------------------------------------------------------------------------

    async def _listen(self, runtime: SandboxRuntime) -> str:
        """Serve ``runtime`` on the pool's next address. 127/8 is shared with whatever
        else runs on the machine (another test cluster, a test's own server), so an
        address something else listens on is skipped, with a warning naming the holder,
        as an IPAM that found an address taken would move on."""
        for _ in range(ADDRESS_TRIES):
            ip = self.ips.take()
            try:
                await runtime.start(self.runtime_port, ip)
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    self.ips.give_back(ip)
                    raise
                log.warning("pod IP %s:%d is held by another listener (%s); taking the "
                            "next address", ip, self.runtime_port,
                            listener_of(ip, self.runtime_port))
                continue  # not given back: it is somebody else's
            return ip
        raise OSError(errno.EADDRINUSE,
                      f"{ADDRESS_TRIES} pod IPs in a row were held by other listeners")

    async def _start(self, state: PodState, pod: Obj) -> None:
        container = pod["spec"]["containers"][0]
        env = {e["name"]: str(e.get("value", "")) for e in container.get("env") or []
               if "name" in e}
        labels = dict(pod["metadata"].get("labels") or {})
        image = container["image"]
        if self.pulls is not None:
            if not await self._pull(state, pod["spec"]["nodeName"], container):
                return
            image = self.pulls.runs_as(image)
        async with self._starting:
            if state.stopping:
                return
            denied = await self._egress_denied(state.namespace, labels)
            network = Network.HOST if self.allow_network and not denied else Network.NONE
            spec = SandboxSpec(image=image,
                               workdir=container.get("workingDir") or "/", env=env,
                               resources=limits(container), network=network)
            try:
                sandbox = await self.backing.create(spec)
            except ImageError as exc:
                await self._status(state, {"phase": "Pending", "containerStatuses": [
                    self._waiting(container, "ErrImagePull", exc.message)]})
                return
            except RollboxError as exc:
                await self._status(state, {"phase": "Failed", "reason": "StartError",
                                           "message": exc.message})
                return
            state.sandbox = sandbox
            if state.stopping:
                return  # _terminate closes it
            base = env.get("SANDBOX_BASE_DIR", "").strip() or "/app"
            runtime = SandboxRuntime(sandbox, base_dir=base)
            try:
                ip = await self._listen(runtime)
            except OSError as exc:
                await self._status(state, {"phase": "Failed", "reason": "StartError",
                                           "message": f"runtime: {exc}"})
                return
            state.runtime, state.ip = runtime, ip
        if state.stopping:
            return
        now = _now()
        await self._status(state, {
            "phase": "Running", "hostIP": self.listen[0], "hostIPs": [{"ip": self.listen[0]}],
            "podIP": ip, "podIPs": [{"ip": ip}], "startTime": now,
            "conditions": [_cond("PodReadyToStartContainers", True), _cond("Initialized", True),
                           _cond("Ready", True), _cond("ContainersReady", True),
                           _cond("PodScheduled", True),
                           _cond(EGRESS_CONDITION, denied,
                                 "NetworkPolicy" if denied else "NoDenyingPolicy")],
            "containerStatuses": [{
                "name": container["name"], "image": container["image"],
                "imageID": "", "ready": True, "started": True, "restartCount": 0,
                "state": {"running": {"startedAt": now}}}]})

    async def _pull(self, state: PodState, node: str, container: Obj) -> bool:
        """The pod's image on its node, as a kubelet pulls it; False: not to be had."""
        assert self.pulls is not None

        async def waiting(reason: str, message: str) -> None:
            await self._status(state, {"phase": "Pending", "containerStatuses": [
                self._waiting(container, reason, message)]})

        image = container["image"]
        ref = PodRef(state.namespace, state.name, state.uid, node)
        if not await self.pulls.pull(ref, image, waiting):
            return False
        if state.stopping:  # released meanwhile: give the image back here
            self.pulls.release(node, image)
            return False
        state.pulled = (node, image)
        return True

    @staticmethod
    def _waiting(container: Obj, reason: str, message: str) -> Obj:
        return {"name": container["name"], "image": container["image"], "imageID": "",
                "ready": False, "restartCount": 0,
                "state": {"waiting": {"reason": reason, "message": message}}}

    async def _egress_denied(self, namespace: str, labels: dict[str, str]) -> bool:
        """Whether an egress-denying policy selects the pod (a template's pod waits a
        little for the template's managed policy to appear)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self.policy_wait_s if TEMPLATE_HASH_LABEL in labels else 0)
        while True:
            chosen = [p for (ns, _), p in self.policies.items()
                      if ns == namespace and selects((p.get("spec") or {}).get(
                          "podSelector") or {}, labels)]
            if any(denies_egress(p) for p in chosen):
                return True
            if chosen or loop.time() >= deadline:
                return False
            await asyncio.sleep(0.1)

    async def _status(self, state: PodState, status: Obj) -> None:
        """Write the pod's status, again and again while the API server cannot be
        reached (a kubelet's status manager does the same); stop once the pod is gone."""
        delay = 0.2
        while not state.stopping:
            try:
                await self.client.call(
                    "patch", "PATCH", PODS.path(state.namespace, state.name, "status"),
                    body={"metadata": {"uid": state.uid}, "status": status},
                    idempotent=True, content_type="application/merge-patch+json")
                return
            except ApiError as err:
                if err.status in (404, 409):
                    return
                log.warning("status of pod %s/%s: %s; again in %.1f s", state.namespace,
                            state.name, err, delay)
            await asyncio.sleep(delay)
            delay = min(5.0, delay * 2)

    async def _terminate(self, state: PodState) -> None:
        """A pod being deleted: stop its sandbox, then remove the pod for good."""
        await self._release(state)
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0,
                "preconditions": {"uid": state.uid}}
        try:
            await self.client.call("delete", "DELETE", PODS.path(state.namespace, state.name),
                                   body=body, idempotent=True)
        except ApiError as err:
            if err.status not in (404, 409):
                log.warning("final delete of pod %s/%s: %s", state.namespace, state.name, err)

    async def _release(self, state: PodState) -> None:
        """Stop the pod's runtime, then free its address and image and close its sandbox:
        once, after its start has ended. A deletion and the DELETED event both ask; a
        release while the start was still creating would leave what the start made
        running, and two at once could free the address while its runtime still listens."""
        state.stopping = True
        if state.released is None or state.released.cancelled():
            state.released = asyncio.ensure_future(self._free(state))
        await asyncio.shield(state.released)

    async def _free(self, state: PodState) -> None:
        start = state.task
        if start is not None and not start.done():
            await asyncio.wait([start])  # it sees ``stopping`` and ends soon
        self.pods.pop(state.uid, None)
        if self.by_name.get((state.namespace, state.name)) == state.uid:
            del self.by_name[(state.namespace, state.name)]
        runtime, state.runtime = state.runtime, None
        if runtime is not None:
            await runtime.kill()
        if state.ip:
            self.ips.give_back(state.ip)
            state.ip = ""
        pulled, state.pulled = state.pulled, None
        if pulled is not None and self.pulls is not None:
            self.pulls.release(*pulled)
        sandbox, state.sandbox = state.sandbox, None
        if sandbox is not None:
            with contextlib.suppress(RollboxError, OSError):
                await sandbox.close()

    # -- the kubelet endpoint ------------------------------------------------------------

    async def _exec(self, request: web.Request) -> web.StreamResponse:
        ns, pod = request.match_info["ns"], request.match_info["pod"]
        uid = self.by_name.get((ns, pod))
        state = self.pods.get(uid) if uid is not None else None
        if state is None or state.sandbox is None or state.runtime is None:
            return web.Response(status=404, text=f"pod {ns}/{pod} is not running here")
        return await serve_exec(request, state.sandbox,
                                streaming=self.backing.capabilities.streaming,
                                protocols=(V5, V4), open_streams=self._execs)

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")


# -- command line ------------------------------------------------------------------------


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m rollbox_kubernetes.testing.nodeagent",
                                     description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--node", action="append", required=True, help="node name (repeat)")
    parser.add_argument("--node-label", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--listen", default="127.0.0.1:10250", help="kubelet endpoint")
    parser.add_argument("--tls-cert", required=True)
    parser.add_argument("--tls-key", required=True)
    parser.add_argument("--client-ca", required=True,
                        help="CA of the API server's kubelet client certificate")
    parser.add_argument("--pod-cidr", required=True, help="inside 127.0.0.0/8")
    parser.add_argument("--state-dir", required=True, help="the local backend's state")
    parser.add_argument("--max-starting", type=int, default=8)
    parser.add_argument("--allow-network", action="store_true",
                        help="give pods no policy denies the host's network (default: none)")
    images = parser.add_argument_group("image pulls (imagepulls.py)")
    images.add_argument("--image-manifest", help="JSON: the images whose pulls are modelled")
    images.add_argument("--image-disk-gb", type=float, default=100.0,
                        help="each node's image filesystem (GB, 10^9 bytes)")
    images.add_argument("--pull-mb-per-s", type=float, default=200.0,
                        help="each node's pull bandwidth (MB/s), shared by its pullers")
    images.add_argument("--parallel-pulls", type=int, default=1,
                        help="pulls at once per node (1: serializeImagePulls)")
    images.add_argument("--time-scale", type=float, default=1.0,
                        help="real seconds per modelled second (0.01: 100x faster)")
    return parser.parse_args(argv)


async def _main(args: argparse.Namespace) -> None:
    from kubernetes_asyncio.client import ApiClient

    from rollbox_kubernetes.backend import load_configuration

    host, _, port = args.listen.rpartition(":")
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=args.client_ca)
    tls.load_cert_chain(args.tls_cert, args.tls_key)
    tls.verify_mode = ssl.CERT_REQUIRED
    config = await load_configuration(None, args.kubeconfig, None)
    client = KubeClient(ApiClient(config), qps=1000, burst=2000, stats=RequestStats())
    agent = NodeAgent(client, container_runtime(args.state_dir), nodes=args.node,
                      listen=(host, int(port)), tls=tls, pod_cidr=args.pod_cidr,
                      node_labels=dict(kv.split("=", 1) for kv in args.node_label),
                      max_starting=args.max_starting, allow_network=args.allow_network,
                      images=_image_model(args))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await agent.run(stop)
    finally:
        await client.close()


def _image_model(args: argparse.Namespace) -> ImageModel | None:
    if not args.image_manifest:
        return None
    return ImageModel(Path(args.image_manifest), capacity=int(args.image_disk_gb * GB),
                      pull_bytes_per_s=args.pull_mb_per_s * MB,
                      parallel_pulls=args.parallel_pulls, time_scale=args.time_scale)


def main(argv: Sequence[str] | None = None) -> None:
    logging.basicConfig(level=os.environ.get("ROLLBOX_NODEAGENT_LOG", "INFO"),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    asyncio.run(_main(_parse(argv)))


if __name__ == "__main__":
    main()
