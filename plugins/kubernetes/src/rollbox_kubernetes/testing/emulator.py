"""A Kubernetes API server on loopback, enough for rollbox's backend: CRUD, list and
watch (with resourceVersions and 410 Gone) for pods and the agent-sandbox CRDs, pod
exec over the WebSocket channel protocol (v5 and v4), self-subject access reviews and
CRD lookups for ``preflight``, and fault injection (429 storms with Retry-After, 500s,
dropped watches, forbidden verbs, missing CRDs or namespaces).

The cluster behind it is ``FakeCluster`` (controller.py): it binds claims to warm pools
and backs each pod with a sandbox from any rollbox backend.

    async with ApiServerEmulator(backing=LocalBackend(state_dir=...)) as emu:
        backend = KubernetesBackend(host=emu.url)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from aiohttp import WSMsgType, web
from rollbox.backend import Backend
from rollbox.sandbox import Process, Sandbox

from rollbox_kubernetes.podexec import CLOSE, STDIN, V4, V5
from rollbox_kubernetes.testing.controller import FakeCluster
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
EXEC_OUTPUT_CEILING = 512 * 1024 * 1024
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
        self.stamps: list[float] = []
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
        self.stamps.append(asyncio.get_running_loop().time())
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
        """Pod exec as a kubelet serves it. With a backing backend that streams: output
        frames as the command writes them, stdin from channel 0, EOF on v5's close
        message (255, 0); a client that goes away does not stop the command (as on
        Kubernetes), it only closes its stdin. Otherwise the command runs to completion
        on the stdin sent before the close message, then its output is sent."""
        sandbox = self.cluster.backing_sandbox(ns, name)
        if sandbox is None:
            return _error(404, "NotFound", f'pods "{name}" not found')
        ws = web.WebSocketResponse(protocols=self.exec_protocols, max_msg_size=0)
        await ws.prepare(request)
        argv = request.query.getall("command", [])
        wants_stdin = request.query.get("stdin", "").lower() in ("true", "1")
        transport = request.transport
        if transport is not None:
            self._execs.add(transport)
        try:
            if self.cluster.backing.capabilities.streaming:
                code = await _exec_streamed(ws, sandbox, argv, wants_stdin)
            else:
                code = await _exec_collected(ws, sandbox, argv, wants_stdin)
            status = _exit_status(code)
        except Exception as exc:  # the runtime could not start it
            status = {"metadata": {}, "status": "Failure", "reason": "InternalError",
                      "message": f"exec failed: {exc}"}
        finally:
            if transport is not None:
                self._execs.discard(transport)
        with contextlib.suppress(ConnectionError):
            await ws.send_bytes(b"\x03" + json.dumps(status).encode())
            await ws.close()
        return ws

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


def _exit_status(code: int) -> Obj:
    """The status-channel ``Status``. A container runtime reports death by signal N as
    exit code 128+N."""
    code = 128 - code if code < 0 else code
    if code == 0:
        return {"metadata": {}, "status": "Success"}
    return {"metadata": {}, "status": "Failure", "reason": "NonZeroExitCode",
            "message": f"command terminated with non-zero exit code: {code}",
            "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]}}


async def _exec_streamed(ws: web.WebSocketResponse, sandbox: Sandbox, argv: list[str],
                         wants_stdin: bool) -> int:
    # A kubelet streams whatever the command writes: no cap here (the client caps).
    process = await sandbox.stream(argv, timeout=3600, output_limit=EXEC_OUTPUT_CEILING)
    if not wants_stdin:
        await process.close_stdin()
    feeder = asyncio.ensure_future(
        _feed_stdin(ws, process, v5=ws.ws_protocol == V5) if wants_stdin else _drain(ws))
    try:
        async for chunk in process:
            channel = b"\x01" if chunk.stream == "stdout" else b"\x02"
            with contextlib.suppress(ConnectionError):  # gone: keep draining the command
                await ws.send_bytes(channel + chunk.data)
        return await process.wait()
    finally:
        feeder.cancel()
        await asyncio.wait({feeder})


async def _exec_collected(ws: web.WebSocketResponse, sandbox: Sandbox, argv: list[str],
                          wants_stdin: bool) -> int:
    stdin = bytearray()
    if wants_stdin:
        async for msg in ws:
            if msg.type != WSMsgType.BINARY or not msg.data:
                break
            if msg.data[0] == STDIN:
                stdin += msg.data[1:]
            elif msg.data[0] == CLOSE:
                break
    result = await sandbox.exec(argv, stdin=bytes(stdin) if wants_stdin else None,
                                timeout=3600, output_limit=EXEC_OUTPUT_CEILING)
    with contextlib.suppress(ConnectionError):
        if result.stdout:
            await ws.send_bytes(b"\x01" + result.stdout)
        if result.stderr:
            await ws.send_bytes(b"\x02" + result.stderr)
    return result.exit_code


async def _feed_stdin(ws: web.WebSocketResponse, process: Process, *, v5: bool) -> None:
    """Channel 0 to the command's stdin; (255, 0) closes it on v5. When the client goes
    away, stdin is closed."""
    try:
        async for msg in ws:
            if msg.type != WSMsgType.BINARY or not msg.data:
                continue
            if msg.data[0] == STDIN:
                with contextlib.suppress(BrokenPipeError):
                    await process.write_stdin(msg.data[1:])
            elif msg.data[:2] == bytes([CLOSE, STDIN]) and v5:
                await process.close_stdin()
    finally:
        await process.close_stdin()


async def _drain(ws: web.WebSocketResponse) -> None:
    """Read (and ignore) what a client without stdin sends, so its close is seen."""
    async for _ in ws:
        pass
