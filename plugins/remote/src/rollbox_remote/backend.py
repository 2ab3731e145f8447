"""``RemoteBackend``: sandboxes held by a ``rollbox serve`` process, used over HTTP.

Creating a sandbox takes one from the server's warm pool; closing it gives it back,
reset in place for the next client (or closes it, if something broke). Warm targets
(``keep_warm``) and image hints from every client add up on the server, so many
processes share one pool. The server keeps a sandbox when its client goes away, until
its idle TTL; ``attach(id)`` picks it up from any process that has the token.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import socket
import ssl
from collections.abc import AsyncIterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import quote

from rollbox.backend import Backend, Diagnostic
from rollbox.errors import (
    SANDBOX_SOUND_AFTER,
    RollboxError,
    SandboxError,
    SandboxLostError,
    SandboxNotFoundError,
    ServerUnavailableError,
    UsageError,
)
from rollbox.relay import LoopbackListener, splice, streams
from rollbox.sandbox import (
    Capabilities,
    Endpoint,
    ExecRequest,
    ExecResult,
    OutputChunk,
    Process,
    Sandbox,
    Snapshot,
    check_port,
)
from rollbox.spec import SandboxSpec

from rollbox_remote import protocol, settings
from rollbox_remote.address import Address
from rollbox_remote.http import HttpClient
from rollbox_remote.websocket import BINARY, WebSocket, WebSocketClosed


class RemoteBackend(Backend):
    """Sandboxes of a ``rollbox serve`` server.

    ``url``: ``unix:/path``, ``http://HOST:PORT`` or ``https://HOST:PORT`` (default
    ``$ROLLBOX_URL``, else the server's default socket). ``token`` (default
    ``$ROLLBOX_TOKEN``, else the file ``token_file``, ``$ROLLBOX_TOKEN_FILE`` or the
    server's default token file). ``owner``: the label the server lists this client's
    sandboxes under (default ``HOST:PID``). ``ca_file``: the certificate authority of
    an ``https`` server with a private certificate (default ``$ROLLBOX_CA``).
    ``timeout_s``: how long operations without a timeout of their own (files, ping, ...)
    wait for the server; ``slack_s``: how long past an operation's own timeout (a
    command's, a create's) the server may take to answer before it counts as gone.

    The constructor asks the server what its backend can do (its capabilities become
    this backend's), so it fails at once, with ServerUnavailableError or
    AuthenticationError, when the server is not there or refuses the token.
    """

    name = "remote"
    capabilities: Capabilities = Capabilities()

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        token_file: str | Path | None = None,
        owner: str | None = None,
        ca_file: str | Path | None = None,
        timeout_s: float = 60.0,
        slack_s: float = 30.0,
        connect_timeout_s: float = 10.0,
    ) -> None:
        self.url = url or settings.default_url()
        self.address = Address.parse(self.url)
        ca = ca_file or os.environ.get("ROLLBOX_CA")
        try:
            context = ssl.create_default_context(cafile=str(ca)) if ca else None
        except (OSError, ssl.SSLError) as exc:
            raise UsageError(f"cannot load the certificate authority {ca}: {exc}") from None
        self.client_id = secrets.token_hex(8)
        """This client on the server: its warm targets and hints, what it made."""
        self.http = HttpClient(self.address, settings.resolve_token(token, token_file,
                                                      local=self.url == settings.default_url()),
                               ssl_context=context, connect_timeout_s=connect_timeout_s,
                               client_id=self.client_id)
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}"
        self.timeout_s = timeout_s
        self.slack_s = slack_s
        self.server = self._hello()
        """The server's ``/v1/health`` answer: version, backend, capabilities."""
        caps = self.server.get("capabilities", {})
        known = {k: bool(v) for k, v in caps.items() if k in Capabilities.__dataclass_fields__}
        self.capabilities = Capabilities(**known)  # the server's backend's
        self._sandboxes: dict[str, RemoteSandbox] = {}
        self._wishes: dict[SandboxSpec, int] = {}
        self._hints: list[str] = []
        self._sync: asyncio.Task[None] | None = None
        self._dirty = False
        self.sync_errors = 0
        """Warm targets or hints the server could not be told (it kept the last ones)."""

    def _hello(self) -> dict[str, Any]:
        """GET /v1/health, synchronously (from a thread, so it works inside a running
        event loop too): what the constructor needs before any await."""

        async def fetch() -> dict[str, Any]:
            client = HttpClient(self.address, self.http.token,
                                ssl_context=self.http.ssl_context,
                                connect_timeout_s=self.http.connect_timeout_s)
            try:
                answer = await client.request("GET", f"{protocol.PREFIX}/health",
                                              timeout=self.http.connect_timeout_s + 5)
                data = answer.json()
            finally:
                await client.aclose()
            if not isinstance(data, dict) or data.get("protocol") != protocol.VERSION:
                raise UsageError(f"the server at {self.address} does not speak rollbox "
                                 f"protocol {protocol.VERSION} (it said {data!r:.200})")
            return data

        with ThreadPoolExecutor(1) as pool:
            return pool.submit(asyncio.run, fetch()).result()

    async def call(self, method: str, path: str, *, timeout: float | None = None,
                   **kwargs: Any) -> Any:
        """One request to the server; the decoded JSON answer (None if it has none)."""
        answer = await self.http.request(method, protocol.PREFIX + path,
                                         timeout=timeout or self.timeout_s, **kwargs)
        return answer.json() if answer.body else None

    # -- Backend API ---------------------------------------------------------------------

    async def create(self, spec: SandboxSpec) -> RemoteSandbox:
        info = await self.call(
            "POST", "/sandboxes", timeout=spec.timeouts.create_s + self.slack_s,
            json_body={"spec": protocol.spec_to_json(spec), "owner": self.owner,
                       "client": self.client_id, "timeout_s": spec.timeouts.create_s},
        )
        return self._adopt(info, spec)

    async def attach(self, sandbox_id: str) -> RemoteSandbox:
        """A handle on a sandbox the server holds (any owner's): the ``id`` of a sandbox
        another process created. Closing the handle closes the sandbox; this backend's
        ``aclose`` leaves attached sandboxes to their creator. SandboxNotFoundError if
        the server holds none by that id."""
        info = await self.call("GET", f"/sandboxes/{_q(sandbox_id)}")
        return RemoteSandbox(self, info, protocol.spec_from_json(info["spec"]))

    def _adopt(self, info: dict[str, Any], spec: SandboxSpec) -> RemoteSandbox:
        sandbox = RemoteSandbox(self, info, spec)
        self._sandboxes[sandbox.id] = sandbox
        return sandbox

    async def prefetch(self, image: str) -> None:
        await self.call("POST", "/prefetch", json_body={"image": image}, timeout=3600)

    def hint_upcoming(self, images: list[str] | tuple[str, ...]) -> None:  # type: ignore[override]
        self._hints = list(images)
        self._schedule_sync()

    def keep_warm(self, spec: SandboxSpec, count: int) -> bool:
        """Tell the server (in the background, coalesced) to keep ``count`` idle
        sandboxes of ``spec`` for this client; it adds every client's targets up."""
        if not self.server.get("warming", False):
            return False
        if count > 0:
            self._wishes[spec] = count
        else:
            self._wishes.pop(spec, None)
        self._schedule_sync()
        return True

    def _schedule_sync(self) -> None:
        self._dirty = True
        if self._sync is None or self._sync.done():
            self._sync = asyncio.ensure_future(self._send_state())

    async def flush(self) -> None:
        """Return once the server has this client's latest warm targets and hints."""
        while self._sync is not None and not self._sync.done():
            await asyncio.gather(self._sync, return_exceptions=True)

    async def _send_state(self) -> None:
        while self._dirty:
            self._dirty = False
            body = {"client": self.client_id, "owner": self.owner, "images": self._hints,
                    "wishes": [{"spec": protocol.spec_to_json(s), "count": n}
                               for s, n in self._wishes.items()]}
            try:
                await self.call("PUT", f"/clients/{self.client_id}", json_body=body)
            except RollboxError:
                self.sync_errors += 1
                return

    async def fork(self, snapshot: Snapshot) -> RemoteSandbox:
        info = await self.call("POST", f"/snapshots/{_q(snapshot.id)}/fork",
                               json_body={"owner": self.owner, "client": self.client_id},
                               timeout=snapshot.spec.timeouts.create_s + self.slack_s)
        return self._adopt(info, snapshot.spec)

    async def drop_snapshot(self, snapshot: Snapshot) -> None:
        with contextlib.suppress(SandboxNotFoundError):
            await self.call("DELETE", f"/snapshots/{_q(snapshot.id)}")

    async def leftovers(self) -> list[str]:
        """Sandboxes this backend created that the server still holds, and port relays
        still open here."""
        await self.flush()
        held = await self.call("GET", f"/sandboxes?client={self.client_id}")
        found = [f"sandbox {s['id']} is open on {self.address}" for s in held]
        for sandbox in self._sandboxes.values():
            found += [f"port relay 127.0.0.1:{r.port} for {sandbox.id}"
                      for r in sandbox.relays.values()]
        return found

    async def aclose(self) -> None:
        """Close every sandbox this backend created and still holds, withdraw its warm
        targets and hints, and close its connections."""
        await asyncio.gather(*(s.close() for s in list(self._sandboxes.values())),
                             return_exceptions=True)
        if self._sync is not None:
            await asyncio.gather(self._sync, return_exceptions=True)
        if self._wishes or self._hints:
            with contextlib.suppress(RollboxError):
                await self.call("DELETE", f"/clients/{self.client_id}", timeout=10)
            self._wishes.clear()
            self._hints.clear()
        await self.http.aclose()

    @classmethod
    def doctor(cls) -> list[Diagnostic]:
        url = settings.default_url()
        try:
            backend = cls()
        except RollboxError as exc:
            return [Diagnostic("rollbox server", False, f"{url}: {exc.message}",
                               fix="start one with `rollbox serve`, or set ROLLBOX_URL and "
                                   "ROLLBOX_TOKEN")]
        info = backend.server
        return [Diagnostic("rollbox server", True,
                           f"{url}: rollbox {info.get('version')} with the "
                           f"{info.get('backend')!r} backend, pid {info.get('pid')}")]


class RemoteSandbox(Sandbox):
    """A sandbox held by the server; every method is one request (``stream`` one
    WebSocket)."""

    def __init__(self, backend: RemoteBackend, info: Mapping[str, Any],
                 spec: SandboxSpec) -> None:
        super().__init__(str(info["id"]), spec)
        self.backend = backend
        self.base_env = dict(info.get("base_env") or {})
        self.owner = str(info.get("owner", ""))
        self.relays: dict[int, LoopbackListener] = {}
        self._path = f"/sandboxes/{_q(self.id)}"
        self._closed = False
        self._closing: asyncio.Future[None] | None = None
        self._broken = False

    async def _call(self, method: str, suffix: str, **kwargs: Any) -> Any:
        if self._closed:
            raise SandboxLostError(f"sandbox {self.id} is closed", sandbox_id=self.id)
        try:
            return await self.backend.call(method, self._path + suffix, **kwargs)
        except SandboxError as exc:
            self._note(exc)
            raise

    def _note(self, error: SandboxError) -> None:
        """Remember a failure after which the server should not reuse this sandbox."""
        if not isinstance(error, SANDBOX_SOUND_AFTER):
            self._broken = True

    async def run(self, request: ExecRequest) -> ExecResult:
        data = await self._call("POST", "/exec", json_body=protocol.request_to_json(request),
                                timeout=request.timeout_s + self.backend.slack_s)
        return protocol.result_from_json(data)

    async def start(self, request: ExecRequest) -> Process:
        if self._closed:
            raise SandboxLostError(f"sandbox {self.id} is closed", sandbox_id=self.id)
        return await RemoteProcess.start(self, request)

    async def read_file(self, path: str) -> bytes:
        chunks: list[bytes] = []

        async def collect(chunk: bytes) -> None:
            chunks.append(chunk)

        await self._call("GET", f"/files?path={_q(path)}", sink=collect)
        return b"".join(chunks)

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        await self._call("PUT", f"/files?path={_q(path)}&mode={mode:o}", body=data,
                         timeout=self.backend.timeout_s + len(data) / 10e6)

    async def upload(self, local: str | Path, remote: str) -> None:
        """Stream a local file into the sandbox (its permission bits kept)."""
        source = Path(local)
        info = await asyncio.to_thread(source.stat)
        await self._call("PUT", f"/files?path={_q(remote)}&mode={info.st_mode & 0o777:o}",
                         upload=source, timeout=self.backend.timeout_s + info.st_size / 10e6)

    async def download(self, remote: str, local: str | Path) -> None:
        """Stream a file out of the sandbox into ``local`` (replaced only when whole)."""
        target = Path(local)
        partial = target.with_name(f".{target.name}.rollbox-{secrets.token_hex(4)}")
        out = await asyncio.to_thread(partial.open, "wb")
        try:
            async def save(chunk: bytes) -> None:
                await asyncio.to_thread(out.write, chunk)

            await self._call("GET", f"/files?path={_q(remote)}&via=file", sink=save,
                             timeout=3600)
            await asyncio.to_thread(out.close)
            await asyncio.to_thread(partial.replace, target)
        finally:
            out.close()
            await asyncio.to_thread(partial.unlink, missing_ok=True)

    async def reset(self) -> None:
        """Reset on the server; the endpoints this handle opened close with it."""
        relays, self.relays = list(self.relays.values()), {}
        await asyncio.gather(*(r.aclose() for r in relays))
        await self._call("POST", "/reset",
                         timeout=self.spec.timeouts.reset_s + self.backend.slack_s)

    async def seal(self) -> None:
        """Seal on the server (its backend's ``seal``)."""
        await self._call("POST", "/seal", timeout=self.spec.timeouts.reset_s + self.backend.slack_s)

    async def snapshot(self) -> Snapshot:
        data = await self._call("POST", "/snapshot", timeout=600)
        return Snapshot(id=data["id"], spec=self.spec, backend=RemoteBackend.name)

    async def ping(self) -> bool:
        try:
            return bool((await self._call("POST", "/ping", timeout=15))["ok"])
        except RollboxError:
            return False

    async def endpoint(self, port: int) -> Endpoint:
        """A loopback address in this process, relayed through the server to ``port``
        inside the sandbox (one WebSocket per connection)."""
        check_port(port)
        data = await self._call("POST", f"/ports/{port}")
        relay = self.relays.get(port)
        if relay is None:
            path = f"{protocol.PREFIX}{self._path}/ports/{port}"
            relay = LoopbackListener(lambda r, w: _tunnel(self.backend.http, path, r, w))
            await relay.start()
            if self._closed:
                await relay.aclose()
                raise SandboxLostError(f"sandbox {self.id} is closed", sandbox_id=self.id)
            self.relays[port] = relay
        return Endpoint(relay.url, dict(data.get("headers") or {}))

    async def detach(self) -> None:
        """Stop using this handle without closing the sandbox (an attached one's creator
        closes it): the endpoints it opened here close; later calls are SandboxLostError."""
        relays, self.relays = list(self.relays.values()), {}
        await asyncio.gather(*(r.aclose() for r in relays))
        self._closed = True
        if self.backend._sandboxes.get(self.id) is self:  # not the creator's, if attached
            del self.backend._sandboxes[self.id]

    async def close(self) -> None:
        """Give the sandbox back to the server (reset for the next client, or closed if
        it failed here). Idempotent; a sandbox the server no longer holds is closed."""
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._close())
        try:
            await asyncio.shield(self._closing)
        except BaseException:
            if self._closing.done():
                self._closing = None  # let a later close try again
            raise

    async def _close(self) -> None:
        relays, self.relays = list(self.relays.values()), {}
        await asyncio.gather(*(r.aclose() for r in relays))
        outcome = "broken" if self._broken else "ok"
        with contextlib.suppress(SandboxNotFoundError):
            await self.backend.call("DELETE", f"{self._path}?outcome={outcome}")
        self._closed = True
        self.backend._sandboxes.pop(self.id, None)


