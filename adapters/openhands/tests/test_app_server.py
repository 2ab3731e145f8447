"""The unmodified OpenHands app server (openhands-ai 1.11) with ``RUNTIME=remote``
pointed at `rollbox serve --face openhands`: a conversation started through its HTTP API runs
its tool call in a rollbox sandbox and finishes; pause, resume and delete go through
the app server to rollbox.

The app server's agent-server image is chosen by configuration alone
(AGENT_SERVER_IMAGE_REPOSITORY / AGENT_SERVER_IMAGE_TAG); it carries Debian's chromium
because the app server always enables the browser tool.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from rollbox_openhands.testing.scripted_llm import ScriptedLLM

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _until(what: str, check: Callable[[], Any], timeout: float, log: Path) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.5)
    pytest.fail(f"timed out waiting for {what}; app server log:\n{log.read_text()[-6000:]}")


@pytest.fixture
def app_server(app_image: str, runtime_api, tmp_path: Path) -> Iterator[httpx.Client]:
    image = app_image
    repository, tag = image.rsplit(":", 1)
    port = _free_port()
    home = tmp_path / "home"
    home.mkdir()
    env = {
        **os.environ,
        "RUNTIME": "remote",
        "SANDBOX_REMOTE_RUNTIME_API_URL": runtime_api.url,
        "SANDBOX_API_KEY": runtime_api.api_key,
        "AGENT_SERVER_IMAGE_REPOSITORY": repository,
        "AGENT_SERVER_IMAGE_TAG": tag,
        "OH_PERSISTENCE_DIR": str(tmp_path / "openhands"),
        "HOME": str(home),
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }
    log = tmp_path / "app-server.log"
    with log.open("w") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "openhands.app_server.app:app",
             "--host", "127.0.0.1", "--port", str(port)],
            env=env, stdout=sink, stderr=subprocess.STDOUT)
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)
    client.log = log  # type: ignore[attr-defined]

    def alive() -> bool:
        try:
            return client.get("/alive").status_code == 200
        except httpx.HTTPError:
            return False

    try:
        _until("the app server", alive, 180, log)
        yield client
    finally:
        client.close()
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()


def test_app_server_conversation_runs_in_rollbox(app_server: httpx.Client, runtime_api,
                                                 llm: ScriptedLLM) -> None:
    log: Path = app_server.log  # type: ignore[attr-defined]
    rollbox = httpx.Client(base_url=runtime_api.url, headers={"X-API-Key": runtime_api.api_key})
    proof = f"/tmp/rollbox-proof-{uuid.uuid4().hex}"
    command = (f'echo "sandbox=$(cat /tmp/rollbox-openhands/sandbox-id) host=$(hostname)"; '
               f'touch {proof}; ls {proof}')
    llm.command = command
    settings = app_server.post("/api/v1/settings", json={"agent_settings_diff": {"llm": {
        "model": "openai/scripted", "base_url": llm.base_url, "api_key": "none"}}})
    assert settings.status_code == 200, settings.text
    started = app_server.post("/api/v1/app-conversations", json={"initial_message": {
        "role": "user", "run": True,
        "content": [{"type": "text", "text": "Run the command, then finish."}]}})
    assert started.status_code == 200, started.text
    task_id = started.json()["id"]

    def ready() -> dict[str, Any] | None:
        tasks = app_server.get("/api/v1/app-conversations/start-tasks",
                               params={"ids": task_id}).json()
        task = tasks[0] if tasks else None
        if task and task["status"] == "ERROR":
            pytest.fail(f"the conversation did not start: {task.get('detail')}\n"
                        f"{log.read_text()[-6000:]}")
        return task if task and task["status"] == "READY" else None

    task = _until("the conversation to start", ready, 300, log)
    conversation_id = task["app_conversation_id"]

    def conversation() -> dict[str, Any]:
        found = app_server.get("/api/v1/app-conversations",
                               params={"ids": conversation_id}).json()
        return found[0] or {}

    finished = _until("the conversation to finish",
                      lambda: conversation().get("execution_status") == "finished"
                      and conversation(), 300, log)
    sandbox_id = finished["sandbox_id"]
    runtime = rollbox.get(f"/sessions/{sandbox_id}").json()
    assert runtime["status"] == "running"
    results = llm.tool_results()
    assert results and f"sandbox={runtime['sandbox_id']} host=rollbox" in results[0]
    assert not Path(proof).exists()

    # Pause and resume through the app server reach rollbox.
    assert app_server.post(f"/api/v1/sandboxes/{sandbox_id}/pause").status_code == 200
    assert rollbox.get(f"/sessions/{sandbox_id}").json()["status"] == "paused"
    assert app_server.post(f"/api/v1/sandboxes/{sandbox_id}/resume").status_code == 200
    resumed = rollbox.get(f"/sessions/{sandbox_id}").json()
    assert resumed["status"] == "running"
    assert httpx.get(resumed["url"] + "/alive", timeout=10).status_code == 200

    # Deleting the conversation stops its sandbox's runtime.
    deleted = app_server.delete(f"/api/v1/app-conversations/{conversation_id}")
    assert deleted.status_code == 200, deleted.text
    _until("the runtime to stop",
           lambda: rollbox.get(f"/sessions/{sandbox_id}").status_code == 404, 120, log)
    assert rollbox.get("/list").json() == {"runtimes": []}
