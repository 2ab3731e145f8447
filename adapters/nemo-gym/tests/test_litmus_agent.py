"""NeMo Gym's own ``litmus_agent`` resources server, in process, on rollbox sandboxes.

The server's config is its shipped YAML with one change: ``sandbox_provider`` is the
rollbox block (with an image rewrite for the image its spec names). Its sandbox spec is
left as it ships — resources, ttl, workdir, OpenSandbox's platform — and its stateful
Python tool runs in a real local sandbox; ``/verify`` scores the answer and stops it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import resources_servers.litmus_agent.app as litmus
from fastapi.testclient import TestClient
from nemo_gym.config_types import BaseServerConfig
from nemo_gym.server_utils import ServerClient
from ng_support import leftovers, provider_block, sandbox_processes, shared_pools
from omegaconf import OmegaConf


def litmus_config() -> dict[str, Any]:
    shipped = OmegaConf.load(Path(litmus.__file__).parent / "configs" / "litmus_agent.yaml")
    block = OmegaConf.to_container(shipped.litmus_agent.resources_servers.litmus_agent,
                                   resolve=True)
    assert isinstance(block, dict)
    assert "opensandbox" in block["sandbox_provider"]  # what this test swaps out
    # The spec's registry image (python:3.12-slim) is not pulled: the host image has a
    # Python 3 too, and the tool's driver needs nothing more.
    rollbox = provider_block(
        keep_warm_s=0, image_rewrites=[{"from": block["sandbox_spec"]["image"], "to": "host"}])
    return {**block, "sandbox_provider": rollbox, "host": "127.0.0.1", "port": 0,
            "name": "litmus_agent"}


def server() -> litmus.LitmusAgentResourcesServer:
    client = ServerClient(head_server_config=BaseServerConfig(host="127.0.0.1", port=1),
                          global_config_dict=OmegaConf.create({}))
    return litmus.LitmusAgentResourcesServer(
        config=litmus.LitmusAgentConfig(**litmus_config()), server_client=client)


def verify_body(answer: str) -> dict[str, Any]:
    return {
        "responses_create_params": {"input": [{"role": "user", "content": "What is 6 * 7?"}]},
        "response": {
            "id": "resp_1", "created_at": 0.0, "model": "policy", "object": "response",
            "output": [{"id": "msg_1", "type": "message", "role": "assistant",
                        "content": [{"type": "output_text", "text": answer, "annotations": []}]}],
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
        },
        "expected_answer": "42",
        "answer_type": "float",
    }


def test_litmus_agent_runs_its_tool_on_rollbox_and_verifies() -> None:
    litmus_server = server()
    spec = litmus_server._build_sandbox_spec()
    assert spec.resources.cpu == 2 and spec.provider_options["platform"]["os"] == "linux"
    app = litmus_server.setup_webserver()
    with TestClient(app) as client:
        first = client.post("/stateful_python_code_exec", json={"code": "x = 6"})
        assert first.status_code == 200 and first.text == ""
        second = client.post("/stateful_python_code_exec",
                             json={"code": "import os\nprint(x * 7, os.getcwd())"})
        assert second.text.strip() == "42 /tmp"  # state kept across cells, in the sandbox
        (session,) = litmus_server._sessions.values()
        handle = session.sandbox._require_handle()
        assert handle.provider_name == "rollbox"
        assert len(shared_pools()) == 1

        verified = client.post("/verify", json=verify_body("The answer is ((42))"))
        assert verified.status_code == 200, verified.text
        assert verified.json()["reward"] == 1.0
        assert litmus_server._sessions == {}  # /verify stopped the sandbox ...
        assert shared_pools() == []  # ... and its provider's pool closed (keep_warm_s: 0)
    assert sandbox_processes() == []


async def test_nothing_is_left_behind_after_verify() -> None:
    """The same flow, looking at the backend itself once the pool closed."""
    litmus_server = server()
    app = litmus_server.setup_webserver()
    with TestClient(app) as client:
        client.post("/stateful_python_code_exec", json={"code": "print(1)"})
        (shared,) = shared_pools()
        client.post("/verify", json=verify_body("((41))"))
    assert await leftovers(shared) == []
    assert sandbox_processes() == []
