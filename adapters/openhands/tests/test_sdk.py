"""The OpenHands SDK (1.58) running conversations on rollbox: over the SDK's own
APIRemoteWorkspace pointed at `rollbox openhands serve`, and over RollboxWorkspace.

The scripted LLM makes the agent call the terminal tool with a command that names the
sandbox it runs in and leaves a file; the test checks the name against the sandbox
rollbox reports, checks the host has no such file, and waits for `finished`.
"""

from __future__ import annotations

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
    return (f'echo "sandbox=$ROLLBOX_SANDBOX_ID host=$(hostname)"; touch {proof}; '
            f'ls {proof}')


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


def test_source_target_and_a_warm_second_start(sdk_image: str, runtime_api) -> None:
    """The SDK's "source" command works too, and a second /start of the same kind is
    handed a booted agent-server (running at once, in a reused sandbox)."""
    image = sdk_image
    headers = {"X-API-Key": runtime_api.api_key}
    sandboxes = []
    for _ in range(2):
        with APIRemoteWorkspace(runtime_api_url=runtime_api.url,
                                runtime_api_key=runtime_api.api_key, server_image=image,
                                target_type="source", init_timeout=300,
                                startup_wait_timeout=300) as workspace:
            result = workspace.execute_command("echo $ROLLBOX_SANDBOX_ID; pwd")
            assert result.exit_code == 0
            sandboxes.append(result.stdout.split()[0])
            # The sandbox has no network: the host's loopback (this Runtime API, say)
            # is out of its reach ...
            port = runtime_api.url.rsplit(":", 1)[1]
            probe = workspace.execute_command(
                "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", "
                f"{port}), timeout=3)' 2>&1 | tail -1")
            assert "Connection refused" in probe.stdout, probe.stdout
            # ... and the agent-server answers no API call without its session key.
            bare = httpx.get(f"{workspace.host}/api/conversations/search", timeout=30)
            assert bare.status_code == 401
            runtime = httpx.get(f"{runtime_api.url}/sessions/{workspace.session_id}",
                                headers=headers).json()
            assert runtime["sandbox_id"] == sandboxes[-1]
    listed = httpx.get(f"{runtime_api.url}/list", headers=headers).json()
    assert listed == {"runtimes": []}
    assert all(sandboxes)


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
