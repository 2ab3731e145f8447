"""A Kubernetes API server on loopback, enough for rollbox's backend: CRUD, list and
watch (with resourceVersions and 410 Gone) for pods and the agent-sandbox CRDs, pod
exec over the WebSocket channel protocol (v5 and v4), self-subject access reviews and
CRD lookups for ``preflight``, and fault injection (429 storms with Retry-After, 500s,
dropped watches, forbidden verbs, missing CRDs or namespaces).

The cluster behind it is ``FakeCluster`` (controller.py): it binds claims to warm pools
and backs each pod with a sandbox from any rollbox backend.

    async with ApiServerEmulator(backing=container_runtime(state_dir=...)) as emu:
        backend = KubernetesBackend(host=emu.url)
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from rollbox.backend import Backend

from rollbox_kubernetes.podexec import V4, V5
from rollbox_kubernetes.testing.controller import FakeCluster
from rollbox_kubernetes.testing.execserver import serve_exec
from rollbox_kubernetes.testing.runtime import Runtimes
from rollbox_kubernetes.testing.store import Conflict, Obj, Store

KNOWN = {
    ("", "pods"), ("agents.x-k8s.io", "sandboxes"),
    ("extensions.agents.x-k8s.io", "sandboxtemplates"),
    ("extensions.agents.x-k8s.io", "sandboxwarmpools"),
    ("extensions.agents.x-k8s.io", "sandboxclaims"),
    ("networking.k8s.io", "networkpolicies"),
}
BUILT_IN = {"", "networking.k8s.io"}  # served with or without the agent-sandbox CRDs
_PATH = re.compile(
    r"^/(?:api/v1|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
    r"/namespaces/(?P<ns>[^/]+)(?:/(?P<plural>[^/]+)(?:/(?P<name>[^/]+)(?:/(?P<sub>[^/]+))?)?)?$"
)


@dataclass
class Fault:
    status: int
    count: int
    retry_after: float | None = None
    verbs: frozenset[str] | None = None
    after: bool = False  # do the work, then answer with the fault (a lost response)


def status_body(code: int, reason: str, message: str) -> Obj:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
            "reason": reason, "message": message}


def _error(code: int, reason: str, message: str, headers: dict[str, str] | None = None
           ) -> web.Response:
    return web.json_response(status_body(code, reason, message), status=code, headers=headers)


def _selector_ok(obj: Obj, field_sel: str, label_sel: str) -> bool:
    meta = obj.get("metadata", {})
    for part in filter(None, field_sel.split(",")):
        key, _, value = part.partition("=")
        if key == "metadata.name" and meta.get("name") != value:
            return False
    labels = meta.get("labels") or {}
    for part in filter(None, label_sel.split(",")):
        key, _, value = part.partition("=")
        if labels.get(key) != value:
            return False
    return True


class ApiServerEmulator:
    """An aiohttp app on 127.0.0.1 with a random port; ``url`` once started."""

    def __init__(
        self,
        backing: Backend,
        *,
        namespaces: Iterable[str] = ("default",),
        crds: bool = True,
        history: int = 100_000,
        node_labels: dict[str, str] | None = None,
        exec_protocols: Iterable[str] = (V5, V4),
        http_runtime: bool = False,
        runtime_port: int = 8888,
        runtime_base_dir: str | None = None,
        runtime_exec_timeout_s: float = 300.0,
    ) -> None:
        self.store = Store(history)
        # http_runtime: every pod also serves agent-sandbox's HTTP runtime (testing/
        # runtime.py) on its own loopback address, which becomes its pod IP.
        runtimes = (Runtimes(runtime_port, runtime_base_dir, runtime_exec_timeout_s)
                    if http_runtime else None)
        self.cluster = FakeCluster(self.store, backing, node_labels=node_labels or {},
                                   runtimes=runtimes)
        self.namespaces = set(namespaces)
        self.crds = crds
        self.exec_protocols = tuple(exec_protocols)
        """Subprotocols pod exec offers; ``(V4,)`` plays an API server before 1.30."""
        self.forbidden: set[tuple[str, str]] = set()  # (verb, plural)
        self.faults: list[Fault] = []
        self.requests: Counter[str] = Counter()
        self.stamps: list[tuple[str, float]] = []  # (verb, loop time) of every request
        self.fault_stamps: list[float] = []
        self.url = ""
        self._watches: set[web.StreamResponse] = set()
        self._execs: set[asyncio.BaseTransport] = set()
        self._runner: web.AppRunner | None = None

    # -- control -----------------------------------------------------------------------

    def inject(self, status: int, count: int, *, retry_after: float | None = None,
               verbs: Iterable[str] | None = None, after: bool = False) -> None:
        """Answer the next ``count`` matching requests with ``status`` (``after``: carry
        the request out first, as when a response is lost)."""
        self.faults.append(Fault(status, count, retry_after,
                                 frozenset(verbs) if verbs is not None else None, after))

    def drop_execs(self) -> int:
        """Cut every open exec stream without a closing handshake, as a broken network
        would; the commands keep running. Returns how many."""
        for transport in self._execs:
            transport.close()
        return len(self._execs)

    def drop_watches(self) -> int:
        """Cut every open watch stream (clients must resume). Returns how many."""
        dropped = 0
        for response in list(self._watches):
            task = getattr(response, "_rollbox_task", None)
            if task is not None:
                task.cancel()
                dropped += 1
        return dropped

    async def start(self) -> str:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        self.cluster.start()
        return self.url

    async def stop(self) -> None:
        self.drop_watches()
        await self.cluster.stop()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> ApiServerEmulator:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- dispatch ----------------------------------------------------------------------

    def _fault(self, verb: str, *, after: bool = False) -> web.Response | None:
        for fault in self.faults:
            if (fault.count > 0 and fault.after == after
                    and (fault.verbs is None or verb in fault.verbs)):
                fault.count -= 1
                self.fault_stamps.append(asyncio.get_running_loop().time())
                headers = ({"Retry-After": f"{fault.retry_after:g}"}
                           if fault.retry_after is not None else None)
                reason = "TooManyRequests" if fault.status == 429 else "InternalError"
                return _error(fault.status, reason, "injected fault", headers)
        return None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        if path.startswith("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"):
            return self._crd(path.rsplit("/", 1)[1])
        if path == "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews":
            return await self._access_review(request)
        match = _PATH.match(path)
        if match is None:
            return _error(404, "NotFound", "the server could not find the requested resource")
        group, ns = match["group"] or "", match["ns"]
        plural, name, sub = match["plural"], match["name"], match["sub"]
        verb = self._verb(request.method, name, sub, request.query.get("watch") == "true")
        self.requests[verb] += 1
        self.stamps.append((verb, asyncio.get_running_loop().time()))
        injected = self._fault(verb)
        if injected is not None:
            return injected
        if plural is None:
            if ns in self.namespaces:
                return web.json_response({"kind": "Namespace", "metadata": {"name": ns}})
            return _error(404, "NotFound", f'namespaces "{ns}" not found')
        if (group, plural) not in KNOWN or (group not in BUILT_IN and not self.crds):
            return _error(404, "NotFound", "the server could not find the requested resource")
        if (verb, plural) in self.forbidden:
            return _error(403, "Forbidden", f'{plural} is forbidden: cannot {verb} "{plural}" '
                          f'in the namespace "{ns}"')
        if ns not in self.namespaces:
            return _error(404, "NotFound", f'namespaces "{ns}" not found')
        if sub == "exec":
            return await self._exec(request, ns, name or "")
        if verb == "watch":
            return await self._watch(request, plural, ns)
        response = await self._crud(request, verb, plural, ns, name)
        return self._fault(verb, after=True) or response

    @staticmethod
    def _verb(method: str, name: str | None, sub: str | None, watch: bool) -> str:
        if sub == "exec":
            return "exec"
        if method == "GET":
            return "get" if name else ("watch" if watch else "list")
        return {"POST": "create", "PUT": "update", "PATCH": "patch",
                "DELETE": "delete"}.get(method, method.lower())

    async def _crud(self, request: web.Request, verb: str, plural: str, ns: str,
                    name: str | None) -> web.Response:
        store = self.store
        if verb == "list":
            sel = request.query.get("labelSelector", "")
            items = [o for o in store.list(plural, ns) if _selector_ok(o, "", sel)]
            return web.json_response({"kind": "List", "apiVersion": "v1", "items": items,
                                      "metadata": {"resourceVersion": str(store.last_rv)}})
        if verb == "create":
            body = await request.json()
            try:
                return web.json_response(store.create(plural, ns, body), status=201)
            except Conflict:
                return _error(409, "AlreadyExists", f'{plural} "{body["metadata"]["name"]}" '
                              "already exists")
        assert name is not None
        if verb == "get":
            obj = store.get(plural, ns, name)
        elif verb == "patch":
            obj = store.patch(plural, ns, name, await request.json())
        elif verb == "delete":
            obj = store.delete(plural, ns, name)
        else:
            return _error(405, "MethodNotAllowed", verb)
        if obj is None:
            return _error(404, "NotFound", f'{plural} "{name}" not found')
        return web.json_response(obj)

    async def _watch(self, request: web.Request, plural: str, ns: str) -> web.StreamResponse:
        store = self.store
        field_sel = request.query.get("fieldSelector", "")
        label_sel = request.query.get("labelSelector", "")
        since = int(request.query.get("resourceVersion") or store.last_rv)
        timeout = float(request.query.get("timeoutSeconds", "300"))
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        if since < store.oldest_rv() - 1 and since != store.last_rv:
            gone = status_body(410, "Expired", f"too old resource version: {since}")
            await response.write(json.dumps({"type": "ERROR", "object": gone}).encode() + b"\n")
            return response
        task = asyncio.current_task()
        response._rollbox_task = task  # type: ignore[attr-defined]
        self._watches.add(response)
        try:
            async with asyncio.timeout(timeout):
                while True:
                    changed = store.changed(plural)
                    for rv, kind, p, n, obj in store.since(since):
                        if rv <= since or p != plural or n != ns:
                            continue
                        since = rv
                        if _selector_ok(obj, field_sel, label_sel):
                            line = json.dumps({"type": kind, "object": obj}).encode() + b"\n"
                            await response.write(line)
                    since = max(since, store.last_rv)
                    await changed.wait()
        except (TimeoutError, ConnectionResetError):
            pass
        except asyncio.CancelledError:
            # drop_watches: cut the connection without a clean end of stream.
            if request.transport is not None:
                request.transport.close()
        finally:
            self._watches.discard(response)
        return response

    async def _exec(self, request: web.Request, ns: str, name: str) -> web.StreamResponse:
        """Pod exec as a kubelet serves it (execserver.py)."""
        sandbox = self.cluster.backing_sandbox(ns, name)
        if sandbox is None:
            return _error(404, "NotFound", f'pods "{name}" not found')
        return await serve_exec(request, sandbox,
                                streaming=self.cluster.backing.capabilities.streaming,
                                protocols=self.exec_protocols, open_streams=self._execs)

    def _crd(self, name: str) -> web.Response:
        group = name.split(".", 1)[1] if "." in name else ""
        plural = name.split(".", 1)[0]
        if self.crds and (group, plural) in KNOWN:
            return web.json_response({"kind": "CustomResourceDefinition",
                                      "metadata": {"name": name}})
        return _error(404, "NotFound", f'customresourcedefinitions "{name}" not found')

    async def _access_review(self, request: web.Request) -> web.Response:
        body: dict[str, Any] = await request.json()
        attrs = body.get("spec", {}).get("resourceAttributes", {})
        resource = attrs.get("resource", "")
        if attrs.get("subresource"):
            resource = f"{resource}/{attrs['subresource']}"
        allowed = (attrs.get("verb", ""), resource) not in self.forbidden
        return web.json_response({**body, "status": {"allowed": allowed}}, status=201)
