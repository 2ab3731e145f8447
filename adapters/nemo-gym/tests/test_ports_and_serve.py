"""NeMo Gym's capabilities that reach past one process's sandbox: ``SupportsSandboxEndpoint``
(rollbox's port exposure) and ``ConnectableProvider`` across processes, through a real
``rollbox serve`` and the ``remote`` backend.

Endpoints are tested with NeMo Gym's own code on both sides: ``harness_exa_search``'s
model relay (its ``agent_runner.ModelRelay`` serving in the sandbox, its
``_pump_model_relay`` on the host) carries a model request out of a sandbox that has no
network, through the endpoint, to a model server on the host.
"""

from __future__ import annotations

import asyncio
import importlib.util
import io
import json
import sys
import tarfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import rollbox_nemo_gym
from aiohttp import web
from nemo_gym.sandbox import AsyncSandbox, SandboxSpec, SandboxStatus, SupportsSandboxEndpoint
from ng_support import RollboxServe, provider_block, shared_pools
from rollbox_nemo_gym import RollboxProvider, SpecNotSupportedError

SERVICE = SandboxSpec(
    workdir="/srv",
    files={"hello.txt": "hello from the sandbox\n"},
    entrypoint=["python3", "-m", "http.server", "8000", "--bind", "127.0.0.1"],
    ports=[8000],
)


