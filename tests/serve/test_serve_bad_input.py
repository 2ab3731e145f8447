"""Bad input never takes the server down: malformed HTTP, JSON and WebSocket messages,
oversized bodies, unknown routes and random bytes get a 4xx (or a closed connection),
create nothing, and the server answers the next real request."""

from __future__ import annotations

import json
import random
import time

import pytest
from rollbox import SandboxSpec
from rollbox_remote import RemoteBackend, protocol
from rollbox_serve import Server
from serve_support import error_of, raw, request, status

SPEC = SandboxSpec(image="host")


async def assert_still_serving(server: Server, remote: RemoteBackend) -> None:
    async with await remote.create(SPEC) as sandbox:
        assert (await sandbox.exec(["echo", "alive"])).stdout == b"alive\n"


async def test_no_token_is_401_with_a_clear_message(server: Server) -> None:
    for token in (None, "wrong", ""):
        answer = await raw(server, request("POST", "/v1/sandboxes", token, b"{}"))
        assert status(answer) == 401
        error = error_of(answer)
        assert error["type"] == "AuthenticationError"
        assert "Authorization: Bearer" in str(error["message"])
    assert status(await raw(server, request("GET", "/metrics", None))) == 401
    assert server.registry.held == {}


@pytest.mark.parametrize(("method", "path", "body", "expected"), [
    ("POST", "/v1/sandboxes", b"{not json", 400),
    ("POST", "/v1/sandboxes", b"[1, 2]", 400),
    ("POST", "/v1/sandboxes", b'{"spec": {"image": ""}}', 400),
    ("POST", "/v1/sandboxes", b'{"spec": {"resources": {"cpus": -1}}}', 400),
    ("POST", "/v1/sandboxes", b'{"spec": {"resources": 7}}', 400),
    ("POST", "/v1/sandboxes", b'{"spec": {}, "owner": 5}', 400),
    ("POST", "/v1/sandboxes", b'{"spec": {}, "timeout_s": "soon"}', 400),
    ("POST", "/v1/sandboxes", b"\xff\xfe\x00", 400),
    ("GET", "/v1/nothing-here", b"", 404),
    ("PATCH", "/v1/sandboxes", b"", 405),
    ("POST", "/v1/sandboxes/x/ports/99999", b"", 400),
    ("POST", "/v1/sandboxes/x/ports/http", b"", 400),
    ("PUT", "/v1/clients/c", b'{"wishes": [{"count": -1}]}', 400),
    ("PUT", "/v1/clients/c", b'{"images": "abc"}', 400),
    ("POST", "/v1/prefetch", b'{"image": 3}', 400),
    ("DELETE", "/v1/sandboxes", b"", 400),
])
async def test_malformed_requests_are_4xx(server: Server, remote: RemoteBackend, token: str,
                                          method: str, path: str, body: bytes,
                                          expected: int) -> None:
    answer = await raw(server, request(method, path, token, body,
                                       "Content-Type: application/json\r\n"))
    assert status(answer) == expected, answer[:300]
    assert error_of(answer)["message"]
    assert server.registry.held == {}
    await assert_still_serving(server, remote)


async def test_malformed_exec_requests_are_4xx(server: Server, remote: RemoteBackend,
                                               token: str) -> None:
    async with await remote.create(SPEC) as sandbox:
        good = protocol.request_to_json(sandbox.request(["true"]))
        bad = [{}, {**good, "argv": []}, {**good, "argv": "true"}, {**good, "argv": ["a\0b"]},
               {**good, "cwd": "relative"}, {**good, "env": {"A=B": "c"}},
               {**good, "env": {"A": 1}}, {**good, "timeout_s": 0},
               {**good, "timeout_s": True}, {**good, "output_limit": -5},
               {**good, "stdin": "not base64!"}, {**good, "stdin": 12}]
        for body in bad:
            answer = await raw(server, request(
                "POST", f"/v1/sandboxes/{sandbox.id}/exec", token, json.dumps(body).encode()))
            assert status(answer) == 400, (body, answer[:300])
        for query in ("", "?path=", "?path=/tmp/x&mode=99", "?path=/tmp/x&mode=77777"):
            answer = await raw(server, request(
                "PUT", f"/v1/sandboxes/{sandbox.id}/files{query}", token, b"data"))
            assert status(answer) in (400, 409), (query, answer[:300])
        assert (await sandbox.exec(["true"])).ok