class RemoteProcess(Process):
    """A streaming command over one WebSocket: output as it arrives, stdin, signals."""

    def __init__(self, sandbox: RemoteSandbox, ws: WebSocket, request: ExecRequest) -> None:
        self._sandbox = sandbox
        self._ws = ws
        self._request = request
        self._chunks: asyncio.Queue[OutputChunk | None] = asyncio.Queue()
        self._code: int | None = None
        self._error: RollboxError | None = None
        self._reader = asyncio.ensure_future(self._read())

    @classmethod
    async def start(cls, sandbox: RemoteSandbox, request: ExecRequest) -> RemoteProcess:
        path = f"{protocol.PREFIX}{sandbox._path}/stream"
        ws = await WebSocket.connect(sandbox.backend.http, path, timeout=sandbox.backend.timeout_s)
        try:
            await ws.send_json({"type": "start",
                                "request": protocol.request_to_json(request, with_stdin=False)})
            kind, payload = await asyncio.wait_for(ws.receive(), sandbox.backend.timeout_s)
            message = json.loads(payload) if kind != BINARY else {}
            if message.get("type") == "error":
                error = protocol.error_from_json(message.get("error"))
                if isinstance(error, SandboxError):
                    sandbox._note(error)
                raise error
            if message.get("type") != "started":
                raise UsageError(f"unexpected stream message from the server: {message!r:.200}")
        except TimeoutError:
            await ws.close()
            raise sandbox.backend.http.unavailable("it did not start the command") from None
        except WebSocketClosed as exc:
            raise sandbox.backend.http.unavailable(f"it closed the stream ({exc})") from None
        except BaseException:
            await ws.close()
            raise
        process = cls(sandbox, ws, request)
        if request.stdin is not None:
            await process.write_stdin(request.stdin)
            await process.close_stdin()
        return process

    async def _read(self) -> None:
        deadline = self._request.timeout_s + self._sandbox.backend.slack_s
        try:
            async with asyncio.timeout(deadline):
                await self._receive()
        except TimeoutError:
            self._error = self._sandbox.backend.http.unavailable(
                f"the command's end never came back (waited {deadline:.0f}s)")
        finally:
            self._chunks.put_nowait(None)
            await self._ws.close()

    async def _receive(self) -> None:
        try:
            while True:
                kind, payload = await self._ws.receive()
                if kind == BINARY:
                    name = protocol.STREAM_NAMES.get(payload[0]) if payload else None
                    if name is not None and len(payload) > 1:
                        self._chunks.put_nowait(OutputChunk(name, payload[1:]))  # type: ignore[arg-type]
                    continue
                message = json.loads(payload)
                if message.get("type") == "exit":
                    self._code = int(message["exit_code"])
                    return
                if message.get("type") == "error":
                    self._error = protocol.error_from_json(message.get("error"))
                    if isinstance(self._error, SandboxError):
                        self._sandbox._note(self._error)
                    return
        except WebSocketClosed as exc:
            self._error = self._sandbox.backend.http.unavailable(
                f"it closed the stream before the command ended ({exc})")
        except ServerUnavailableError as exc:
            self._error = exc
        except (ValueError, KeyError, TypeError) as exc:
            self._error = UsageError(f"malformed stream message from the server: {exc}")

    async def _iterate(self) -> AsyncIterator[OutputChunk]:
        while (chunk := await self._chunks.get()) is not None:
            yield chunk
        self._chunks.put_nowait(None)  # a second iteration ends at once

    def __aiter__(self) -> AsyncIterator[OutputChunk]:
        return self._iterate()

    async def write_stdin(self, data: bytes) -> None:
        for start in range(0, len(data), 1 << 20):
            await self._send(bytes([protocol.STDIN]) + data[start:start + (1 << 20)])

    async def close_stdin(self) -> None:
        await self._send({"type": "close_stdin"})

    async def send_signal(self, signum: int) -> None:
        await self._send({"type": "signal", "signum": int(signum)})

    async def _send(self, message: bytes | dict[str, object]) -> None:
        """To the command; dropped once it has ended (like a pipe to a process that
        exited, nobody reads it; a stream that broke is reported by ``wait``)."""
        if self._reader.done():
            return
        try:
            if isinstance(message, bytes):
                await self._ws.send_bytes(message)
            else:
                await self._ws.send_json(message)
        except ServerUnavailableError:
            if not self._reader.done():
                await asyncio.wait({self._reader}, timeout=self._sandbox.backend.slack_s)
            if not self._reader.done():
                raise

    async def wait(self) -> int:
        await asyncio.shield(self._reader)  # ends by the command's timeout + slack at most
        if self._error is not None:
            raise self._error
        assert self._code is not None
        return self._code


