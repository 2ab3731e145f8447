"""``KubernetesBackend``: sandboxes from agent-sandbox warm pools, direct Sandboxes, or
raw pods.

Claim mode (default) puts warmth where it is cheapest (``warmpools.py``):

- a spec whose warm target from core's pool policy (``keep_warm``) reaches
  ``warm_pool_min``, or that has a pool already: one SandboxTemplate and one
  SandboxWarmPool whose ``replicas`` follow the target; per ``create`` one SandboxClaim;
- any other spec (e.g. one task's image, warmed one at a time by core's lookahead
  policy): per ``create`` one ``Sandbox`` object, no template, pool or claim.

Readiness comes from a single watch of the claim or Sandbox that starts at the create
response's resourceVersion. Core's Pool then reuses the sandbox across a task's
rollouts through ``reset`` (in the pod), so one create serves many rollouts. ``close``
deletes the claim or Sandbox; the controller removes the pod.

Pod mode (``mode="pod"``): the baseline, one bare pod per sandbox, deleted on close.

Errors are mapped here, at the edge, to rollbox's tree: missing namespace, CRDs or
permissions become BackendUnavailableError naming the fix; image pull failures
ImageNotFoundError; unschedulable pods, terminal claim reasons and timeouts
CreateFailedError. A create that fails deletes what it made.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from kubernetes_asyncio.client import ApiClient, Configuration, CoreV1Api
from rollbox import settings
from rollbox.backend import Backend, Diagnostic, ahead_of_need
from rollbox.errors import (
    BackendUnavailableError,
    CreateFailedError,
    ImageNotFoundError,
    InvalidSpecError,
    RollboxError,
)
from rollbox.sandbox import Capabilities
from rollbox.spec import Network, SandboxSpec

from rollbox_kubernetes import render
from rollbox_kubernetes.client import ApiError, KubeClient, Obj, RequestStats
from rollbox_kubernetes.hydration import GB, Hydration, PlanningOptions
from rollbox_kubernetes.podexec import ChannelWsApiClient
from rollbox_kubernetes.podwatch import PodWatch
from rollbox_kubernetes.resources import (
    CLAIMS,
    NETWORK_POLICIES,
    PODS,
    SANDBOXES,
    TEMPLATES,
    WARM_POOLS,
    Resource,
    namespace_problem,
    owned_by,
    run_id_problem,
)
from rollbox_kubernetes.runtime_http import RuntimeLimitError
from rollbox_kubernetes.sandbox import KubeSandbox
from rollbox_kubernetes.status import (
    ClaimState,
    claim_state,
    ip_of_pod,
    pod_problem,
    pod_ready,
    sandbox_state,
)
from rollbox_kubernetes.transport import TransportOptions, Transports
from rollbox_kubernetes.warmpools import WarmPools
from rollbox_kubernetes.watcher import Watcher

log = logging.getLogger(__name__)

MODES = ("claim", "pod")


T = TypeVar("T")
# A claim whose template or pool the controller has not seen yet is updated (this
# annotation) after 0.25 s, then backing off to every 5 s, until the controller finds them.
ANNOTATION_NUDGED = "rollbox.dev/nudged"
_NUDGE_AFTER_S = 0.25
_NUDGE_MAX_S = 5.0
NO_ROOM_WORDS = ("no space left", "larger than", "disk pressure")
"""In a pull failure's message: the image does not fit its node, rather than a name or
registry problem."""


class KubernetesBackend(Backend):
    """Sandboxes on a Kubernetes cluster running kubernetes-sigs/agent-sandbox."""

    name = "kubernetes"
    capabilities = Capabilities(
        reset_in_place=True, network_none=True, network_host=True, memory_limit=True,
        cpu_limit=True, disk_limit=True,  # pod limits: cpu, memory, ephemeral-storage
        reset_command=True, isolation=True, streaming=True, signals=True, seal=True,
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
        warm_pool_min: int = 2,
        warm_replicas: int = 0,
        scale_delay_s: float = 0.5,
        qps: float = 20.0,
        burst: int = 40,
        adaptive_pacing: bool = False,
        unschedulable_grace_s: float = 5.0,
        probe_after_s: float = 2.0,
        transport: str = "auto",
        runtime_port: int = 8888,
        runtime_url: str | None = None,
        runtime_token: str | None = None,
        runtime_max_timeout_s: float | None = None,
        runtime_wait_s: float = 10.0,
        keepalive: Sequence[str] | None = None,
        image_planning: bool = False,
        image_sizes: Mapping[str, int] | None = None,
        image_disk_bytes: int | None = None,
        default_image_bytes: int = 2 * GB,
        prepull_window: int = 64,
        prepulls_per_node: int = 2,
    ) -> None:
        if mode not in MODES:
            raise InvalidSpecError(f"kubernetes backend mode must be one of {MODES}, got {mode!r}")
        self.mode = mode
        self.options = render.KubeOptions(
            namespace=namespace or settings.checked("ROLLBOX_K8S_NAMESPACE", "default",
                                                    namespace_problem),
            run_id=run_id or settings.checked("ROLLBOX_RUN_ID", f"r{secrets.token_hex(4)}",
                                              run_id_problem),
            runtime_class=runtime_class, node_selector=dict(node_selector or {}),
            tolerations=tuple(tolerations),
            keepalive=tuple(keepalive) if keepalive is not None else (
                () if transport == "http" else render.DEFAULT_KEEPALIVE),
        )
        if warm_pool_min < 1 or warm_replicas < 0:
            raise InvalidSpecError("warm_pool_min must be >= 1 and warm_replicas >= 0")
        self.host = host
        self.kubeconfig = kubeconfig
        self.context = context
        self.qps = qps
        self.burst = burst
        self.adaptive_pacing = adaptive_pacing
        self.unschedulable_grace_s = unschedulable_grace_s
        self.probe_after_s = probe_after_s
        self.stats = RequestStats()
        self.transports = Transports(TransportOptions(
            transport=transport, port=runtime_port, url=runtime_url, token=runtime_token,
            max_timeout_s=runtime_max_timeout_s, wait_s=runtime_wait_s), self.options.namespace)
        self.live: dict[str, KubeSandbox] = {}
        self.pools = WarmPools(self, min_replicas=warm_pool_min, floor=warm_replicas,
                               scale_delay_s=scale_delay_s)
        self._backing: dict[str, Resource] = {}  # sandbox id -> what close deletes
        self._undeleted: list[tuple[Resource, str]] = []  # deletes the API server refused
        self._deny_all: asyncio.Task[None] | None = None
        self._client: KubeClient | None = None
        self._ws_api: CoreV1Api | None = None
        self._connecting: asyncio.Lock | None = None
        self.pod_watch: PodWatch | None = None
        try:
            planning = PlanningOptions(
                image_sizes=dict(image_sizes or {}), image_disk_bytes=image_disk_bytes,
                default_image_bytes=default_image_bytes, window=prepull_window,
                pulls_per_node=prepulls_per_node)
        except ValueError as exc:
            raise InvalidSpecError(str(exc)) from None
        self.hydration = Hydration(self, planning) if image_planning else None
        """Prepulls and placement (hydration.py), or None: the scheduler places."""

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
                                          adaptive=self.adaptive_pacing, stats=self.stats)
                self._ws_api = CoreV1Api(ChannelWsApiClient(configuration=config))
                self.pod_watch = PodWatch(self._client, self.options.namespace,
                                          owned_by(self.options.run_id))
        return self._client

    # -- warmth --------------------------------------------------------------------------

    def keep_warm(self, spec: SandboxSpec, count: int) -> bool:
        """Claim mode takes a spec's warming over once its target reaches
        ``warm_pool_min`` (or it has a pool already): the spec's SandboxWarmPool keeps
        ``count`` warm, scaled by merge patches. Smaller targets stay with core."""
        if self.mode != "claim":
            return False
        return self.pools.keep_warm(spec, count)

    def hint_upcoming(self, images: Sequence[str]) -> None:
        """With ``image_planning``, pull the soonest of ``images`` onto chosen nodes."""
        if self.hydration is not None:
            self.hydration.hint(images)

    # -- create --------------------------------------------------------------------------

    async def create(self, spec: SandboxSpec) -> KubeSandbox:
        self.check_spec(spec)
        await self.connect()
        try:
            async with asyncio.timeout(spec.timeouts.create_s):
                if self.mode == "pod":
                    sandbox = await self._create_pod(spec)
                else:
                    key = render.spec_key(spec, self.options)
                    pool = await self.pools.pool_for(spec, key)
                    if pool is None:
                        sandbox = await self._create_sandbox(spec, key)
                    else:
                        sandbox = await self._create_claim(spec, key, pool)
                try:
                    await self.transports.attach(sandbox, self.client)
                    try:
                        await sandbox.remember_base()
                    except RuntimeLimitError as error:
                        # The runtime passed its probe (a quick `pwd`) but kills real
                        # commands at its own limit: pod exec instead, or under "http" none.
                        self.transports.refuse_runtime(sandbox, error)
                        await sandbox.remember_base()
                except BaseException:
                    await self.release(sandbox)
                    raise
        except TimeoutError:
            raise CreateFailedError(
                f"no sandbox for image {spec.image!r} became ready within "
                f"{spec.timeouts.create_s}s (namespace {self.options.namespace!r}); check "
                "`kubectl get sandboxclaims,sandboxes,pods` and the warm pool's capacity"
            ) from None
        self.live[sandbox.id] = sandbox
        if self.pod_watch is not None:
            self.pod_watch.track(sandbox)
        if self.hydration is not None:
            self.hydration.ready(sandbox.id)
        return sandbox

    def _name(self, key: str) -> str:
        return f"{self.options.run_id}-{key[:6]}-{secrets.token_hex(3)}"

    async def _create_then(self, res: Resource, what: str, name: str, body: Obj,
                           ready: Callable[[Obj], Awaitable[T]]) -> T:
        """Create ``body``, then wait with ``ready(created)``; if that fails (or is
        cancelled), delete it again. Once ready, close will delete it. Inside ``create``'s
        deadline, an API server that restarts is waited out, not a failure."""
        try:
            created = await self.api(f"create {what}", self.client.create(
                res, self.options.namespace, body, outwait_restarts=True))
        except BaseException:
            self._unplace(name)
            raise
        try:
            result = await ready(created)
        except BaseException:
            self._unplace(name)
            await self._delete_quietly(res, name)
            raise
        self._backing[name] = res
        return result

    async def _prepared(self, name: str, spec: SandboxSpec, pod: Obj) -> Obj:
        """``pod`` (the pod spec of sandbox ``name``) preferring the node image planning
        chose for it, once what it needs exists: the run's deny-all NetworkPolicy for
        ``network=none`` (its pod carries the label, render.raw_pod). Planning comes
        first: an image it refuses leaves nothing written."""
        if self.hydration is not None:
            if ahead_of_need():  # a warm one: start it where its image already is
                await self.hydration.hydrated(spec.image)
            node = await self.hydration.place(name, spec.image)
            pod = render.prefer_nodes(pod, [node] if node else [])
        try:
            if spec.network is Network.NONE:
                await self._ensure_deny_all()
        except BaseException:
            self._unplace(name)
            raise
        return pod

    def _unplace(self, name: str) -> None:
        if self.hydration is not None:
            self.hydration.released(name)

    async def _create_claim(self, spec: SandboxSpec, key: str, pool: str) -> KubeSandbox:
        name = self._name(key)
        ready = await self._create_then(
            CLAIMS, "claim", name, render.claim(name, pool, key, self.options),
            lambda created: self._await_ready(CLAIMS, name, created, spec, claim_state,
                                              nudge=lambda state, n: self._nudge_claim(
                                                  name, pool, state, n)))
        return KubeSandbox(self, name, spec, pod=ready.sandbox, pod_ip=ready.pod_ip,
                           base_env=render.container_env(spec))

    async def _create_sandbox(self, spec: SandboxSpec, key: str) -> KubeSandbox:
        """A Sandbox object of its own: one create, no template, pool or claim."""
        name = self._name(key)
        body = render.sandbox(name, spec, self.options)
        template = body["spec"]["podTemplate"]
        template["spec"] = await self._prepared(name, spec, template["spec"])
        ready = await self._create_then(
            SANDBOXES, "Sandbox", name, body,
            lambda created: self._await_ready(SANDBOXES, name, created, spec, sandbox_state))
        return KubeSandbox(self, name, spec, pod=ready.sandbox, pod_ip=ready.pod_ip,
                           base_env=render.container_env(spec))

    async def _ensure_deny_all(self) -> None:
        """The run's deny-all NetworkPolicy, before the first network=none Sandbox."""
        if self._deny_all is None or (self._deny_all.done()
                                      and self._deny_all.exception() is not None):
            self._deny_all = asyncio.ensure_future(self._make_deny_all())
        await asyncio.shield(self._deny_all)

    async def _make_deny_all(self) -> None:
        body = render.deny_all(self.options)
        try:
            await self.api("create NetworkPolicy", self.client.create(
                NETWORK_POLICIES, self.options.namespace, body))
        except ApiConflict:
            return  # applied before (another process of this run): use it, keep it
        self.pools.owned.append((NETWORK_POLICIES, body["metadata"]["name"]))

    async def _await_ready(
            self, res: Resource, name: str, created: Obj, spec: SandboxSpec,
            read: Callable[[Obj], ClaimState],
            nudge: Callable[[ClaimState, int], Awaitable[None]] | None = None) -> ClaimState:
        """Watch a claim or Sandbox from the create response's resourceVersion until it
        is Ready; returns that state (its pod's name, and IP if shown). ``read`` turns the
        object into a ClaimState; ``nudge(state, n)`` is called, backing off, while
        ``state.missing``."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        state = read(created)
        next_probe = started + self.probe_after_s
        nudges, next_nudge = 0, started + _NUDGE_AFTER_S
        watcher = Watcher(self.client, res, self.options.namespace, name,
                          created["metadata"]["resourceVersion"])
        try:
            while not state.ready:
                if state.terminal or (state.missing and nudge is None):
                    raise CreateFailedError(
                        f"{res.kind} {name} failed: {state.reason}: {state.message}")
                if state.sandbox and loop.time() >= next_probe:
                    await self._probe_pod(state.sandbox, spec, started)
                    next_probe = loop.time() + max(self.probe_after_s, 1.0)
                if state.missing and nudge is not None and loop.time() >= next_nudge:
                    nudges += 1
                    await nudge(state, nudges)
                    next_nudge = loop.time() + min(_NUDGE_MAX_S, _NUDGE_AFTER_S * 2 ** nudges)
                wait = (max(0.05, next_probe - loop.time()) if state.sandbox
                        else max(0.05, next_nudge - loop.time()) if state.missing else None)
                event = await watcher.next(wait)
                if event is None:
                    continue
                kind, obj = event
                if kind == "DELETED":
                    raise CreateFailedError(f"{res.kind} {name} was deleted while starting")
                state = read(obj)
        finally:
            await watcher.close()
        return state

    async def _nudge_claim(self, name: str, pool: str, state: ClaimState, n: int) -> None:
        """The controller reported claim ``name``'s template or warm pool (both named
        ``pool``) missing. If they exist, its cache had not seen them yet when the claim
        came (created a moment before it): an update of the claim makes it look again at
        once, instead of a minute later. If they do not, the claim fails."""
        ns = self.options.namespace
        for res in (TEMPLATES, WARM_POOLS):
            try:
                await self.client.get(res, ns, pool)
            except ApiError as err:
                if err.status == 404:
                    raise CreateFailedError(
                        f"SandboxClaim {name} failed: {state.reason}: {state.message} "
                        f"({res.kind} {pool} is gone; was it deleted by hand?)") from None
                raise self.map_error(f"get {res.kind}", err) from None
        self.stats.retries[state.reason] += 1
        await self.api("patch claim", self.client.patch(
            CLAIMS, ns, name, {"metadata": {"annotations": {ANNOTATION_NUDGED: str(n)}}}))

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
            if any(word in message.lower() for word in NO_ROOM_WORDS):
                raise ImageNotFoundError(
                    f"image {spec.image!r} does not fit the node's image filesystem "
                    f"({message}); use nodes with larger image disks or a smaller image")
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
        name = self._name(render.spec_key(spec, self.options))
        body = render.raw_pod(name, spec, self.options)
        body["spec"] = await self._prepared(name, spec, body["spec"])
        pod = await self._create_then(PODS, "pod", name, body,
                                      lambda created: self._await_pod(name, created, spec))
        return KubeSandbox(self, name, spec, pod=name, pod_ip=ip_of_pod(pod),
                           pod_uid=pod["metadata"]["uid"], base_env=render.container_env(spec))

    async def _await_pod(self, name: str, pod: Obj, spec: SandboxSpec) -> Obj:
        """Watch pod ``name`` until it is ready; returns it."""
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
        return pod

    # -- release and teardown ------------------------------------------------------------

    async def release(self, sandbox: KubeSandbox) -> None:
        """Delete what backs ``sandbox``: its claim, its Sandbox, or its pod."""
        self.live.pop(sandbox.id, None)
        self._unplace(sandbox.id)
        if self.pod_watch is not None:
            self.pod_watch.untrack(sandbox)
        res = self._backing.pop(sandbox.id, PODS if self.mode == "pod" else CLAIMS)
        await self._delete_quietly(res, sandbox.id)

    async def aclose(self) -> None:
        """Delete this run's sandboxes, then the warm pools, templates and network policy
        this backend created (never ones it found: those belong to whoever applied them)."""
        for sandbox in list(self.live.values()):
            await sandbox.close()
        if self.hydration is not None:
            await self.hydration.aclose()
        await self.pools.aclose()
        if self._deny_all is not None:
            self._deny_all.cancel()
            await asyncio.gather(self._deny_all, return_exceptions=True)
            self._deny_all = None
        for res, name in reversed(self.pools.owned):
            await self._delete_quietly(res, name)
        self.pools.owned.clear()
        await self._delete_again()
        await self.transports.aclose()
        if self.pod_watch is not None:
            await self.pod_watch.aclose()
            self.pod_watch = None
        if self._client is not None:
            await self._client.close()
            self._client = None
        if self._ws_api is not None:
            ws_client: ApiClient = self._ws_api.api_client  # type: ignore[attr-defined]
            await ws_client.close()
            self._ws_api = None

    async def leftovers(self) -> list[str]:
        """This run's claims, direct Sandboxes and non-warm pods still in the cluster, and
        sandboxes still open; after ``aclose`` it looks through a short-lived client."""
        from rollbox_kubernetes.ops import leftovers

        held = [f"open sandbox {name}" for name in sorted(self.live)]
        if self._client is not None:
            return held + await leftovers(self._client, self.options.namespace,
                                          self.options.run_id)
        config = await load_configuration(self.host, self.kubeconfig, self.context)
        client = KubeClient(ApiClient(config), qps=self.qps, burst=self.burst,
                            adaptive=self.adaptive_pacing, stats=RequestStats())
        try:
            return held + await leftovers(client, self.options.namespace, self.options.run_id)
        finally:
            await client.close()

    async def _delete_quietly(self, res: Resource, name: str) -> None:
        """Delete without raising (a close must not fail on it); one the API server
        would not take (unreachable, overloaded past the client's retries) is kept, and
        ``aclose`` tries it again."""
        try:
            await asyncio.shield(self.client.delete(res, self.options.namespace, name))
        except ApiError:
            self._undeleted.append((res, name))

    async def _delete_again(self) -> None:
        """The deletes that failed, once more; what still fails is named in the log with
        the command that removes it (``leftovers()`` lists it too)."""
        undeleted, self._undeleted = self._undeleted, []
        for res, name in undeleted:
            await self._delete_quietly(res, name)
        failed, self._undeleted = self._undeleted, []
        if failed:
            names = ", ".join(f"{res.kind} {name}" for res, name in failed[:10])
            log.warning("could not delete %d object(s) of run %s in namespace %s (%s); "
                        "remove them with `rollbox k8s reap --run-id %s`", len(failed),
                        self.options.run_id, self.options.namespace, names,
                        self.options.run_id)

    # -- error mapping -------------------------------------------------------------------

    async def api(self, what: str, call: Any) -> Obj:
        """Await an API call, mapping its failure to rollbox's error tree."""
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
    paths = _kubeconfig_paths(kubeconfig)
    if paths:  # only existing files: the loader logs a stray warning for a missing one
        try:
            await kube_config.load_kube_config(config_file=os.pathsep.join(paths),
                                               context=context,
                                               client_configuration=configuration)
            return configuration
        except Exception as exc:
            # The loader's own errors say what is wrong; anything else (a TypeError from
            # a file whose YAML is not a mapping) means it is no kubeconfig at all.
            why = (' '.join(str(exc).split()) if isinstance(exc, kube_config.ConfigException)
                   else "not a kubeconfig (a YAML mapping of clusters, contexts and users)")
            raise BackendUnavailableError(
                f"cannot use the kubeconfig {os.pathsep.join(paths)}: {why}") from None
    try:
        kube_config.load_incluster_config(  # type: ignore[no-untyped-call]
            client_configuration=configuration)
        return configuration
    except Exception:
        where = (f"--kubeconfig {kubeconfig} does not exist" if kubeconfig
                 else "no kubeconfig ($KUBECONFIG is unset or names no existing file, and "
                      "there is no ~/.kube/config)")
        raise BackendUnavailableError(
            f"no Kubernetes credentials: {where}, and this is not a pod in a cluster; set "
            "KUBECONFIG (kind: `kind get kubeconfig > kubeconfig`, GKE: `gcloud container "
            "clusters get-credentials`) or run inside a cluster") from None


def _kubeconfig_paths(kubeconfig: str | None) -> list[str]:
    """The kubeconfig files that exist among ``kubeconfig``, else ``$KUBECONFIG`` (a
    list), else ``~/.kube/config``."""
    if kubeconfig:
        candidates = [kubeconfig]
    elif os.environ.get("KUBECONFIG"):
        candidates = os.environ["KUBECONFIG"].split(os.pathsep)
    else:
        candidates = [os.path.expanduser("~/.kube/config")]
    return [os.path.expanduser(p) for p in candidates if p and os.path.isfile(
        os.path.expanduser(p))]
