"""agent-sandbox's in-sandbox HTTP runtime, for the emulator's pods.

It serves the API of upstream's ``examples/python-runtime-sandbox`` (``GET /``,
``POST /execute``, ``POST /upload``, ``GET /download|exists|list/{path}``) with the same
behaviour where rollbox can tell the difference: ``/execute`` ``shlex.split``\\ s the
command and runs it without a shell in the base directory (``$SANDBOX_BASE_DIR``, else
``/app``, which the runtime's image has), kills it at its own limit and answers exit code
1 with ``Failed to execute command: …`` then, and when the output is not UTF-8; paths of
the file endpoints are confined to the base directory (lexically here; upstream resolves
symlinks too). Commands and files act on the pod's backing sandbox.

Each pod's server listens on its own loopback address (all of 127/8 reaches ``lo`` on
Linux), reported as the pod's IP, at the runtime port. ``kill()`` drops it abruptly,
connections in flight included, as when the runtime process dies.
"""

from __future__ import annotations

import contextlib
import errno
import posixpath
import random
import shlex
from urllib.parse import unquote

import aiohttp
from aiohttp import web
from rollbox.errors import ExecTimeoutError, RollboxError
from rollbox.sandbox import Sandbox

_CEILING = 512 * 1024 * 1024


class SandboxRuntime:
    """One pod's runtime server, backed by that pod's sandbox."""

    def __init__(self, sandbox: Sandbox, *, base_dir: str, exec_timeout_s: float = 300.0
                 ) -> None:
        """``exec_timeout_s``: the runtime's own limit on a command; 0 kills every one
        at once (a limit of a millisecond still lets a quick command finish)."""
        self.sandbox = sandbox
        self.base_dir = base_dir
        self.exec_timeout_s = exec_timeout_s
        self.ip = ""
        self.requests = 0
        self._runner: web.AppRunner | None = None
        self._inflight: dict[int, web.Request] = {}

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self, port: int, ip: str | None = None) -> str:
        """Listen at ``ip`` (default: a free loopback address) on ``port``; returns the
        address."""
        result = await self.sandbox.exec(["mkdir", "-p", "--", self.base_dir], timeout=30)
        if not result.ok:
            raise OSError(f"cannot make the runtime's base dir: {result.stderr!r}")
        app = web.Application(client_max_size=_CEILING)
        app.router.add_get("/", self._health)
        app.router.add_post("/execute", self._execute)
        app.router.add_post("/upload", self._upload)
        app.router.add_get("/download/{path:.*}", self._download)
        app.router.add_get("/exists/{path:.*}", self._exists)
        app.router.add_get("/list/{path:.*}", self._list)
        runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.5)
        await runner.setup()
        for _ in range(1 if ip is not None else 50):
            # 127.128 and up: apart from the unserved pod IPs of controller.py
            addr = ip or (f"127.{random.randint(128, 254)}.{random.randint(0, 255)}."
                          f"{random.randint(1, 254)}")
            try:
                await web.TCPSite(runner, addr, port).start()
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE and ip is None:
                    continue
                await runner.cleanup()
                raise
            self._runner, self.ip = runner, addr
            return addr
        await runner.cleanup()
        raise OSError(errno.EADDRINUSE, f"no free loopback address for port {port}")

    async def stop(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def kill(self) -> None:
        """Die at once: in-flight connections are cut, nothing answers any more."""
        for request in list(self._inflight.values()):
            if request.transport is not None:
                request.transport.abort()
            task = request.task
            if task is not None:
                task.cancel()
        await self.stop()

    # -- endpoints ---------------------------------------------------------------------

    def _safe(self, path: str) -> str | None:
        base = posixpath.normpath(self.base_dir)
        full = posixpath.normpath(posixpath.join(base, path.lstrip("/")))
        if full != base and not full.startswith(base.rstrip("/") + "/"):
            return None
        return full

    async def _health(self, request: web.Request) -> web.Response:
        self.requests += 1
        return web.json_response({"status": "ok", "message": "Sandbox Runtime is active."})

    async def _execute(self, request: web.Request) -> web.Response:
        self.requests += 1
        self._inflight[id(request)] = request
        try:
            body = await request.json()
            return web.json_response(await self._run(str(body["command"])))
        finally:
            self._inflight.pop(id(request), None)

    async def _run(self, command: str) -> dict[str, object]:
        def failed(why: str) -> dict[str, object]:
            return {"stdout": "", "stderr": f"Failed to execute command: {why}", "exit_code": 1}

        try:
            argv = shlex.split(command)
        except ValueError as exc:
            return failed(str(exc))
        if not argv:
            return failed("list index out of range")
        if self.exec_timeout_s <= 0:  # a runtime that kills every command at once
            return failed(f"Command {argv!r} timed out after 0 seconds")
        try:
            result = await self.sandbox.exec(argv, cwd=self.base_dir,
                                             timeout=self.exec_timeout_s,
                                             output_limit=_CEILING)
        except ExecTimeoutError:
            return failed(f"Command {argv!r} timed out after {self.exec_timeout_s:g} seconds")
        except RollboxError as exc:
            return failed(f"[Errno 2] No such file or directory: {argv[0]!r} ({exc.message})")
        try:
            stdout, stderr = result.stdout.decode(), result.stderr.decode()
        except UnicodeDecodeError as exc:
            return failed(str(exc))
        return {"stdout": stdout, "stderr": stderr, "exit_code": result.exit_code}

    async def _upload(self, request: web.Request) -> web.Response:
        self.requests += 1
        form = await request.post()
        field = form.get("file")
        if not isinstance(field, web.FileField):
            return web.json_response({"detail": "file is required"}, status=422)
        target = self._safe(field.filename)
        if target is None:
            return web.json_response({"message": "Access denied"}, status=403)
        try:
            await self.sandbox.write_file(target, field.file.read(), mode=0o644)
        except RollboxError as exc:
            return web.json_response({"message": f"File upload failed: {exc.message}"},
                                     status=500)
        return web.json_response({"message": f"File '{field.filename}' uploaded successfully."})

    async def _download(self, request: web.Request) -> web.Response:
        self.requests += 1
        target = self._safe(unquote(request.match_info["path"]))
        if target is None:
            return web.json_response({"message": "Access denied"}, status=403)
        try:
            data = await self.sandbox.read_file(target)
        except RollboxError:
            return web.json_response({"message": "File not found"}, status=404)
        return web.Response(body=data, content_type="application/octet-stream")

    async def _exists(self, request: web.Request) -> web.Response:
        self.requests += 1
        path = unquote(request.match_info["path"])
        target = self._safe(path)
        if target is None:
            return web.json_response({"message": "Access denied"}, status=403)
        found = (await self.sandbox.exec(["test", "-e", target], timeout=30)).ok
        return web.json_response({"path": path, "exists": found})

    async def _list(self, request: web.Request) -> web.Response:
        self.requests += 1
        target = self._safe(unquote(request.match_info["path"]))
        if target is None:
            return web.json_response({"message": "Access denied"}, status=403)
        result = await self.sandbox.exec(
            ["find", target, "-mindepth", "1", "-maxdepth", "1", "-printf", r"%f\t%s\t%y\t%T@\n"],
            timeout=30)
        if not result.ok:
            return web.json_response({"message": "Path is not a directory"}, status=404)
        entries = []
        for line in result.stdout.decode(errors="replace").splitlines():
            name, size, kind, mtime = line.split("\t")
            entries.append({"name": name, "size": int(size), "mod_time": float(mtime),
                            "type": "directory" if kind == "d" else "file"})
        return web.json_response(entries)


class Runtimes:
    """The runtimes of a fake cluster's pods, by (namespace, pod)."""

    def __init__(self, port: int, base_dir: str | None, exec_timeout_s: float) -> None:
        self.port = port
        self.base_dir = base_dir
        self.exec_timeout_s = exec_timeout_s
        self.by_pod: dict[tuple[str, str], SandboxRuntime] = {}

    async def start(self, key: tuple[str, str], sandbox: Sandbox, env: dict[str, str]) -> str:
        """Serve ``sandbox``'s runtime; returns the loopback address to report as pod IP."""
        base = self.base_dir or env.get("SANDBOX_BASE_DIR", "").strip() or "/app"
        runtime = SandboxRuntime(sandbox, base_dir=base, exec_timeout_s=self.exec_timeout_s)
        ip = await runtime.start(self.port)
        self.by_pod[key] = runtime
        return ip

    async def stop(self, key: tuple[str, str]) -> None:
        runtime = self.by_pod.pop(key, None)
        if runtime is not None:
            await runtime.kill()

    async def stop_all(self) -> None:
        for key in list(self.by_pod):
            with contextlib.suppress(Exception):
                await self.stop(key)


class SandboxRouter:
    """A stand-in for upstream's sandbox router: forwards each request to the pod named
    by ``X-Sandbox-ID`` (at ``X-Sandbox-Pod-IP`` when given, else the pod's runtime found
    by name) on ``X-Sandbox-Port``, after checking the bearer ``token`` if one is set."""

    def __init__(self, runtimes: Runtimes, *, token: str | None = None) -> None:
        self.runtimes = runtimes
        self.token = token
        self.url = ""
        self.forwarded = 0
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> str:
        app = web.Application(client_max_size=_CEILING)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        self._session = aiohttp.ClientSession()
        return self.url

    async def stop(self) -> None:
        if self._session is not None:
            await self._session.close()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _forward(self, request: web.Request) -> web.Response:
        if self.token is not None and request.headers.get("Authorization") != \
                f"Bearer {self.token}":
            return web.json_response({"detail": "Invalid token."}, status=401)
        sandbox_id = request.headers.get("X-Sandbox-ID")
        ns = request.headers.get("X-Sandbox-Namespace", "default")
        if not sandbox_id:
            return web.json_response({"detail": "X-Sandbox-ID header is required."},
                                     status=400)
        ip = request.headers.get("X-Sandbox-Pod-IP")
        if not ip:
            runtime = self.runtimes.by_pod.get((ns, sandbox_id))
            if runtime is None:
                return web.json_response({"detail": "no such sandbox"}, status=502)
            ip = runtime.ip
        port = request.headers.get("X-Sandbox-Port", "8888")
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items()
                   if k.lower() in ("content-type",)}
        self.forwarded += 1
        async with self._session.request(
                request.method, f"http://{ip}:{port}{request.path_qs}", headers=headers,
                data=await request.read(), allow_redirects=False) as upstream:
            body = await upstream.read()
            return web.Response(status=upstream.status, body=body,
                                content_type=upstream.content_type)