@pytest.fixture
def serve(rollbox_home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[RollboxServe]:
    """A real ``rollbox serve``; clients (this process and its children) read its token
    from ROLLBOX_TOKEN_FILE, as a deployment would."""
    server = RollboxServe(rollbox_home).start()
    monkeypatch.setenv("ROLLBOX_TOKEN_FILE", str(server.token_file))
    try:
        yield server
    finally:
        server.stop()


def remote(server: RollboxServe) -> dict[str, Any]:
    """The shipped remote YAML block, pointed at the server: no token in it."""
    return provider_block(rollbox_nemo_gym.CONFIG_REMOTE, keep_warm_s=0,
                          backend_options={"url": server.url})


def config(backend: str, server: RollboxServe | None) -> dict[str, Any]:
    if backend == "remote":
        assert server is not None
        return remote(server)
    return {"rollbox": {"keep_warm_s": 0}}


@pytest.fixture(params=["local", "remote"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def maybe_serve(backend: str, request: pytest.FixtureRequest) -> RollboxServe | None:
    return request.getfixturevalue("serve") if backend == "remote" else None


# -- SupportsSandboxEndpoint -----------------------------------------------------------------


async def test_an_entrypoints_port_answers_through_the_endpoint(
    backend: str, maybe_serve: RollboxServe | None
) -> None:
    provider = RollboxProvider(**config(backend, maybe_serve)["rollbox"])
    assert isinstance(provider, SupportsSandboxEndpoint)
    for round_ in range(2):  # the second session gets the first one's sandbox, reset
        async with AsyncSandbox(provider, SERVICE, owns_provider=False) as sandbox:
            await sandbox.start()
            endpoint = await sandbox.endpoint(8000)
            assert endpoint.endpoint.startswith("http://127.0.0.1:")
            async with (
                aiohttp.ClientSession(headers=endpoint.headers,
                                      timeout=aiohttp.ClientTimeout(total=60)) as http,
                http.get(f"{endpoint.endpoint}/hello.txt") as answer,
            ):
                assert (answer.status, await answer.text()) == (200, "hello from the sandbox\n")
            with pytest.raises(ValueError, match="not declared"):
                await sandbox.endpoint(9000)
            if round_ == 0:  # the next session's service starts afresh after the reset
                await sandbox.exec("pkill -STOP -f http.server")
    if backend == "local":
        (shared,) = shared_pools()
        assert shared.pool.metrics.counters["creations"] == 1
    await provider.aclose()


async def test_a_backend_without_ports_refuses_a_spec_with_ports() -> None:
    # core's in-memory backend, registered as "fake", declares no ports.
    provider = RollboxProvider(backend="fake", keep_warm_s=0)
    with pytest.raises(SpecNotSupportedError, match="cannot expose sandbox ports") as caught:
        await provider.create(SandboxSpec(ports=[8080]))
    assert (caught.value.field, caught.value.backend) == ("SandboxSpec.ports", "fake")
    assert isinstance(caught.value, ValueError)
    await provider.aclose()


AGENT = """
import asyncio, json, socket, sys, urllib.request
sys.path[:0] = ["/opt/relay/lib", "/opt/relay"]
from agent_runner import start_model_relay  # NeMo Gym's in-sandbox model relay

def ask():
    request = urllib.request.Request(
        "http://127.0.0.1:18080/v1/responses", data=b'{"input": "ping"}', method="POST",
        headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as answer:
        return answer.status, json.loads(answer.read())

def reach(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        return "reached"
    except OSError:
        return "unreachable"

async def main():
    relay = await start_model_relay(18080)
    try:
        status, body = await asyncio.to_thread(ask)
    finally:
        await relay.cleanup()
    print(json.dumps({"status": status, "body": body, "model": reach(int(sys.argv[1]))}))

asyncio.run(main())
"""

RELAY_DEPENDENCIES = ("aiohttp", "aiohappyeyeballs", "aiosignal", "frozenlist", "multidict",
                      "propcache", "yarl", "idna", "typing_extensions", "attr", "attrs")
"""What ``agent_runner`` imports (aiohttp), as pure Python: the sandbox's python3 is the
host image's, not this environment's, and takes aiohttp's pure-Python fallbacks."""


def relay_bundle() -> bytes:
    """A tar.gz of NeMo Gym's ``agent_runner.py`` and aiohttp's pure-Python code."""
    from responses_api_agents.harness_exa_search import agent_runner

    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as bundle:
        bundle.add(agent_runner.__file__, arcname="agent_runner.py")
        for name in RELAY_DEPENDENCIES:
            spec = importlib.util.find_spec(name)
            if spec is None or spec.origin is None:
                continue
            origin = Path(spec.origin)
            source = origin.parent if origin.name == "__init__.py" else origin
            bundle.add(source, arcname=f"lib/{source.name}", filter=_pure_python)
    return data.getvalue()


def _pure_python(member: tarfile.TarInfo) -> tarfile.TarInfo | None:
    return None if member.name.endswith(".so") or "__pycache__" in member.name else member


@pytest.fixture
async def model() -> AsyncIterator[str]:
    """A model server on the host's loopback, which the sandbox cannot reach itself."""

    async def respond(request: web.Request) -> web.Response:
        asked = await request.json()
        return web.json_response({"output": "pong", "asked": asked})

    app = web.Application()
    app.router.add_post("/v1/responses", respond)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_nemo_gyms_model_relay_runs_through_the_endpoint(
    backend: str, maybe_serve: RollboxServe | None, model: str, tmp_path: Path
) -> None:
    from responses_api_agents.harness_exa_search.app import _MODEL_RELAY_PORT, _pump_model_relay

    bundle = tmp_path / "relay.tar.gz"
    bundle.write_bytes(relay_bundle())
    (tmp_path / "agent.py").write_text(AGENT)
    spec = SandboxSpec(workdir="/opt/relay", ports=[_MODEL_RELAY_PORT])
    async with AsyncSandbox(config(backend, maybe_serve), spec) as sandbox:
        await sandbox.start()
        await sandbox.upload(bundle, "relay.tar.gz")
        await sandbox.upload(tmp_path / "agent.py", "agent.py")
        unpacked = await sandbox.exec("tar -xzf relay.tar.gz")
        assert unpacked.return_code == 0, unpacked
        # As harness_exa_search runs it: the harness in the sandbox, the pump beside it.
        model_port = model.rsplit(":", 1)[1]
        runner = asyncio.create_task(sandbox.exec(f"python3 agent.py {model_port}", timeout_s=180))
        endpoint = await sandbox.endpoint(_MODEL_RELAY_PORT)
        pump = asyncio.create_task(_pump_model_relay(endpoint, model))
        try:
            result = await runner
        finally:
            pump.cancel()
            await asyncio.gather(pump, return_exceptions=True)
    assert result.return_code == 0, result
    answer = json.loads(result.stdout or "")
    assert answer["status"] == 200
    assert answer["body"] == {"output": "pong", "asked": {"input": "ping"}}
    assert answer["model"] == "unreachable"  # only the relay crossed: no network was given


# -- ConnectableProvider across processes ----------------------------------------------------

BORROWER = """
import asyncio, json, socket, sys, urllib.request
from urllib.parse import urlsplit
from nemo_gym.sandbox import AsyncSandbox, create_provider

async def main():
    settings, descriptor, action = (json.loads(arg) for arg in sys.argv[1:])
    provider = create_provider(settings)  # NeMo Gym's own provider construction
    try:
        sandbox = await AsyncSandbox.connect(descriptor, provider=provider)
    except Exception as exc:
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
        return
    if action == "use":
        seen = await sandbox.exec("cat note.txt; echo from the borrower > reply.txt")
        answer = {"stdout": seen.stdout, "code": seen.return_code}
        if descriptor.get("ports"):  # the creator's service, through an endpoint here
            endpoint = await sandbox.endpoint(descriptor["ports"][0])
            url = endpoint.endpoint + "/note.txt"
            address = urlsplit(endpoint.endpoint)
            served = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=30))
            answer["served"] = served.read().decode()
        await sandbox.disconnect()
        if descriptor.get("ports"):  # what this process opened for it closed with it
            try:
                socket.create_connection((address.hostname, address.port), timeout=5).close()
                answer["after"] = "accepted"
            except ConnectionRefusedError:
                answer["after"] = "refused"
        print(json.dumps(answer))
    else:
        await sandbox.stop()
        print(json.dumps({"stopped": True}))

asyncio.run(main())
"""


async def borrow(settings: dict[str, Any], descriptor: dict[str, Any],
                 action: str) -> dict[str, Any]:
    """Run ``action`` on the sandbox of ``descriptor`` in a process of its own."""
    other = await asyncio.create_subprocess_exec(
        sys.executable, "-c", BORROWER, json.dumps(settings), json.dumps(descriptor),
        json.dumps(action), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(other.communicate(), 180)
    assert other.returncode == 0, err.decode()[-4000:]
    answer: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return answer


async def test_serialize_here_and_connect_in_another_process_through_rollbox_serve(
    serve: RollboxServe,
) -> None:
    settings = remote(serve)
    spec = SandboxSpec(workdir="/work", files={"note.txt": "from the creator\n"}, ports=[8000],
                       entrypoint=["python3", "-m", "http.server", "8000", "--bind", "127.0.0.1",
                                   "--directory", "/work"])
    sandbox = await AsyncSandbox(settings, spec).start()
    descriptor = await sandbox.serialize()
    text = json.dumps(descriptor)
    assert serve.token_file.read_text().strip() not in text
    assert "token" not in text.lower()
    assert descriptor["server"] == serve.url and descriptor["backend"] == "remote"

    used = await borrow(settings, descriptor, "use")
    assert used == {"stdout": "from the creator\n", "code": 0, "served": "from the creator\n",
                    "after": "refused"}
    reply = await sandbox.exec("cat reply.txt")  # the same sandbox: the borrower's file
    assert reply.stdout == "from the borrower\n"

    # A forged descriptor cannot send this process's token elsewhere: connect goes to the
    # server its own settings name, whatever the descriptor's "server" says.
    forged = {**descriptor, "sandbox_id": "not-in-this-process",
              "server": "http://attacker.invalid:9"}
    borrower = RollboxProvider(**settings["rollbox"])
    attached = await AsyncSandbox.connect(forged, provider=borrower)
    assert (await attached.exec("cat reply.txt")).stdout == "from the borrower\n"
    await attached.disconnect()

    assert await borrow(settings, descriptor, "stop") == {"stopped": True}
    gone = await sandbox.exec("true")  # the borrower ended it
    assert (gone.return_code, gone.error_type) == (125, "sandbox")
    await sandbox.stop()
    assert await serve.held() == []  # every sandbox given back

    late = await borrow(settings, descriptor, "use")
    assert late["error"] == "SandboxNotFoundError"
    assert serve.url in late["message"]


async def test_a_local_sandbox_names_what_to_configure_in_another_process() -> None:
    async with AsyncSandbox({"rollbox": {"keep_warm_s": 0}}, SandboxSpec()) as sandbox:
        await sandbox.start()
        descriptor = await sandbox.serialize()
        told = await borrow({"rollbox": {"keep_warm_s": 0}}, descriptor, "use")
    assert told["error"] == "SandboxLostError"
    assert "rollbox serve" in told["message"] and "backend: remote" in told["message"]


async def test_a_remote_sandbox_names_the_server_to_a_local_provider(
    serve: RollboxServe,
) -> None:
    async with AsyncSandbox(remote(serve), SandboxSpec()) as sandbox:
        await sandbox.start()
        descriptor = await sandbox.serialize()
        told = await borrow({"rollbox": {"keep_warm_s": 0}}, descriptor, "use")
    assert told["error"] == "SandboxLostError"
    assert "backend: remote" in told["message"] and serve.url in told["message"]


def test_a_servers_address_is_named_without_credentials() -> None:
    from rollbox_nemo_gym.provider import _without_credentials

    assert _without_credentials("https://user:secret@rollbox.example:8443/x") == (
        "https://rollbox.example:8443/x")
    assert _without_credentials("unix:/run/rollbox/serve.sock") == "unix:/run/rollbox/serve.sock"


async def test_pause_and_resume_through_rollbox_serve(serve: RollboxServe) -> None:
    async with AsyncSandbox(remote(serve), SandboxSpec(workdir="/work")) as sandbox:
        await sandbox.start()
        await sandbox.exec("echo kept > state.txt")
        await sandbox.pause()
        assert await sandbox.status() == SandboxStatus.PAUSED
        await sandbox.resume()
        assert (await sandbox.exec("cat state.txt")).stdout == "kept\n"
    assert await serve.held() == []  # the fork closed, the paused sandbox given back
