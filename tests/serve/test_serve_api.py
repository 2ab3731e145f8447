"""The server's behaviour through the remote backend: sharing, handles, tokens, errors,
the idle TTL, warm targets and metrics. The server runs in the test's event loop over
a real local backend."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from rollbox import Pool, SandboxSpec, StaticPoolPolicy
from rollbox.errors import (
    AuthenticationError,
    CommandNotFoundError,
    ExecTimeoutError,
    ImageNotFoundError,
    InvalidSpecError,
    SandboxFileNotFoundError,
    SandboxLostError,
    SandboxNotFoundError,
    ServerUnavailableError,
    UsageError,
)
from rollbox_remote import RemoteBackend
from rollbox_serve import Server
from serve_support import connect, raw, request, status

SPEC = SandboxSpec(image="host")


async def test_a_closed_sandbox_goes_back_to_the_pool_and_comes_out_clean(
    server: Server, remote: RemoteBackend
) -> None:
    first = await remote.create(SPEC)
    await first.write_file("/tmp/mine.txt", b"first client's")
    await first.close()
    assert server.pool.idle_count(SPEC) == 1
    creations = server.metrics.counters["creations"]
    second = await remote.create(SPEC)
    try:
        assert server.metrics.counters["creations"] == creations, "not taken from the pool"
        assert second.id != first.id, "a reused sandbox must get a new handle"
        with pytest.raises(SandboxFileNotFoundError):
            await second.read_file("/tmp/mine.txt")
        with pytest.raises(SandboxNotFoundError):
            await (await remote.attach(first.id)).exec(["true"])
    finally:
        await second.close()


async def test_attach_from_another_client(server: Server, remote: RemoteBackend,
                                          token: str) -> None:
    other = await connect(server, token, owner="other-process")
    try:
        sandbox = await remote.create(SPEC)
        await sandbox.write_file("/tmp/handoff.txt", b"from the creator")
        attached = await other.attach(sandbox.id)
        assert attached.spec == SPEC
        assert await attached.read_file("/tmp/handoff.txt") == b"from the creator"
        assert (await attached.exec("cat /tmp/handoff.txt")).stdout == b"from the creator"
        await other.aclose()  # the attaching client leaves: the sandbox is not its own
        assert (await sandbox.exec(["true"])).ok
        listed = await remote.call("GET", "/sandboxes")
        assert [(s["id"], s["owner"]) for s in listed] == [(sandbox.id, remote.owner)]
        await attached.close()  # closing an attached handle closes the sandbox
        with pytest.raises(SandboxLostError):
            await sandbox.exec(["true"])
        await sandbox.close()
    finally:
        await other.aclose()


async def test_detach_leaves_the_sandbox_and_closes_its_endpoints_here(
    server: Server, remote: RemoteBackend, token: str
) -> None:
    other = await connect(server, token, owner="other-process")
    sandbox = await remote.create(SPEC)
    try:
        await sandbox.exec("python3 -m http.server 8000 --bind 127.0.0.1 >/dev/null 2>&1 &")
        attached = await other.attach(sandbox.id)
        endpoint = await attached.endpoint(8000)
        _, writer = await asyncio.open_connection(endpoint.host, endpoint.port)
        writer.close()
        await attached.detach()
        with pytest.raises(OSError):  # the relay in this process is gone
            await asyncio.open_connection(endpoint.host, endpoint.port)
        with pytest.raises(SandboxLostError):  # and the handle with it
            await attached.exec(["true"])
        assert (await sandbox.exec(["true"])).ok  # the sandbox is its creator's still
        assert await other.leftovers() == []
    finally:
        await sandbox.close()
        await other.aclose()


async def test_unknown_handles_are_typed_not_found(remote: RemoteBackend) -> None:
    with pytest.raises(SandboxNotFoundError) as caught:
        await remote.attach("rbx-0123456789abcdef0123456789abcdef")
    assert caught.value.retryable
    assert isinstance(caught.value, SandboxLostError)
    with pytest.raises(SandboxNotFoundError):
        await remote.call("POST", "/sandboxes/no-such-id/exec",
                          json_body={"argv": ["true"]})
    with pytest.raises(SandboxNotFoundError):
        await remote.call("POST", "/snapshots/rbs-nothing/fork", json_body={"owner": "x"})


async def test_errors_keep_their_type_fields_and_retryable(remote: RemoteBackend) -> None:
    async with await remote.create(SPEC) as sandbox:
        with pytest.raises(ExecTimeoutError) as timeout:
            await sandbox.exec("echo before; sleep 30", timeout=0.5)
        assert timeout.value.stdout == b"before\n"
        assert timeout.value.timeout_s == 0.5
        assert timeout.value.sandbox_id == sandbox.id
        assert not timeout.value.retryable
        with pytest.raises(CommandNotFoundError):
            await sandbox.exec(["/no/such/program"])
        with pytest.raises(SandboxFileNotFoundError) as missing:
            await sandbox.read_file("/no/such/file")
        assert isinstance(missing.value, FileNotFoundError)
        assert (await sandbox.exec(["true"])).ok, "sound after those errors"
    with pytest.raises(ImageNotFoundError) as image:
        await remote.create(SPEC.replace(image="rollbox.invalid/nothing:here"))
    assert not image.value.retryable


async def test_wrong_or_missing_token_is_refused_and_creates_nothing(
    server: Server, token: str
) -> None:
    with pytest.raises(AuthenticationError):
        await connect(server, "not-the-token")
    remote = await connect(server, token)
    try:
        remote.http.token = "not-the-token"
        with pytest.raises(AuthenticationError):
            await remote.create(SPEC)
        remote.http.token = ""
        with pytest.raises(AuthenticationError):
            await remote.create(SPEC)
    finally:
        await remote.aclose()
    assert server.registry.held == {}
    assert server.metrics.counters["creations"] == 0
    assert await server.backend.leftovers() == []


async def test_a_server_that_is_gone_is_a_retryable_error(
    server: Server, remote: RemoteBackend, state_dir: Path
) -> None:
    sandbox = await remote.create(SPEC)
    running = asyncio.ensure_future(sandbox.exec(["sleep", "30"], timeout=60))
    await asyncio.sleep(0.5)
    await server.aclose()
    async with asyncio.timeout(20):
        with pytest.raises((ServerUnavailableError, SandboxLostError)) as caught:
            await running
    assert caught.value.retryable
    async with asyncio.timeout(20):
        with pytest.raises(ServerUnavailableError) as refused:
            await sandbox.exec(["true"])
    assert refused.value.retryable
    with pytest.raises(ServerUnavailableError):
        await asyncio.to_thread(RemoteBackend, f"unix:{state_dir / 'nothing.sock'}", "t" * 20)


async def test_idle_sandboxes_are_reaped_after_the_ttl(state_dir: Path, token: str) -> None:
    from rollbox_local import LocalBackend

    server = Server(LocalBackend(state_dir=state_dir), token=token, idle_ttl_s=0.5)
    await server.start(f"unix:{state_dir / 's.sock'}")
    remote = await connect(server, token)
    try:
        idle = await remote.create(SPEC)
        busy = await remote.create(SPEC)
        running = asyncio.ensure_future(busy.exec(["sleep", "2"], timeout=10))
        await asyncio.sleep(1.5)
        assert idle.id not in server.registry.held, "an idle sandbox outlived its TTL"
        assert busy.id in server.registry.held, "a sandbox running a command was reaped"
        assert (await running).ok
        with pytest.raises(SandboxNotFoundError):
            await idle.exec(["true"])
        assert server.metrics.counters["reaped"] >= 1
    finally:
        await remote.aclose()
        await server.aclose()


async def test_warm_targets_of_every_client_add_up(server: Server, remote: RemoteBackend,
                                                   token: str) -> None:
    other = await connect(server, token)
    try:
        async with Pool(remote, policy=StaticPoolPolicy(size=1)) as mine, Pool(
            other, policy=StaticPoolPolicy(size=2)
        ) as theirs, mine.lease(SPEC) as a, theirs.lease(SPEC) as b:
            assert mine.delegated(SPEC) and theirs.delegated(SPEC)
            await remote.flush()
            await other.flush()
            assert server.policy.warm_target(SPEC) == 3
            await server.settled()
            assert server.pool.idle_count(SPEC) >= 1
            assert (await a.exec(["true"])).ok and (await b.exec(["true"])).ok
        await remote.flush()
        await other.flush()
        assert server.policy.warm_target(SPEC) == 0
    finally:
        await other.aclose()


async def test_hints_of_every_client_reach_the_backend(server: Server, remote: RemoteBackend,
                                                       token: str) -> None:
    seen: list[list[str]] = []
    server.backend.hint_upcoming = lambda images: seen.append(list(images))  # type: ignore[method-assign,assignment]
    other = await connect(server, token)
    try:
        remote.hint_upcoming(["a", "b"])
        other.hint_upcoming(["x", "a", "y"])
        await remote.flush()
        await other.flush()
        assert seen[-1] == ["a", "x", "b", "y"]
    finally:
        await other.aclose()


async def test_large_files_stream_both_ways(remote: RemoteBackend, tmp_path: Path) -> None:
    data = os.urandom(1 << 20) * 24 + b"tail"
    source = tmp_path / "up.bin"
    source.write_bytes(data)
    source.chmod(0o750)
    async with await remote.create(SPEC) as sandbox:
        await sandbox.upload(source, "/tmp/up.bin")
        assert (await sandbox.exec("stat -c %a /tmp/up.bin")).text.strip() == "750"
        await sandbox.download("/tmp/up.bin", tmp_path / "down.bin")
        assert (tmp_path / "down.bin").read_bytes() == data
        assert await sandbox.read_file("/tmp/up.bin") == data
        assert sorted(await asyncio.to_thread(os.listdir, tmp_path)) == ["down.bin", "up.bin"]


async def test_a_failed_download_leaves_no_partial_file(remote: RemoteBackend,
                                                        tmp_path: Path) -> None:
    async with await remote.create(SPEC) as sandbox:
        with pytest.raises(SandboxFileNotFoundError):
            await sandbox.download("/no/such/file", tmp_path / "out.bin")
    assert await asyncio.to_thread(os.listdir, tmp_path) == []


async def test_oversized_files_are_refused(state_dir: Path, token: str) -> None:
    from rollbox_local import LocalBackend

    server = Server(LocalBackend(state_dir=state_dir), token=token, max_file_bytes=1000)
    await server.start(f"unix:{state_dir / 's.sock'}")
    remote = await connect(server, token)
    try:
        async with await remote.create(SPEC) as sandbox:
            with pytest.raises(UsageError, match="larger than this server accepts"):
                await sandbox.write_file("/tmp/big", b"x" * 1001)
            await sandbox.write_file("/tmp/small", b"x" * 1000)
            assert (await sandbox.exec(["true"])).ok
    finally:
        await remote.aclose()
        await server.aclose()


async def test_specs_from_a_newer_client_are_refused_not_trimmed(remote: RemoteBackend) -> None:
    from rollbox_remote import protocol

    spec = protocol.spec_to_json(SPEC)
    with pytest.raises(InvalidSpecError, match="unknown fields"):
        await remote.call("POST", "/sandboxes",
                          json_body={"spec": {**spec, "gpu": 1}, "owner": "x"})
    with pytest.raises(InvalidSpecError):
        await remote.call("POST", "/sandboxes",
                          json_body={"spec": {**spec, "network": "everywhere"}, "owner": "x"})


async def test_snapshots_and_forks_go_through_handles(server: Server,
                                                      remote: RemoteBackend) -> None:
    async with await remote.create(SPEC) as sandbox:
        await sandbox.write_file("/tmp/state", b"snapshotted")
        snapshot = await sandbox.snapshot()
        assert snapshot.id.startswith("rbs-") and snapshot.meta == {}
        async with await remote.fork(snapshot) as child:
            assert await child.read_file("/tmp/state") == b"snapshotted"
        assert server.pool.idle_count(SPEC) == 0, "a fork must never enter the pool"
        await remote.drop_snapshot(snapshot)
        assert server.registry.snapshots == {}


async def test_metrics_are_prometheus_text(server: Server, remote: RemoteBackend) -> None:
    async with await remote.create(SPEC) as sandbox:
        await sandbox.exec(["true"])
        text = (await remote.http.request("GET", "/metrics", timeout=10)).body.decode()
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    values = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in lines}
    assert values["rollbox_serve_sandboxes_held"] == 1
    assert values['rollbox_pool_events_total{event="creations"}'] == 1
    assert values['rollbox_pool_latency_seconds_count{name="ttfc"}'] == 1
    assert any(k.startswith("rollbox_serve_requests_total{") and "exec" in k for k in values)
    for line in text.splitlines():
        if line.startswith("# TYPE"):
            assert line.split()[3] in ("gauge", "counter", "summary")


async def test_closing_every_sandbox_of_an_owner(server: Server, remote: RemoteBackend) -> None:
    await asyncio.gather(remote.create(SPEC), remote.create(SPEC))
    answer = await remote.call("DELETE", f"/sandboxes?owner={remote.owner}")
    assert answer == {"closed": 2}
    assert server.registry.held == {}


async def test_another_face_mounts_beside_the_protocol(state_dir: Path, token: str) -> None:
    from aiohttp import web
    from rollbox.hookspecs import hookimpl
    from rollbox.plugins import get_plugin_manager, serve_faces
    from rollbox_local import LocalBackend

    def attach(server: Server) -> None:
        async def hello(request: web.Request) -> web.Response:
            if not server.authorized(request.headers.get("X-API-Key")):
                return web.Response(status=401)
            return web.json_response({"sandboxes": len(server.registry.held)})

        face = web.Application()
        face.router.add_get("/hello", hello)
        server.add_face("/demo", face)

    class DemoPlugin:
        @hookimpl
        def rollbox_register_serve_faces(self, register: object) -> None:
            register("demo", attach)  # type: ignore[operator]

    pm = get_plugin_manager(load_entrypoints=False)
    pm.register(DemoPlugin())
    faces = serve_faces(pm)
    assert list(faces) == ["demo"]
    server = Server(LocalBackend(state_dir=state_dir), token=token)
    faces["demo"](server)
    await server.start(f"unix:{state_dir / 's.sock'}")
    try:
        ok = await raw(server, b"GET /demo/hello HTTP/1.1\r\nHost: x\r\nX-API-Key: " +
                       token.encode() + b"\r\nConnection: close\r\n\r\n")
        assert status(ok) == 200 and b'"sandboxes": 0' in ok
        refused = await raw(server, b"GET /demo/hello HTTP/1.1\r\nHost: x\r\n"
                                    b"Connection: close\r\n\r\n")
        assert status(refused) == 401
        guarded = await raw(server, request("GET", "/v1/health", None,
                                            headers=f"X-API-Key: {token}\r\n"))
        assert status(guarded) == 401
    finally:
        await server.aclose()


async def test_a_sandbox_cannot_reach_the_server_or_its_token(state_dir: Path,
                                                              token: str) -> None:
    """Code in a sandbox is hostile: with the host's network it finds the server's port
    but not the token, and the token file is out of its reach."""
    from rollbox import Network
    from rollbox_local import LocalBackend

    token_file = state_dir / "serve" / "token"
    token_file.parent.mkdir(mode=0o700)
    token_file.write_text(token)
    token_file.chmod(0o600)
    tcp = Server(LocalBackend(state_dir=state_dir / "b"), token=token)
    address = await tcp.start("127.0.0.1:0")
    remote = await connect(tcp, token)
    probe = (
        "import socket, sys\n"
        f"s = socket.create_connection(('127.0.0.1', {address.port}), timeout=5)\n"
        "s.sendall(b'POST /v1/sandboxes HTTP/1.1\\r\\nHost: x\\r\\nContent-Length: 2\\r\\n"
        "Connection: close\\r\\n\\r\\n{}')\n"
        "print(s.recv(100).split()[1].decode())\n"
    )
    try:
        spec = SPEC.replace(network=Network.HOST)
        async with await remote.create(spec) as sandbox:
            await sandbox.write_file("/tmp/probe.py", probe.encode())
            answer = await sandbox.exec(["python3", "/tmp/probe.py"], timeout=30)
            assert answer.text.strip() == "401", answer
            stolen = await sandbox.exec(["cat", str(token_file)], timeout=30)
            assert stolen.exit_code != 0 and token.encode() not in stolen.stdout
        assert [h.owner for h in tcp.registry.held.values()] == []
    finally:
        await remote.aclose()
        await tcp.aclose()


async def test_warm_targets_last_while_the_client_is_heard_from(state_dir: Path,
                                                                token: str) -> None:
    from rollbox_local import LocalBackend

    server = Server(LocalBackend(state_dir=state_dir), token=token, idle_ttl_s=1.0)
    await server.start(f"unix:{state_dir / 's.sock'}")
    remote = await connect(server, token)
    try:
        sandbox = await remote.create(SPEC)
        assert remote.keep_warm(SPEC, 1)
        await remote.flush()
        for _ in range(12):  # 2.4 s of requests, more than the TTL, no new targets
            await sandbox.exec(["true"])
            await asyncio.sleep(0.2)
        assert server.policy.warm_target(SPEC) == 1, "forgot a client it kept hearing from"
        await asyncio.sleep(2.0)
        assert server.policy.warm_target(SPEC) == 0, "kept a silent client's targets"
    finally:
        await remote.aclose()
        await server.aclose()