async def test_an_oversized_json_body_is_413(server: Server, remote: RemoteBackend,
                                             token: str) -> None:
    body = b'{"spec": "' + b"x" * (65 << 20) + b'"}'
    answer = await raw(server, request("POST", "/v1/sandboxes", token, body))
    assert status(answer) == 413
    await assert_still_serving(server, remote)


async def test_an_oversized_head_is_refused(server: Server, remote: RemoteBackend) -> None:
    answer = await raw(server, b"GET /v1/health HTTP/1.1\r\nX: " + b"a" * 200_000 + b"\r\n\r\n")
    assert status(answer) in (0, 400, 431)
    await assert_still_serving(server, remote)


async def test_a_bad_stream_start_is_an_error_message(remote: RemoteBackend) -> None:
    from rollbox_remote.websocket import TEXT, WebSocket

    async with await remote.create(SPEC) as sandbox:
        for first in ({"type": "begin"}, {"type": "start", "request": {"argv": []}}):
            ws = await WebSocket.connect(remote.http, f"/v1/sandboxes/{sandbox.id}/stream")
            await ws.send_json(first)
            kind, payload = await ws.receive()
            assert kind == TEXT
            message = json.loads(payload)
            assert message["type"] == "error" and message["error"]["type"] == "UsageError"
            await ws.close()
        ws = await WebSocket.connect(remote.http, f"/v1/sandboxes/{sandbox.id}/stream")
        await ws.send_bytes(b"\x00garbage before start")
        message = json.loads((await ws.receive())[1])
        assert message["type"] == "error"
        await ws.close()
        assert (await sandbox.exec(["true"])).ok


async def test_a_stream_message_over_the_cap_ends_that_stream_only(
        server: Server, remote: RemoteBackend) -> None:
    """One WebSocket message of stdin up to ``MAX_MESSAGE`` (8 MiB) reaches the command;
    one byte more and the server closes that stream (1009, message too big). The
    command runs on to its timeout, the sandbox and the server stay usable."""
    from rollbox import ExecRequest
    from rollbox.errors import ServerUnavailableError
    from rollbox_remote.websocket import BINARY, WebSocket, WebSocketClosed
    from rollbox_serve.streams import MAX_MESSAGE

    async def stream(sandbox_id: str, argv: tuple[str, ...], timeout_s: float) -> WebSocket:
        ws = await WebSocket.connect(remote.http, f"/v1/sandboxes/{sandbox_id}/stream")
        request = ExecRequest(argv=argv, cwd="/", env={}, stdin=None, timeout_s=timeout_s,
                              output_limit=1 << 20)
        await ws.send_json({"type": "start", "request": protocol.request_to_json(request)})
        assert json.loads((await ws.receive())[1]) == {"type": "started"}
        return ws

    async with await remote.create(SPEC) as sandbox:
        ws = await stream(sandbox.id, ("wc", "-c"), 30)
        await ws._send(BINARY, bytes([protocol.STDIN]) + b"x" * (MAX_MESSAGE - 1))
        await ws.send_json({"type": "close_stdin"})
        kind, out = await ws.receive()
        counted = str(MAX_MESSAGE - 1).encode()
        assert (kind, out.strip()) == (BINARY, bytes([protocol.STDOUT]) + counted)
        assert json.loads((await ws.receive())[1]) == {"type": "exit", "exit_code": 0}
        await ws.close()

        ws = await stream(sandbox.id, ("cat",), 2)
        try:  # the server reads the frame's length, says 1009 and hangs up mid-send
            await ws._send(BINARY, bytes([protocol.STDIN]) + b"x" * MAX_MESSAGE)
            while True:
                await ws.receive()
        except WebSocketClosed as closed:
            assert closed.code == 1009
        except ServerUnavailableError as broke:
            assert "reset" in str(broke) or "broke" in str(broke)
        assert (await sandbox.exec(["echo", "usable"])).stdout == b"usable\n"
    await assert_still_serving(server, remote)


