"""``KubernetesBackend``: sandboxes from agent-sandbox warm pools, or raw pods.

Claim mode (default), per spec: one SandboxTemplate and one SandboxWarmPool (created on
first use, owned by this run); per ``create``: one SandboxClaim, readiness from a single
watch that starts at the create response's resourceVersion. Core's Pool then reuses the
sandbox across a task's rollouts through ``reset`` (in the pod), so a claim serves many
rollouts. ``close`` deletes the claim; the controller removes its Sandbox and pod.

Pod mode (``mode="pod"``): the baseline, one bare pod per sandbox, deleted on close.

Errors are mapped here, at the edge, to rollbox's tree: missing namespace, CRDs or
permissions become BackendUnavailableError naming the fix; image pull failures
ImageNotFoundError; unschedulable pods, terminal claim reasons and timeouts
CreateFailedError. A create that fails deletes what it made.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from kubernetes_asyncio.client import ApiClient, Configuration, CoreV1Api
from rollbox.backend import Backend, Diagnostic
from rollbox.errors import (
    BackendUnavailableError,
    CreateFailedError,
    ImageNotFoundError,
    InvalidSpecError,
    RollboxError,
)
from rollbox.sandbox import Capabilities
from rollbox.spec import SandboxSpec

from rollbox_kubernetes import render
from rollbox_kubernetes.client import ApiError, KubeClient, Obj, RequestStats
from rollbox_kubernetes.podexec import ChannelWsApiClient
from rollbox_kubernetes.resources import CLAIMS, PODS, TEMPLATES, WARM_POOLS, Resource
from rollbox_kubernetes.sandbox import KubeSandbox
from rollbox_kubernetes.status import claim_state, pod_problem, pod_ready
from rollbox_kubernetes.transport import TransportOptions, Transports
from rollbox_kubernetes.watcher import Watcher

MODES = ("claim", "pod")


class KubernetesBackend(Backend):
    """Sandboxes on a Kubernetes cluster running kubernetes-sigs/agent-sandbox."""

    name = "kubernetes"
    capabilities: ClassVar[Capabilities] = Capabilities(
        reset_in_place=True, network_none=True, network_host=True, memory_limit=True,
        isolation=True,
        signal_exit_codes=False,  # pod exec reports death by signal N as 128+N, like exit
    )

    def __init__(
        self,
        *,
        mode: str = "claim",
        namespace: str | None = None,
        run_id: str | None = None,
        host: str | None = None,
        kubeconfig: str | None = None,
        context: str | None = None,
        runtime_class: str | None = None,
        node_selector: Mapping[str, str] | None = None,
        tolerations: Sequence[Mapping[str, Any]] = (),
        warm_replicas: int = 2,
        qps: float = 20.0,
        burst: int = 40,
        unschedulable_grace_s: float = 5.0,
        probe_after_s: float = 2.0,
        transport: str = "auto",
        runtime_port: int = 8888,
        runtime_url: str | None = None,
        runtime_token: str | None = None,
        runtime_max_timeout_s: float | None = None,
        runtime_wait_s: float = 10.0,
        keepalive: Sequence[str] | None = None,
    ) -> None:
        if mode not in MODES:
            raise InvalidSpecError(f"kubernetes backend mode must be one of {MODES}, got {mode!r}")
        self.mode = mode
        self.options = render.KubeOptions(
            namespace=namespace or os.environ.get("ROLLBOX_K8S_NAMESPACE", "default"),
            run_id=run_id or os.environ.get("ROLLBOX_RUN_ID") or f"r{secrets.token_hex(4)}",
            runtime_class=runtime_class, node_selector=dict(node_selector or {}),
            tolerations=tuple(tolerations), warm_replicas=warm_replicas,
            keepalive=tuple(keepalive) if keepalive is not None else (
                () if transport == "http" else render.DEFAULT_KEEPALIVE),
        )
        self.host = host
        self.kubeconfig = kubeconfig
        self.context = context
        self.qps = qps
        self.burst = burst
        self.unschedulable_grace_s = unschedulable_grace_s
        self.probe_after_s = probe_after_s
        self.stats = RequestStats()
        self.transports = Transports(TransportOptions(
            transport=transport, port=runtime_port, url=runtime_url, token=runtime_token,
            max_timeout_s=runtime_max_timeout_s, wait_s=runtime_wait_s), self.options.namespace)
        self.live: dict[str, KubeSandbox] = {}
        self._pools: dict[str, asyncio.Task[str]] = {}
        self._owned: list[tuple[Resource, str]] = []
        self._client: KubeClient | None = None
        self._ws_api: CoreV1Api | None = None
        self._connecting: asyncio.Lock | None = None

    # -- connection ----------------------------------------------------------------------

    @property
    def client(self) -> KubeClient:
        if self._client is None:
            raise RuntimeError("KubernetesBackend is not connected yet")
        return self._client

    @property
    def ws_api(self) -> CoreV1Api:
        if self._ws_api is None:
            raise RuntimeError("KubernetesBackend is not connected yet")
        return self._ws_api

    async def connect(self) -> KubeClient:
        """Load credentials (``host``, else kubeconfig, else in-cluster) once."""
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self._client is None:
                config = await load_configuration(self.host, self.kubeconfig, self.context)
                self._client = KubeClient(ApiClient(config), qps=self.qps, burst=self.burst,
                                          stats=self.stats)
                self._ws_api = CoreV1Api(ChannelWsApiClient(configuration=config))
        return self._client

    # -- create --------------------------------------------------------------------------

    async def create(self, spec: SandboxSpec) -> KubeSandbox:
        await self.connect()
        try:
            async with asyncio.timeout(spec.timeouts.create_s):
                if self.mode == "pod":
                    sandbox = await self._create_pod(spec)
                else:
                    sandbox = await self._create_claim(spec)
                try:
                    await self.transports.attach(sandbox, self.client)
                    await sandbox.remember_base()
                except BaseException:
                    await self.release(sandbox)
                    raise
        except TimeoutError:
            raise CreateFailedError(
                f"no sandbox for image {spec.image!r} became ready within "
                f"{spec.timeouts.create_s}s (namespace {self.options.namespace!r}); check "
                "`kubectl get sandboxclaims,pods` and the warm pool's capacity"
            ) from None
        self.live[sandbox.id] = sandbox
        return sandbox

    async def _create_claim(self, spec: SandboxSpec) -> KubeSandbox:
        key = render.spec_key(spec, self.options)
        pool = await self._ensure_pool(spec, key)
        name = f"{self.options.run_id}-{key[:6]}-{secrets.token_hex(3)}"
        created = await self._api("create claim", self.client.create(
            CLAIMS, self.options.namespace, render.claim(name, pool, key, self.options)))
        try:
            sandbox_name = await self._await_claim(name, created, spec)
        except BaseException:
            await self._delete_quietly(CLAIMS, name)
            raise
        return KubeSandbox(self, name, spec, pod=sandbox_name,
                           base_env=render.container_env(spec))

    async def _ensure_pool(self, spec: SandboxSpec, key: str) -> str:
        """Template and warm pool for ``spec``: created once per backend, concurrently safe."""
        task = self._pools.get(key)
        if task is None or (task.done() and task.exception() is not None):
            task = asyncio.ensure_future(self._make_pool(spec))
            self._pools[key] = task
        return await asyncio.shield(task)

    async def _make_pool(self, spec: SandboxSpec) -> str:
        ns = self.options.namespace
        for res, body in ((TEMPLATES, render.template(spec, self.options)),
                          (WARM_POOLS, render.warm_pool(spec, self.options))):
            name = body["metadata"]["name"]
            try:
                await self._api(f"create {res.kind}", self.client.create(res, ns, body))
                self._owned.append((res, name))
            except ApiConflict:
                pass  # this run made it earlier (another process of the run): reuse it
        return str(render.warm_pool(spec, self.options)["metadata"]["name"])

    async def _await_claim(self, name: str, created: Obj, spec: SandboxSpec) -> str:
        """Watch the claim from the create response's resourceVersion until Ready."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        state = claim_state(created)
        next_probe = started + self.probe_after_s
        watcher = Watcher(self.client, CLAIMS, self.options.namespace, name,
                          created["metadata"]["resourceVersion"])
        try:
            while not state.ready:
                if state.terminal:
                    raise CreateFailedError(
                        f"SandboxClaim {name} failed: {state.reason}: {state.message}")
                if state.sandbox and loop.time() >= next_probe:
                    await self._probe_pod(state.sandbox, spec, started)
                    next_probe = loop.time() + max(self.probe_after_s, 1.0)
                wait = max(0.05, next_probe - loop.time()) if state.sandbox else None
                event = await watcher.next(wait)
                if event is None:
                    continue
                kind, obj = event
                if kind == "DELETED":
                    raise CreateFailedError(f"SandboxClaim {name} was deleted while starting")
                state = claim_state(obj)
        finally:
            await watcher.close()
        return state.sandbox

    async def _probe_pod(self, pod_name: str, spec: SandboxSpec, started: float) -> None:
        """Look at a slow sandbox's pod for errors that will not fix themselves."""
        try:
            pod = await self.client.get(PODS, self.options.namespace, pod_name)
        except ApiError:
            return
        self._raise_pod_problem(pod, spec, started)

    def _raise_pod_problem(self, pod: Obj, spec: SandboxSpec, started: float) -> None:
        problem = pod_problem(pod)
        if problem is None:
            return
        kind, message = problem
        if kind == "image":
            raise ImageNotFoundError(
                f"image {spec.image!r} cannot be pulled ({message}); check the name and "
                "that the cluster's nodes can reach its registry (imagePullSecrets)")
        if kind == "unschedulable":
            if asyncio.get_running_loop().time() - started < self.unschedulable_grace_s:
                return
            raise CreateFailedError(
                f"pod for image {spec.image!r} cannot be scheduled: {message}; check "
                "resources, nodeSelector, tolerations and runtimeClassName")
        raise CreateFailedError(f"pod for image {spec.image!r} failed: {message}")

    async def _create_pod(self, spec: SandboxSpec) -> KubeSandbox:
        key = render.spec_key(spec, self.options)
        name = f"{self.options.run_id}-{key[:6]}-{secrets.token_hex(3)}"
        created = await self._api("create pod", self.client.create(
            PODS, self.options.namespace, render.raw_pod(name, spec, self.options)))
        try:
            await self._await_pod(name, created, spec)
        except BaseException:
            await self._delete_quietly(PODS, name)
            raise
        return KubeSandbox(self, name, spec, pod=name, base_env=render.container_env(spec))

    async def _await_pod(self, name: str, pod: Obj, spec: SandboxSpec) -> None:
        started = asyncio.get_running_loop().time()
        watcher = Watcher(self.client, PODS, self.options.namespace, name,
                          pod["metadata"]["resourceVersion"])
        try:
            while not pod_ready(pod):
                self._raise_pod_problem(pod, spec, started)
                event = await watcher.next(1.0)
                if event is None:
                    continue
                kind, pod = event
                if kind == "DELETED":
                    raise CreateFailedError(f"pod {name} was deleted while starting")
        finally:
            await watcher.close()

    # -- release and teardown ------------------------------------------------------------

    async def release(self, sandbox: KubeSandbox) -> None:
        """Delete what backs ``sandbox`` (its claim, or its pod in pod mode)."""
        self.live.pop(sandbox.id, None)
        res = PODS if self.mode == "pod" else CLAIMS
        await self._delete_quietly(res, sandbox.id)

    async def aclose(self) -> None:
        """Delete this run's sandboxes, then the warm pools and templates it created."""
        for sandbox in list(self.live.values()):
            await sandbox.close()
        for task in self._pools.values():
            task.cancel()
        for res, name in reversed(self._owned):
            await self._delete_quietly(res, name)
        self._owned.clear()
        await self.transports.aclose()
        if self._client is not None:
            await self._client.close()
            self._client = None
        if self._ws_api is not None:
            ws_client: ApiClient = self._ws_api.api_client  # type: ignore[attr-defined]
            await ws_client.close()
            self._ws_api = None

    async def leftovers(self) -> list[str]:
        """This run's claims and non-warm pods still in the cluster, and sandboxes still
        open; after ``aclose`` it looks through a short-lived client."""
        from rollbox_kubernetes.ops import leftovers

        held = [f"open sandbox {name}" for name in sorted(self.live)]
        if self._client is not None:
            return held + await leftovers(self._client, self.options.namespace,
                                          self.options.run_id)
        config = await load_configuration(self.host, self.kubeconfig, self.context)
        client = KubeClient(ApiClient(config), qps=self.qps, burst=self.burst,
                            stats=RequestStats())
        try:
            return held + await leftovers(client, self.options.namespace, self.options.run_id)
        finally:
            await client.close()

    async def _delete_quietly(self, res: Resource, name: str) -> None:
        with contextlib.suppress(ApiError):
            await asyncio.shield(self.client.delete(res, self.options.namespace, name))

    # -- error mapping -------------------------------------------------------------------

    async def _api(self, what: str, call: Any) -> Obj:
        try:
            result: Obj = await call
            return result
        except ApiError as err:
            raise self.map_error(what, err) from None

    def map_error(self, what: str, err: ApiError) -> RollboxError:
        ns = self.options.namespace
        if err.status == 409:
            return ApiConflict(f"{what}: {err.message}")
        if err.status == 404 and "namespace" in err.message:
            return BackendUnavailableError(
                f"{what}: namespace {ns!r} does not exist; create it "
                f"(kubectl create namespace {ns}) or pass namespace=...")
        if err.status == 404:
            return BackendUnavailableError(
                f"{what}: the API server does not serve it ({err.message}); install the "
                "agent-sandbox CRDs and controller (see docs/kubernetes.md), or use mode='pod'")
        if err.status in (401, 403):
            return BackendUnavailableError(
                f"{what}: forbidden in namespace {ns!r} ({err.message}); apply the Role from "
                "`rollbox k8s render` or ask for those permissions")
        if err.status == 422:
            return InvalidSpecError(f"{what}: the API server rejected it: {err.message}")
        if err.status == 0:
            return BackendUnavailableError(f"{what}: cannot reach the API server: {err.message}")
        return CreateFailedError(f"{what}: {err}")

    @classmethod
    def doctor(cls) -> list[Diagnostic]:
        found = bool(os.environ.get("KUBECONFIG")) or os.path.exists(
            os.path.expanduser("~/.kube/config")) or bool(
            os.environ.get("KUBERNETES_SERVICE_HOST"))
        return [Diagnostic(
            "kubeconfig", found,
            "credentials found" if found else "no $KUBECONFIG, ~/.kube/config or in-cluster env",
            fix="point KUBECONFIG at your cluster's config (kind: `kind get kubeconfig`)",
        )]


class ApiConflict(CreateFailedError):
    """409 AlreadyExists, used internally by ensure-style creates."""


async def load_configuration(host: str | None, kubeconfig: str | None,
                             context: str | None) -> Configuration:
    """Credentials from ``host`` (no auth, for emulators), a kubeconfig, or in-cluster."""
    from kubernetes_asyncio import config as kube_config

    configuration = Configuration()
    if host is not None:
        configuration.host = host
        return configuration
    try:
        await kube_config.load_kube_config(config_file=kubeconfig, context=context,
                                           client_configuration=configuration)
        return configuration
    except Exception as kube_error:
        try:
            kube_config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration)
            return configuration
        except Exception:
            raise BackendUnavailableError(
                f"no Kubernetes credentials: {kube_error}; set KUBECONFIG (kind: "
                "`kind get kubeconfig > kubeconfig`, GKE: `gcloud container clusters "
                "get-credentials`) or run inside a cluster") from None
