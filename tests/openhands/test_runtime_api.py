"""The Runtime API's parsing, auth and routing (the end-to-end runs are in
test_openhands_env.py); ``Listed`` records what the API asked of the runtimes."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest
from rollbox_openhands.agent_servers import command_port, without_listen_options
from rollbox_openhands.runtime_api import (
    Runtime,
    RuntimeAPI,
    StartRequest,
    StartRequestError,
)

KEY = {"X-API-Key": "k"}


class Listed:
    def __init__(self) -> None:
        self.runtimes: dict[str, Runtime] = {}
        self.calls: list[str] = []

    async def start(self, request: StartRequest) -> Runtime:
        runtime = Runtime(f"rt-{len(self.runtimes)}", request.session_id or "s", request.image,
                          "http://127.0.0.1:1", "key")
        self.runtimes[runtime.runtime_id] = runtime
        return runtime

    def by_session(self, session_id: str) -> Runtime | None:
        return next((r for r in self.runtimes.values() if r.session_id == session_id), None)

    def by_runtime_id(self, runtime_id: str) -> Runtime | None:
        return self.runtimes.get(runtime_id)

    def live(self) -> Sequence[Runtime]:
        return list(self.runtimes.values())

    async def check(self, runtimes: Sequence[Runtime]) -> None:
        self.calls.append("check " + " ".join(r.runtime_id for r in runtimes))

    def warm_ready(self) -> int:
        return 2

    def failure_counts(self) -> dict[str, int]:
        return {"workload": 1}

    async def pause(self, runtime: Runtime) -> None:
        self.calls.append(f"pause {runtime.runtime_id}")

    async def resume(self, runtime: Runtime) -> None:
        self.calls.append(f"resume {runtime.runtime_id}")

    async def stop(self, runtime: Runtime) -> None:
        self.calls.append(f"stop {runtime.runtime_id}")
        del self.runtimes[runtime.runtime_id]


def test_start_takes_the_app_servers_list_and_the_sdks_string() -> None:
    app = StartRequest.from_json({
        "image": "img", "command": ["/usr/local/bin/openhands-agent-server", "--port", "60000"],
        "working_dir": "/workspace", "environment": {"A": "1"}, "session_id": "abc",
        "resource_factor": 1, "run_as_user": 10001, "fs_group": 10001})
    sdk = StartRequest.from_json({
        "image": "img", "command": "/agent-server/.venv/bin/python -m openhands.agent_server "
        "--port 60000", "working_dir": "/", "runtime_class": "sysbox-runc"})
    assert app.command == ("/usr/local/bin/openhands-agent-server", "--port", "60000")
    assert sdk.command[-2:] == ("--port", "60000") and sdk.working_dir == "/"


@pytest.mark.parametrize("body, words", [
    ([], "JSON object"), ({"command": "x"}, "image"), ({"image": "i"}, "command"),
    ({"image": "i", "command": []}, "empty"), ({"image": "i", "command": "a 'b"}, "shell"),
    ({"image": "i", "command": "x", "working_dir": "rel"}, "absolute"),
    ({"image": "i", "command": "x", "environment": {"A": 1}}, "strings"),
    ({"image": "i", "command": "x", "session_id": "a/b"}, "session_id"),
    ({"image": "i", "command": "x", "resource_factor": 3}, "resource_factor"),
])
def test_bad_start_bodies_are_refused_with_the_reason(body: object, words: str) -> None:
    with pytest.raises(StartRequestError, match=words):
        StartRequest.from_json(body)


def test_rollbox_chooses_where_the_agent_server_listens() -> None:
    command = ["srv", "--port", "60000", "--host=0.0.0.0", "-x"]
    assert without_listen_options(command) == ["srv", "-x"]
    assert command_port(command) == 60000
    assert command_port(["srv", "--port=7000"]) == 7000
    assert command_port(["srv"]) == 8000  # the agent-server's default


async def test_routes_and_auth() -> None:
    runtimes = Listed()
    api = RuntimeAPI(runtimes, "k")
    assert (await api.handle("GET", "/list", [], {}, b"")).status == 401
    assert (await api.handle("GET", "/list", [], {"X-API-Key": "wrong"}, b"")).status == 401
    start = await api.handle("POST", "/start", [], KEY, json.dumps(
        {"image": "img", "command": "srv", "session_id": "s1"}).encode())
    assert start.status == 200 and start.body["session_api_key"] == "key"
    assert {"status", "pod_status", "url", "runtime_id"} <= set(start.body)
    bad = await api.handle("POST", "/start", [], KEY, b"{not json")
    assert bad.status == 400
    got = await api.handle("GET", "/sessions/s1", [], KEY, b"")
    assert got.status == 200 and got.body["runtime_id"] == "rt-0"
    assert (await api.handle("GET", "/sessions/nope", [], KEY, b"")).status == 404
    batch = await api.handle("GET", "/sessions/batch", [("ids", "s1"), ("ids", "x")], KEY, b"")
    assert [r["session_id"] for r in batch.body] == ["s1"]
    for action in ("pause", "resume", "stop"):
        reply = await api.handle("POST", f"/{action}", [], KEY, b'{"runtime_id": "rt-0"}')
        assert reply.status == 200
    # Every read of runtimes checks them first (their agent-servers may have died).
    assert runtimes.calls == ["check rt-0", "check rt-0",
                              "pause rt-0", "resume rt-0", "stop rt-0"]
    assert (await api.handle("POST", "/stop", [], KEY, b'{"runtime_id": "rt-0"}')).status == 404
    assert (await api.handle("POST", "/stop", [], KEY, b"{}")).status == 400
    assert (await api.handle("GET", "/list", [], KEY, b"")).body == {"runtimes": []}
    assert (await api.handle("DELETE", "/list", [], KEY, b"")).status == 405
    assert (await api.handle("GET", "/rollbox/warm", [], KEY, b"")).body == {"ready": 2}
    assert (await api.handle("GET", "/rollbox/failures", [], KEY, b"")).body == {
        "workload": 1, "infra": 0}
