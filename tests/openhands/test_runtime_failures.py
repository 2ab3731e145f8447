"""A handed-out runtime whose agent-server dies is reported failed, with whose doing it
was: the rollout's own commands (``workload``, not retryable) or a lost sandbox
(``infra``, retryable). A stand-in agent-server (a few lines of Python that answer
``/health`` and run ``/run?c=COMMAND`` as the agent's terminal tool would) in real local
sandboxes keeps this fast; the run with OpenHands' own client and agent-server is in
adapters/openhands/tests/test_sdk.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from rollbox.pool import Pool
from rollbox_local import LocalBackend
from rollbox_openhands.agent_servers import CHECK_INTERVAL_S, AgentServers
from rollbox_openhands.runtime_api import RuntimeAPI, StartRequest
from rollbox_openhands.server import WarmTargets, agent_servers_on

KEY = {"X-API-Key": "k"}
STAND_IN = """
import http.server, subprocess, sys, urllib.parse
port = int(sys.argv[sys.argv.index("--port") + 1])
class Answer(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
        if "c" in query:
            subprocess.run(query["c"][0], shell=True)
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
http.server.HTTPServer(("127.0.0.1", port), Answer).serve_forever()
"""
START = StartRequest(image="host", command=("python3", "-c", STAND_IN, "--port", "8000"),
                     working_dir="/tmp")


@pytest.fixture
async def backend(searchable_dir: Path) -> AsyncIterator[LocalBackend]:
    backend = LocalBackend(state_dir=searchable_dir)
    try:
        yield backend
    finally:
        await backend.aclose()


@pytest.fixture
async def servers(backend: LocalBackend) -> AsyncIterator[AgentServers]:
    async with (Pool(backend, policy=WarmTargets()) as pool,
                agent_servers_on(pool, warm=0, boot_timeout=60, memory_mb=512) as servers):
        yield servers


async def _start(api: RuntimeAPI, servers: AgentServers) -> dict[str, Any]:
    runtime = await servers.wait(await servers.start(START))
    assert (runtime.status, runtime.pod_status) == ("running", "ready"), runtime.error
    return await _read(api, runtime.session_id)


async def _read(api: RuntimeAPI, session_id: str) -> dict[str, Any]:
    await asyncio.sleep(CHECK_INTERVAL_S)  # each read is checked afresh
    reply = await api.handle("GET", f"/sessions/{session_id}", [], KEY, b"")
    assert reply.status == 200, reply.body
    body: dict[str, Any] = reply.body
    return body


async def _run_in(runtime: dict[str, Any], command: str) -> None:
    """``command`` run by the agent-server, as its terminal tool runs the agent's."""
    async with aiohttp.ClientSession() as http:
        # The agent-server may die before it answers: that is the point.
        try:
            async with http.get(f"{runtime['url']}/run", params={"c": command},
                                timeout=aiohttp.ClientTimeout(total=60)) as reply:
                await reply.read()
        except aiohttp.ClientError:
            pass


async def _failures(api: RuntimeAPI) -> Any:
    return (await api.handle("GET", "/rollbox/failures", [], KEY, b"")).body


async def test_a_live_agent_server_reads_running(servers: AgentServers) -> None:
    api = RuntimeAPI(servers, "k")
    runtime = await _start(api, servers)
    await _run_in(runtime, "true")
    after = await _read(api, runtime["session_id"])
    assert (after["status"], after["pod_status"]) == ("running", "ready")
    assert "rollbox_failure" not in after
    assert await _failures(api) == {"workload": 0, "infra": 0}


async def test_an_agent_server_the_rollout_killed_is_its_outcome(
        servers: AgentServers, backend: LocalBackend) -> None:
    api = RuntimeAPI(servers, "k")
    runtime = await _start(api, servers)
    await _run_in(runtime, "kill -9 $PPID")
    after = await _read(api, runtime["session_id"])
    assert (after["status"], after["pod_status"]) == ("error", "failed"), after
    assert after["rollbox_failure"] == {"kind": "workload", "cause": "agent-server",
                                        "retryable": False}
    assert "outcome" in after["error"]
    assert await _failures(api) == {"workload": 1, "infra": 0}
    # /stop gives the sandbox back broken: it is closed, not reset for another /start.
    stopped = await api.handle("POST", "/stop", [], KEY,
                               json.dumps({"runtime_id": runtime["runtime_id"]}).encode())
    assert stopped.status == 200
    for _ in range(200):
        if runtime["sandbox_id"] not in backend._sandboxes:
            break
        await asyncio.sleep(0.05)
    assert runtime["sandbox_id"] not in backend._sandboxes


async def test_a_sandbox_lost_under_its_agent_server_is_infra(
        servers: AgentServers, backend: LocalBackend) -> None:
    api = RuntimeAPI(servers, "k")
    runtime = await _start(api, servers)
    current = backend._sandboxes[runtime["sandbox_id"]]._current
    assert current is not None
    current.signal_kill()  # as a host crash or an eviction would
    await asyncio.wait(current.exits)
    after = await _read(api, runtime["session_id"])
    assert (after["status"], after["pod_status"]) == ("error", "failed"), after
    assert after["rollbox_failure"] == {"kind": "infra", "cause": "sandbox_lost",
                                        "retryable": True}
    assert await _failures(api) == {"workload": 0, "infra": 1}