def _mutations(rng: random.Random, valid: dict[str, object]) -> object:
    """A JSON value near ``valid``: a field dropped, retyped, or set to junk."""
    junk: list[object] = [None, True, -1, 0, 1e308, "", "\x00", "x" * 5000, [], {}, [1, "a"],
                          {"a": {"b": {}}}, "../../etc/passwd", 2**70]
    choice = rng.random()
    if choice < 0.1:
        return rng.choice(junk)
    out = dict(valid)
    key = rng.choice([*list(out), "extra"])
    if choice < 0.3:
        out.pop(key, None)
    else:
        out[key] = rng.choice(junk)
    return out


async def test_fuzz_the_api_for_a_few_seconds(server: Server, remote: RemoteBackend,
                                              token: str) -> None:
    """Random bytes, random heads and near-valid JSON on every route, for 6 seconds:
    no answer outside 2xx/4xx (a 5xx would be a server bug), and the server serves on."""
    rng = random.Random(1234)
    sandbox = await remote.create(SPEC)
    sid = sandbox.id
    routes = [("POST", "/v1/sandboxes"), ("POST", f"/v1/sandboxes/{sid}/exec"),
              ("PUT", f"/v1/sandboxes/{sid}/files?path=/tmp/f"), ("POST", "/v1/prefetch"),
              ("PUT", "/v1/clients/fuzz"), ("POST", f"/v1/sandboxes/{sid}/ports/80"),
              ("POST", "/v1/snapshots/x/fork"), ("GET", f"/v1/sandboxes/{sid}/files?path=%00"),
              ("POST", f"/v1/sandboxes/{sid}/reset"), ("GET", "/v1/sandboxes?owner=%ff")]
    valid: dict[str, dict[str, object]] = {
        "/v1/sandboxes": {"spec": protocol.spec_to_json(SPEC), "owner": "fuzz"},
        f"/v1/sandboxes/{sid}/exec": protocol.request_to_json(sandbox.request(["true"])),
        "/v1/prefetch": {"image": "host"},
        "/v1/clients/fuzz": {"owner": "fuzz", "images": [], "wishes": []},
    }
    answers: dict[int, int] = {}
    deadline = time.monotonic() + 6.0
    while time.monotonic() < deadline:
        kind = rng.random()
        timeout = 30.0
        if kind < 0.2:
            data, timeout = rng.randbytes(rng.randint(1, 3000)), 0.2  # may wait for more
        elif kind < 0.35:
            head = rng.choice([b"GET", b"POST", b"\x00\x01", b"PUT /v1/sandboxes HTTP/9.9"])
            data = head + b" " + rng.randbytes(rng.randint(0, 200)) + b"\r\n\r\n"
            timeout = 0.5
        else:
            method, path = rng.choice(routes)
            bare = path.split("?")[0]
            body = json.dumps(_mutations(rng, valid.get(bare, {}))).encode()
            if rng.random() < 0.1:
                body = body[: rng.randint(0, len(body))]
            data = request(method, path, token if rng.random() < 0.9 else "bad", body)
        code = status(await raw(server, data, read_timeout=timeout))
        answers[code] = answers.get(code, 0) + 1
        assert code < 500, f"the server failed on {data[:300]!r}"
    assert sum(answers.values()) > 20
    created = [h for h in server.registry.held.values() if h.id != sid]
    assert len(created) == answers.get(201, 0), "a sandbox was made by a refused request"
    for held in created:
        await server.release(held)
    assert (await sandbox.exec(["true"])).ok
    await sandbox.close()
    await assert_still_serving(server, remote)
