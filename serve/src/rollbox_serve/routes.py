"""The ``remote`` backend's face of the server: the routes of ``rollbox_remote.protocol``.

Every request under /v1 and /metrics needs the bearer token (401 before anything else
happens otherwise). Every error, including aiohttp's own (404 route, 413 too large,
405 method), is answered as a rollbox error in JSON, so a client always raises a typed
error; a bug in a handler is a 500, and the server carries on.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from aiohttp import web
from rollbox import __version__
from rollbox.errors import AuthenticationError, RollboxError, UsageError
from rollbox.sandbox import check_port
from rollbox_remote import protocol

from rollbox_serve.demand import ClientState
from rollbox_serve.files import RequestTooLargeError, receive_file, send_file
from rollbox_serve.metrics import render_metrics
from rollbox_serve.streams import stream_handler, tunnel_handler

if TYPE_CHECKING:
    from rollbox_serve.registry import Held
    from rollbox_serve.server import Server

log = logging.getLogger("rollbox.serve")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
SERVER = web.AppKey("server", object)
MAX_JSON = 64 << 20


def make_app(server: Server) -> web.Application:
    app = web.Application(middlewares=[_front(server)],
                          client_max_size=MAX_JSON)
    app[SERVER] = server
    p = protocol.PREFIX
    h = _Handlers(server)
    app.router.add_get(f"{p}/health", h.health)
    app.router.add_get("/metrics", h.metrics)
    app.router.add_post(f"{p}/sandboxes", h.create)
    app.router.add_get(f"{p}/sandboxes", h.list)
    app.router.add_delete(f"{p}/sandboxes", h.close_owner)
    app.router.add_get(f"{p}/sandboxes/{{id}}", h.info)
    app.router.add_delete(f"{p}/sandboxes/{{id}}", h.close)
    app.router.add_post(f"{p}/sandboxes/{{id}}/exec", h.exec)
    app.router.add_get(f"{p}/sandboxes/{{id}}/stream", h.stream)
    app.router.add_get(f"{p}/sandboxes/{{id}}/files", h.read_file)
    app.router.add_put(f"{p}/sandboxes/{{id}}/files", h.write_file)
    app.router.add_post(f"{p}/sandboxes/{{id}}/reset", h.reset)
    app.router.add_post(f"{p}/sandboxes/{{id}}/seal", h.seal)
    app.router.add_post(f"{p}/sandboxes/{{id}}/ping", h.ping)
    app.router.add_post(f"{p}/sandboxes/{{id}}/snapshot", h.snapshot)
    app.router.add_post(f"{p}/sandboxes/{{id}}/ports/{{port}}", h.port)
    app.router.add_get(f"{p}/sandboxes/{{id}}/ports/{{port}}", h.tunnel)
    app.router.add_post(f"{p}/snapshots/{{id}}/fork", h.fork)
    app.router.add_delete(f"{p}/snapshots/{{id}}", h.drop_snapshot)
    app.router.add_put(f"{p}/clients/{{id}}", h.client)
    app.router.add_delete(f"{p}/clients/{{id}}", h.forget_client)
    app.router.add_post(f"{p}/prefetch", h.prefetch)
    return app


def error_response(error: RollboxError) -> web.Response:
    status = 413 if isinstance(error, RequestTooLargeError) else protocol.status_of(error)
    return web.json_response({"error": protocol.error_to_json(error)}, status=status)


def _guarded(path: str) -> bool:
    return path.startswith(protocol.PREFIX + "/") or path == "/metrics"


def _front(server: Server) -> Any:
    """The token check, then the handler; every error answered as a rollbox error, and
    every answer counted by route and status (for /metrics)."""

    @web.middleware
    async def front(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            if _guarded(request.path):
                scheme, _, token = request.headers.get("Authorization", "").partition(" ")
                if scheme.lower() != "bearer" or not server.authorized(token.strip()):
                    raise AuthenticationError(
                        "missing or wrong token: send 'Authorization: Bearer TOKEN' with the "
                        "token `rollbox serve` printed (ROLLBOX_TOKEN for rollbox clients)")
                server.heard_from(request.headers.get("X-Rollbox-Client"))
            response = await handler(request)
        except RollboxError as exc:
            response = error_response(exc)
        except web.HTTPException as exc:
            if not _guarded(request.path) or exc.status < 400:
                raise
            response = error_response(UsageError(f"HTTP {exc.status} {exc.reason}: "
                                                 f"{request.method} {request.path}"))
            response.set_status(exc.status)
        except (asyncio.CancelledError, KeyboardInterrupt, SystemExit):
            raise
        except Exception as exc:
            log.exception("unexpected error answering %s %s", request.method, request.path)
            response = error_response(RollboxError(f"the server failed: {exc!r}"))
            response.set_status(500)
        route = request.match_info.route.resource
        key = (f"{request.method} {route.canonical if route is not None else 'unmatched'}",
               response.status)
        server.requests[key] = server.requests.get(key, 0) + 1
        return response

    return front


async def read_json(request: web.Request) -> dict[str, Any]:
    try:
        data = json.loads(await request.read())
    except (ValueError, UnicodeDecodeError):
        raise UsageError("the request body is not valid JSON") from None
    if not isinstance(data, dict):
        raise UsageError("the request body must be a JSON object")
    return data


def _str(data: dict[str, Any], key: str, default: str | None = None) -> str:
    value = data.get(key, default)
    if not isinstance(value, str) or not value or len(value) > 256:
        raise UsageError(f"{key!r} must be a non-empty string of at most 256 characters")
    return value


class _Handlers:
    def __init__(self, server: Server) -> None:
        self.server = server

    def _held(self, request: web.Request) -> Held:
        return self.server.held(request.match_info["id"])

    async def health(self, request: web.Request) -> web.Response:
        s = self.server
        return web.json_response({
            "server": "rollbox", "protocol": protocol.VERSION, "version": __version__,
            "backend": s.backend.name, "capabilities": asdict(s.backend.capabilities),
            "pid": os.getpid(), "sandboxes": len(s.registry.held),
            "idle": s.pool.idle_count(), "warming": True, "idle_ttl_s": s.idle_ttl_s,
        })

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=render_metrics(self.server),
                            content_type="text/plain", charset="utf-8")

    async def create(self, request: web.Request) -> web.Response:
        data = await read_json(request)
        spec = protocol.spec_from_json(data.get("spec"))
        owner = _str(data, "owner", "anonymous")
        timeout = data.get("timeout_s")
        if timeout is not None and (not isinstance(timeout, int | float) or timeout <= 0):
            raise UsageError("'timeout_s' must be a positive number")
        held = await self.server.create(spec, owner, client=_client(data), timeout_s=timeout)
        if request.transport is None or request.transport.is_closing():
            await self.server.release(held)  # the client gave up: nobody holds it
            raise UsageError("the client went away before its sandbox was ready")
        return web.json_response(held.info(self.server.registry.now()), status=201)

    async def list(self, request: web.Request) -> web.Response:
        owner, client = request.query.get("owner"), request.query.get("client")
        now = self.server.registry.now()
        return web.json_response([h.info(now) for h in self.server.registry.held.values()
                                  if (owner is None or h.owner == owner)
                                  and (client is None or h.client == client)])

    async def close_owner(self, request: web.Request) -> web.Response:
        owner = request.query.get("owner")
        if not owner:
            raise UsageError("closing many sandboxes needs ?owner=OWNER")
        doomed = [h for h in self.server.registry.held.values() if h.owner == owner]
        await asyncio.gather(*(self.server.release(h) for h in doomed))
        return web.json_response({"closed": len(doomed)})

    async def info(self, request: web.Request) -> web.Response:
        return web.json_response(self._held(request).info(self.server.registry.now()))

    async def close(self, request: web.Request) -> web.Response:
        outcome = request.query.get("outcome", "ok")
        if outcome not in ("ok", "broken"):
            raise UsageError("outcome must be 'ok' or 'broken'")
        held = self.server.registry.pop(request.match_info["id"])
        await self.server.release(held, broken=outcome == "broken")
        return web.Response(status=204)

    async def exec(self, request: web.Request) -> web.Response:
        held = self._held(request)
        exec_request = protocol.request_from_json(await read_json(request))
        with self.server.working_on(held):
            result = await held.sandbox.run(exec_request)
        return web.json_response(protocol.result_to_json(result))

    async def read_file(self, request: web.Request) -> web.StreamResponse:
        held = self._held(request)
        with self.server.working_on(held):
            return await send_file(request, held.sandbox, _path(request),
                                   via_file=request.query.get("via") == "file")

    async def write_file(self, request: web.Request) -> web.Response:
        held = self._held(request)
        path = _path(request)
        try:
            mode = int(request.query.get("mode", "644"), 8)
        except ValueError:
            raise UsageError("mode must be octal digits, e.g. 644") from None
        if not 0 <= mode <= 0o7777:
            raise UsageError("mode must be at most 7777")
        with self.server.working_on(held):
            await receive_file(request, held.sandbox, path, mode, self.server.max_file_bytes)
        return web.Response(status=204)

    async def reset(self, request: web.Request) -> web.Response:
        held = self._held(request)
        with self.server.working_on(held):
            held.endpoints.clear()  # a reset sandbox exposes nothing: endpoint() anew
            await held.sandbox.reset()
        return web.Response(status=204)

    async def seal(self, request: web.Request) -> web.Response:
        held = self._held(request)
        with self.server.working_on(held):
            await held.sandbox.seal()
        return web.Response(status=204)

    async def ping(self, request: web.Request) -> web.Response:
        held = self._held(request)
        with self.server.working_on(held):
            ok = await held.sandbox.ping()
        return web.json_response({"ok": ok})

    async def snapshot(self, request: web.Request) -> web.Response:
        held = self._held(request)
        with self.server.working_on(held):
            snapshot = await held.sandbox.snapshot()
        return web.json_response({"id": self.server.registry.add_snapshot(snapshot)})

    async def port(self, request: web.Request) -> web.Response:
        port = _port(request)
        held = self._held(request)
        with self.server.working_on(held):
            _, _, headers = await self.server.endpoint(held, port)
        return web.json_response({"headers": headers})

    async def stream(self, request: web.Request) -> web.StreamResponse:
        return await stream_handler(self.server, request)

    async def tunnel(self, request: web.Request) -> web.StreamResponse:
        return await tunnel_handler(self.server, request)

    async def fork(self, request: web.Request) -> web.Response:
        data = await read_json(request)
        held = await self.server.fork(request.match_info["id"], _str(data, "owner", "anonymous"),
                                      client=_client(data))
        return web.json_response(held.info(self.server.registry.now()), status=201)

    async def drop_snapshot(self, request: web.Request) -> web.Response:
        snapshot = self.server.registry.snapshot(request.match_info["id"])
        del self.server.registry.snapshots[request.match_info["id"]]
        await self.server.backend.drop_snapshot(snapshot)
        return web.Response(status=204)

    async def client(self, request: web.Request) -> web.Response:
        data = await read_json(request)
        images = data.get("images", [])
        if not isinstance(images, list) or not all(isinstance(i, str) for i in images):
            raise UsageError("'images' must be a list of image references")
        wishes = data.get("wishes", [])
        if not isinstance(wishes, list):
            raise UsageError("'wishes' must be a list of {spec, count}")
        state = ClientState(owner=_str(data, "owner", "anonymous"), images=images[:10_000])
        for wish in wishes:
            count = wish.get("count") if isinstance(wish, dict) else None
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise UsageError("a wish is {spec, count} with count an int >= 0")
            if count:
                state.wishes[protocol.spec_from_json(wish.get("spec"))] = count
        self.server.update_client(request.match_info["id"], state)
        return web.Response(status=204)

    async def forget_client(self, request: web.Request) -> web.Response:
        self.server.forget_client(request.match_info["id"])
        return web.Response(status=204)

    async def prefetch(self, request: web.Request) -> web.Response:
        image = _str(await read_json(request), "image")
        await self.server.backend.prefetch(image)
        return web.Response(status=204)


def _client(data: dict[str, Any]) -> str:
    client = data.get("client", "")
    if not isinstance(client, str) or len(client) > 64:
        raise UsageError("'client' must be a string of at most 64 characters")
    return client


def _path(request: web.Request) -> str:
    path = request.query.get("path")
    if path is None:
        raise UsageError("the file's path goes in the query: ?path=/some/file")
    return path


def _port(request: web.Request) -> int:
    try:
        return check_port(int(request.match_info["port"]))
    except ValueError:
        raise UsageError("a port is a number in 1-65535") from None
