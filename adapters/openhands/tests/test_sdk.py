"""The OpenHands SDK (1.58) running conversations on rollbox: over the SDK's own
APIRemoteWorkspace pointed at `rollbox serve --face openhands` and at `rollbox
openhands serve`, and over RollboxWorkspace.

The scripted LLM makes the agent call the terminal tool with a command that names the
sandbox it runs in (rollbox writes its id into the sandbox at hand-out) and leaves a
file; the test checks the name against the sandbox rollbox reports, checks the host has
no such file, and waits for `finished`.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import httpx
import pytest
from openhands.sdk import LLM, Agent, Conversation, Tool
from openhands.sdk.conversation.state import ConversationExecutionStatus
from openhands.tools.terminal import TerminalTool  # registers the tool client-side
from openhands.workspace import APIRemoteWorkspace
from pydantic import SecretStr
from rollbox_openhands.testing.scripted_llm import ScriptedLLM

pytestmark = pytest.mark.slow


def _agent(llm: ScriptedLLM) -> Agent:
    model = LLM(model="openai/scripted", base_url=llm.base_url, api_key=SecretStr("none"),
                usage_id="agent", num_retries=0)
    return Agent(llm=model, tools=[Tool(name=TerminalTool.name)])


def _proof_command(proof: str) -> str:
    return (f'echo "sandbox=$(cat /tmp/rollbox-openhands/sandbox-id) host=$(hostname)"; '
            f'touch {proof}; ls {proof}')


def _run(workspace: object, llm: ScriptedLLM) -> ConversationExecutionStatus:
    conversation = Conversation(agent=_agent(llm), workspace=workspace)
    try:
        conversation.send_message("Run the command, then finish.")
        conversation.run()
        return conversation.state.execution_status
    finally:
        conversation.close()


def _check_ran_in(sandbox_id: str, proof: str, llm: ScriptedLLM) -> None:
    results = llm.tool_results()
    assert results, "the agent sent no tool result back to the LLM"
    assert f"sandbox={sandbox_id} host=rollbox" in results[0], results
    assert proof in results[0]  # `ls` found it inside the sandbox ...
    assert not Path(proof).exists()  # ... and the host has no such file


def test_api_remote_workspace_runs_in_a_rollbox_sandbox(sdk_image: str, runtime_api,
                                                        llm: ScriptedLLM) -> None:
    image = sdk_image
    proof = f"/tmp/rollbox-proof-{uuid.uuid4().hex}"
    llm.command = _proof_command(proof)
    workspace = APIRemoteWorkspace(
        runtime_api_url=runtime_api.url, runtime_api_key=runtime_api.api_key,
        server_image=image, target_type="binary", init_timeout=300,
        startup_wait_timeout=300)
    with workspace:
        runtime = httpx.get(f"{runtime_api.url}/sessions/{workspace.session_id}",
                            headers={"X-API-Key": runtime_api.api_key}).json()
        assert runtime["status"] == "running" and runtime["pod_status"] == "ready"
        status = _run(workspace, llm)
    assert status == ConversationExecutionStatus.FINISHED
    _check_ran_in(runtime["sandbox_id"], proof, llm)
    # /stop gave the sandbox back: the runtime is gone.
    gone = httpx.get(f"{runtime_api.url}/sessions/{workspace.session_id}",
                     headers={"X-API-Key": runtime_api.api_key})
    assert gone.status_code == 404
    # Later /starts of the kind are handed running agent-servers, in sandboxes reset in
    # place between them (a few sandboxes serve every start).
    headers = {"X-API-Key": runtime_api.api_key}
    sandboxes = []
    for cycle in range(3):
        # The first time, the one warmed after the cold boot; then that one and the
        # sandbox given back, reset, with its next agent-server booted.
        _wait_warm(runtime_api, 1 if cycle == 0 else 2)
        runtime = httpx.post(f"{runtime_api.url}/start", headers=headers, timeout=60, json={
            "image": image, "command": "/usr/local/bin/openhands-agent-server --port 60000",
            "working_dir": "/", "environment": {}}).json()
        assert (runtime["status"], runtime["pod_status"]) == ("running", "ready"), runtime
        assert httpx.get(f"{runtime['url']}/health", timeout=10).status_code == 200
        sandboxes.append(runtime["sandbox_id"])
        assert httpx.post(f"{runtime_api.url}/stop", headers=headers, timeout=60,
                          json={"runtime_id": runtime["runtime_id"]}).status_code == 200
    assert len(set(sandboxes)) < len(sandboxes), sandboxes
    # The Runtime API's key is OpenHands' alone: it opens nothing else of the server ...
    other = httpx.get(f"{runtime_api.server_url}/v1/sandboxes",
                      headers={"Authorization": f"Bearer {runtime_api.api_key}"})
    assert other.status_code == 401
    # ... whose own API (the remote backend's) serves beside it, on the same pool.
    health = httpx.get(f"{runtime_api.server_url}/v1/health",
                       headers={"Authorization": f"Bearer {runtime_api.token}"})
    assert health.status_code == 200, health.text


def _probe(workspace: APIRemoteWorkspace, url: str) -> str:
    """What a connection from inside ``workspace``'s sandbox to ``url``'s port gives."""
    port = url.rsplit(":", 1)[1].split("/")[0]
    return workspace.execute_command(
        "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", "
        f"{port}), timeout=3)' 2>&1 | tail -1").stdout


def _wait_warm(api, count: int) -> None:
    deadline = time.monotonic() + 600
    while httpx.get(f"{api.url}/rollbox/warm", headers={"X-API-Key": api.api_key}
                    ).json()["ready"] < count:
        assert time.monotonic() < deadline, "the agent-servers were not warmed in 600 s"
        time.sleep(0.5)


def test_source_target_warm_starts_and_fresh_keys(sdk_image: str, openhands_serve) -> None:
    """`rollbox openhands serve --warm 2` and the SDK's "source" command: /starts of a
    kind seen before are handed booted agent-servers; each conversation has a key of its
    own that no other agent-server takes; an agent in one sandbox reaches neither the
    host's loopback (the Runtime API) nor another conversation's agent-server."""
    api = openhands_serve
    headers = {"X-API-Key": api.api_key}

    def workspace() -> APIRemoteWorkspace:
        return APIRemoteWorkspace(runtime_api_url=api.url, runtime_api_key=api.api_key,
                                  server_image=sdk_image, target_type="source",
                                  init_timeout=300, startup_wait_timeout=300)

    def record(ws: APIRemoteWorkspace) -> tuple[str, str, str]:
        result = ws.execute_command("cat /tmp/rollbox-openhands/sandbox-id; pwd")
        assert result.exit_code == 0, result.stderr
        runtime = httpx.get(f"{api.url}/sessions/{ws.session_id}", headers=headers).json()
        assert result.stdout.split()[0] == runtime["sandbox_id"]
        return runtime["sandbox_id"], ws.host, str(ws.api_key)

    with workspace() as cold:  # the first of its kind boots cold, then the kind is warmed
        seen = [record(cold)]
    _wait_warm(api, 2)
    with workspace() as first, workspace() as second:
        seen += [record(first), record(second)]
        # No network: the host's loopback and the other agent-server are out of reach.
        assert "Connection refused" in _probe(first, api.url)
        assert "Connection refused" in _probe(first, second.host)
        # Each agent-server answers its own key only.
        for ws, other in ((first, second), (second, first)):
            search = f"{ws.host}/api/conversations/search"
            assert httpx.get(search, timeout=30).status_code == 401
            assert httpx.get(search, timeout=30, headers={
                "X-Session-API-Key": str(other.api_key)}).status_code == 401
            assert httpx.get(search, timeout=30, headers={
                "X-Session-API-Key": str(ws.api_key)}).status_code == 200
    # A stopped conversation leaves nothing that answers: not its URL, nor its key on
    # the agent-servers booted after it (its sandbox's, after the reset, included).
    _wait_warm(api, 2)
    with workspace() as later:
        seen.append(record(later))
        for _, url, key in seen[:-1]:
            with pytest.raises(httpx.TransportError):
                httpx.get(f"{url}/health", timeout=10)
            assert httpx.get(f"{later.host}/api/conversations/search", timeout=30,
                             headers={"X-Session-API-Key": key}).status_code == 401
    keys = [key for _, _, key in seen]
    assert len(set(keys)) == len(keys), "a session key was handed out twice"
    # The rollout ends its own agent-server: its runtime reads failed, by its own doing
    # (not retryable), and /stop closes that sandbox rather than reset it for another.
    with workspace() as doomed:
        try:  # the agent-server dies under the SDK's request: it raises, or says -1
            ended = doomed.execute_command(
                "kill -9 $(cut -d' ' -f2 /tmp/rollbox-openhands/boot)")
            assert ended.exit_code == -1, ended
        except httpx.TransportError:
            pass
        runtime = _read_until_failed(api, doomed.session_id)
        assert runtime["rollbox_failure"] == {"kind": "workload", "cause": "agent-server",
                                              "retryable": False}
    assert httpx.get(f"{api.url}/rollbox/failures", headers=headers).json() == {
        "workload": 1, "infra": 0}
    assert httpx.get(f"{api.url}/list", headers=headers).json() == {"runtimes": []}


def _read_until_failed(api, session_id: str) -> dict:
    deadline = time.monotonic() + 30
    while True:
        runtime = httpx.get(f"{api.url}/sessions/{session_id}",
                            headers={"X-API-Key": api.api_key}).json()
        if runtime["status"] != "running" or time.monotonic() > deadline:
            assert (runtime["status"], runtime["pod_status"]) == ("error", "failed"), runtime
            return runtime
        time.sleep(0.5)


def test_rollbox_workspace_runs_in_a_rollbox_sandbox(sdk_image: str,
                                                     llm: ScriptedLLM) -> None:
    from rollbox_openhands.engine import shutdown
    from rollbox_openhands.workspace import RollboxWorkspace

    image = sdk_image
    proof = f"/tmp/rollbox-proof-{uuid.uuid4().hex}"
    llm.command = _proof_command(proof)
    try:
        with RollboxWorkspace(image=image, forward=[llm.port]) as workspace:
            sandbox_id = workspace.sandbox_id
            assert sandbox_id
            status = _run(workspace, llm)
        assert status == ConversationExecutionStatus.FINISHED
        _check_ran_in(sandbox_id, proof, llm)
    finally:
        shutdown()
