"""Pod exec over the API server's WebSocket channel protocol.

Each binary frame starts with a channel byte: 0 stdin, 1 stdout, 2 stderr, 3 status
(a JSON ``Status`` when the command ends), 4 resize. ``v5.channel.k8s.io`` adds 255,
"close this channel", which is how stdin gets its EOF; ``v4`` has no such thing, so
stdin is only sent when the server agreed to v5. The exit code comes from the status
channel: ``Success`` is 0, ``NonZeroExitCode`` carries it in ``details.causes``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import aiohttp
from kubernetes_asyncio.client import CoreV1Api
from kubernetes_asyncio.stream import WsApiClient
from kubernetes_asyncio.stream.ws_client import get_websocket_url

from rollbox_kubernetes.client import ApiError, KubeClient

V5 = "v5.channel.k8s.io"
V4 = "v4.channel.k8s.io"
PROTOCOLS = (V5, V4)
DEADLINE_GRACE_S = 5.0
"""How long past its timeout a command's exec may take to end (the ``timeout`` wrapper
in the pod kills it at the timeout; this is for the API server and kubelet to say so)
before rollbox stops waiting, host-side, and raises: whatever the pod's processes do
(stop the wrapper, say), a call returns within its timeout and this."""
STDIN, STDOUT, STDERR, STATUS, CLOSE = 0, 1, 2, 3, 255
_CHUNK = 256 * 1024


class ChannelWsApiClient(WsApiClient):
    """kubernetes-asyncio's WsApiClient, but offering v5 and v4 and telling which one the
    server chose (``ws.protocol``), instead of insisting on v4."""

    async def request(
        self,
        method: str,
        url: str,
        query_params: list[tuple[str, Any]] | None = None,
        headers: dict[str, str] | None = None,
        post_params: Any = None,
        body: Any = None,
        _preload_content: bool = True,
        _request_timeout: Any = None,
    ) -> Any:
        params: list[tuple[str, Any]] = []
        for key, value in query_params or []:
            if key == "command" and isinstance(value, list):
                params += [(key, part) for part in value]
            else:
                params.append((key, value))
        headers = {k: v for k, v in (headers or {}).items()
                   if k.lower() != "sec-websocket-protocol"}
        if params:
            url += "?" + urlencode(params)
        return self.rest_client.pool_manager.ws_connect(
            get_websocket_url(url), headers=headers, protocols=PROTOCOLS,
            heartbeat=self.heartbeat, max_msg_size=0,
        )


@dataclass
class ExecOutput:
    """What came back. ``exit_code`` is None when no exit status arrived."""

    exit_code: int | None
    stdout: bytes
    stderr: bytes
    stdout_truncated: bool
    stderr_truncated: bool
    failure: str = ""


class _Capped:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.parts: list[bytes] = []
        self.size = 0
        self.truncated = False

    def add(self, data: bytes) -> None:
        room = self.limit - self.size
        if len(data) > room:
            self.truncated = True
            data = data[:max(room, 0)]
        if data:
            self.parts.append(data)
            self.size += len(data)

    def value(self) -> bytes:
        return b"".join(self.parts)


def exit_code_of(status: dict[str, Any]) -> tuple[int | None, str]:
    """(exit code, failure message) from a status-channel ``Status``."""
    if status.get("status") == "Success":
        return 0, ""
    for cause in (status.get("details") or {}).get("causes") or []:
        if cause.get("reason") == "ExitCode":
            try:
                return int(cause.get("message", "")), ""
            except ValueError:
                break
    return None, str(status.get("message") or status.get("reason") or "exec failed")


async def open_exec(
    client: KubeClient,
    api: CoreV1Api,
    namespace: str,
    pod: str,
    argv: list[str],
    *,
    container: str,
    stdin: bool,
) -> aiohttp.ClientWebSocketResponse:
    """Open an exec WebSocket for ``argv`` in the pod's container (paced and counted as
    one ``exec`` request; a refused handshake is retried like any throttled call). The
    caller owns the socket; ``ws.protocol`` says whether the server agreed to v5."""
    attempt = 0
    while True:
        attempt += 1
        await client.pace("exec", f"/namespaces/{namespace}/pods/{pod}/exec")
        try:
            # kubernetes-asyncio types ``command`` as str, but sends a list as repeated
            # ``command=`` parameters, which is what argv needs.
            connect: Any = await api.connect_get_namespaced_pod_exec(
                pod, namespace, command=argv,  # type: ignore[arg-type]
                container=container, stdin=stdin,
                stdout=True, stderr=True, tty=False, _preload_content=False,
            )
            ws: aiohttp.ClientWebSocketResponse = await connect
            return ws
        except aiohttp.WSServerHandshakeError as exc:
            retry_after = None
            if exc.headers is not None and "Retry-After" in exc.headers:
                try:
                    retry_after = float(exc.headers["Retry-After"])
                except ValueError:
                    retry_after = None
            error = ApiError(exc.status, "Handshake", exc.message, retry_after=retry_after)
        except (aiohttp.ClientConnectionError, TimeoutError) as exc:
            error = ApiError(0, "Unreachable", f"{type(exc).__name__}: {exc}")
        # The command never started when the handshake failed, so a retry is safe.
        await client.backoff(error, attempt, idempotent=True)


async def pod_exec(
    client: KubeClient,
    api: CoreV1Api,
    namespace: str,
    pod: str,
    argv: list[str],
    *,
    container: str,
    stdin: bytes | None,
    output_limit: int,
) -> ExecOutput:
    """Run ``argv`` in the pod's container and collect its output. A connection that
    breaks once the command started is not retried (the command may have run): it comes
    back as an ``ExecOutput`` without exit code."""
    ws = await open_exec(client, api, namespace, pod, argv, container=container,
                         stdin=stdin is not None)
    try:
        return await _converse(ws, stdin, output_limit)
    except aiohttp.ClientConnectionError as exc:
        return ExecOutput(None, b"", b"", False, False, f"the exec stream broke: {exc}")
    finally:
        await ws.close()


async def _converse(ws: aiohttp.ClientWebSocketResponse, stdin: bytes | None,
                    output_limit: int) -> ExecOutput:
    if stdin is not None:
        if ws.protocol != V5:
            raise ApiError(0, "NoStdinClose",
                           "the API server does not speak v5.channel.k8s.io, so stdin cannot "
                           "be closed; needs Kubernetes >= 1.30")
        for start in range(0, len(stdin), _CHUNK):
            await ws.send_bytes(bytes([STDIN]) + stdin[start:start + _CHUNK])
        await ws.send_bytes(bytes([CLOSE, STDIN]))
    out, err = _Capped(output_limit), _Capped(output_limit)
    status: dict[str, Any] | None = None
    async for msg in ws:
        if msg.type != aiohttp.WSMsgType.BINARY or not msg.data:
            continue
        channel, data = msg.data[0], msg.data[1:]
        if channel == STDOUT:
            out.add(data)
        elif channel == STDERR:
            err.add(data)
        elif channel == STATUS and data:
            status = json.loads(data)
    if status is None:
        code, failure = None, "the exec stream ended without an exit status"
    else:
        code, failure = exit_code_of(status)
    return ExecOutput(code, out.value(), err.value(), out.truncated, err.truncated, failure)