async def _tunnel(http: HttpClient, path: str, reader: asyncio.StreamReader,
                  writer: asyncio.StreamWriter) -> None:
    """One accepted loopback connection, carried to the sandbox over a WebSocket."""
    try:
        ws = await WebSocket.connect(http, path)
    except RollboxError:
        return
    await splice(streams(reader, writer), (_WsSource(ws), _WsSink(ws)))


class _WsSource:
    """Binary messages of a tunnel WebSocket as a byte stream; a text message
    (``{"type": "eof"}``) or the end of the WebSocket is its end."""

    def __init__(self, ws: WebSocket) -> None:
        self.ws = ws

    async def read(self, n: int) -> bytes:
        while True:
            try:
                kind, payload = await self.ws.receive()
            except (WebSocketClosed, ServerUnavailableError):
                return b""
            if kind != BINARY:
                return b""
            if payload:
                return payload


class _WsSink:
    def __init__(self, ws: WebSocket) -> None:
        self.ws = ws

    async def send(self, data: bytes) -> None:
        try:
            await self.ws.send_bytes(data)
        except ServerUnavailableError as exc:
            raise ConnectionResetError(str(exc)) from None

    async def send_eof(self) -> None:
        with contextlib.suppress(ServerUnavailableError):
            await self.ws.send_json({"type": "eof"})

    def close(self) -> None:
        self.ws.abort()


def _q(text: str) -> str:
    return quote(text, safe="")
