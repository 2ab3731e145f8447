"""rollbox environments served as NeMo Gym resources servers.

NeMo Gym's own ``check_resources_session_contract`` drives the server's routes for the
synthetic SWE environment and the shell environment; then an episode is played through
the routes the way an Environment Server and an agent would.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from fastapi.testclient import TestClient
from nemo_gym.base_resources_server import ResourcesSeedSessionRequest
from nemo_gym.config_types import BaseServerConfig
from nemo_gym.episode_types import EpisodeId, TaskId
from nemo_gym.global_config import GlobalConfigDictParser, GlobalConfigDictParserConfig
from nemo_gym.openai_utils import NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.server_utils import ServerClient
from nemo_gym.testing.session_conformance import check_resources_session_contract
from ng_support import leftovers, sandbox_processes, shared_pools
from omegaconf import OmegaConf
from rollbox.envs import SUBMIT, load_tasks
from rollbox.errors import UsageError, WorkloadError
from rollbox.sandbox import ExecRequest, ExecResult
from rollbox.testing import FakeSandbox, builtin_handler
from rollbox_nemo_gym import GYM_ROOT, dataset
from rollbox_nemo_gym.server import RollboxEnvConfig, RollboxResourcesServer


def server(environment: str, **settings: Any) -> RollboxResourcesServer:
    config = RollboxEnvConfig(host="127.0.0.1", port=0, entrypoint="server.py",
                              name=f"rollbox_{environment}", environment=environment,
                              **settings)
    client = ServerClient(head_server_config=BaseServerConfig(host="127.0.0.1", port=1),
                          global_config_dict=OmegaConf.create({}))
    return RollboxResourcesServer(config=config, server_client=client)


def seed(environment: str, task_id: str, session: str = "session-0") -> ResourcesSeedSessionRequest:
    return ResourcesSeedSessionRequest(
        resources_session_id=session,
        episode_id=EpisodeId(rollout_id=f"{session}-rollout"),
        task_id=TaskId(taskset=f"rollbox:{environment}", task_id=task_id),
        task_data={},
    )


def verify_body() -> dict[str, Any]:
    return {
        "responses_create_params": {"input": [{"role": "user", "content": "solve it"}]},
        "response": {
            "id": "resp_1", "created_at": 0.0, "model": "policy", "object": "response",
            "output": [], "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
        },
    }


@pytest.mark.parametrize(
    ("environment", "options"),
    [("synthetic", {"n_images": 2}), ("shell", {})],
)
async def test_the_session_contract_holds(environment: str, options: dict[str, Any]) -> None:
    first = load_tasks(environment, options)[0]
    rollbox_server = server(environment, task_options=options, keep_warm_s=0)
    check_resources_session_contract(rollbox_server.setup_webserver(),
                                     seed(environment, first.id), keeps_state=True)
    assert rollbox_server._episodes == {}
    (shared,) = shared_pools()
    counts = shared.pool.metrics.counters
    assert counts["creations"] == 1  # the repeated seed did not start a second sandbox
    await rollbox_server.aclose()
    assert shared_pools() == []
    assert await leftovers(shared) == []
    assert sandbox_processes() == []


def test_an_episode_of_the_synthetic_environment_through_the_routes() -> None:
    options = {"n_images": 2}
    task = load_tasks("synthetic", options)[0]
    rollbox_server = server("synthetic", task_options=options, keep_warm_s=0)
    with TestClient(rollbox_server.setup_webserver()) as client:
        seeded = client.post("/seed_session",
                             json=seed("synthetic", task.id).model_dump(mode="json"))
        assert seeded.status_code == 200, seeded.text

        look = client.post("/run_command", json={"command": "git status --short; ls"})
        assert look.status_code == 200, look.text
        assert "solution.py" in look.json()["output"]
        assert look.json()["reward"] == 0.0 and not look.json()["terminated"]

        # the bug is "+ (b + 1)": take the 1 away; the visible tests pass, and the hidden
        # ones, which pay, come only with the final verdict
        client.post("/run_command", json={
            "command": r"sed -i -E 's/(\+ [0-9]+)$/\1 - 1/' solution.py"})
        tested = client.post("/run_command", json={"command": "python3 -B test_solution.py"})
        assert "4/4 passed" in tested.json()["output"]
        assert tested.json()["reward"] == 0.0 and not tested.json()["terminated"]

        verified = client.post("/verify", json=verify_body())
        assert verified.json()["reward"] == 1.0 and verified.json()["mask_sample"] is False

        # the verdict ended the episode: asked again, /verify says the same
        again = client.post("/verify", json=verify_body())
        assert again.json()["reward"] == 1.0 and again.json()["mask_sample"] is False

        closed = client.post("/close_session", json={
            "resources_session_id": "session-0", "episode_id": {"rollout_id": "session-0-rollout"}})
        assert closed.status_code == 200
        gone = client.post("/run_command", json={"command": "true"})
        assert gone.status_code == 404
    assert shared_pools() == []
    assert sandbox_processes() == []


def _seeded(client: TestClient, task_id: str) -> None:
    seeded = client.post("/seed_session", json=seed("shell", task_id).model_dump(mode="json"))
    assert seeded.status_code == 200, seeded.text


def test_an_episode_that_submits_keeps_its_verdict_at_verify() -> None:
    """A failing episode that calls ``submit`` is judged then; /verify (which NeMo Gym
    calls at the end of every rollout) gives that verdict, never a masked sample."""
    rollbox_server = server("shell", keep_warm_s=0)
    with TestClient(rollbox_server.setup_webserver()) as client:
        _seeded(client, "shell/count-lines")
        submitted = client.post("/run_command", json={"command": SUBMIT}).json()
        assert (submitted["reward"], submitted["terminated"]) == (0.0, True), submitted
        for _ in range(2):
            verified = client.post("/verify", json=verify_body()).json()
            assert (verified["reward"], verified["mask_sample"]) == (0.0, False), verified
    assert shared_pools() == []
    assert sandbox_processes() == []


async def crash_when_asked(sandbox: FakeSandbox, request: ExecRequest) -> ExecResult:
    """The fake backend's shell, where ``crash`` breaks the sandbox as a real backend
    reports a rollout that filled its memory (WorkloadError)."""
    if request.argv[-1] == "crash":
        raise WorkloadError("its processes exhausted its memory", sandbox_id=sandbox.id,
                            cause="memory")
    return await builtin_handler(sandbox, request)


def test_an_episode_that_breaks_its_sandbox_is_scored_not_masked() -> None:
    rollbox_server = server("shell", keep_warm_s=0, backend="fake",
                            backend_options={"handler": crash_when_asked})
    with TestClient(rollbox_server.setup_webserver()) as client:
        _seeded(client, "shell/hello-file")
        crashed = client.post("/run_command", json={"command": "crash"}).json()
        assert (crashed["reward"], crashed["terminated"], crashed["truncated"]) == (
            0.0, True, False), crashed
        assert crashed["workload_failure"] == "workload" and crashed["failure_kind"] is None
        verified = client.post("/verify", json=verify_body()).json()
        assert (verified["reward"], verified["mask_sample"]) == (0.0, False), verified
    assert shared_pools() == []


def test_an_agent_seed_by_task_id_closes_at_verify() -> None:
    rollbox_server = server("shell", keep_warm_s=0)
    with TestClient(rollbox_server.setup_webserver()) as client:
        assert client.post("/seed_session", json={"task_id": "shell/hello-file"}).status_code == 200
        step = client.post("/run_command", json={"command": "echo hello world > hello.txt"})
        assert step.json()["terminated"] is True and step.json()["reward"] == 1.0
        verified = client.post("/verify", json=verify_body())
        assert verified.json()["reward"] == 1.0
        assert rollbox_server._episodes == {}  # no close_session comes for an agent's seed
    assert sandbox_processes() == []


def test_an_unknown_task_or_environment_is_refused() -> None:
    rollbox_server = server("shell", keep_warm_s=0)
    with TestClient(rollbox_server.setup_webserver()) as client:
        unknown = client.post("/seed_session",
                              json=seed("shell", "shell/nope").model_dump(mode="json"))
        assert unknown.status_code == 422 and "shell/nope" in unknown.text
        assert client.post("/run_command", json={"command": "true"}).status_code == 404
    with pytest.raises(UsageError, match="no task source named"):
        load_tasks("no-such-environment")
    with pytest.raises(UsageError, match="unknown pool_options"):
        server("shell", pool_options={"bogus": 1})


def shipped_server_config(environment: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The shipped ``rollbox_env`` server block, found under the package's component root
    and read by NeMo Gym's own config parser, as docs/nemo-gym.md says to run it."""
    monkeypatch.setenv("NEMO_GYM_EXTRA_ROOTS", str(GYM_ROOT))
    initial = OmegaConf.create({
        "config_paths": ["resources_servers/rollbox_env/configs/rollbox_env.yaml"],
        "policy_model": {"responses_api_models": {"dummy_model": {"entrypoint": "app.py"}}},
    })
    parsed = GlobalConfigDictParser().parse(GlobalConfigDictParserConfig(
        initial_global_config_dict=initial, skip_load_from_cli=True,
        skip_load_from_dotenv=True, offline=True,
    ))
    block = OmegaConf.to_container(parsed.rollbox_env.resources_servers.rollbox_env,
                                   resolve=True)
    assert isinstance(block, dict)
    return {**block, "name": "rollbox_env", "environment": environment, "keep_warm_s": 0}


def test_a_dataset_row_runs_like_nemo_gyms_simple_agent_runs_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The legacy agent flow: seed with the row, call the tool, verify with the row."""
    (row, *_) = dataset.rows("shell")
    NeMoGymResponseCreateParamsNonStreaming.model_validate(row["responses_create_params"])
    client_config = ServerClient(head_server_config=BaseServerConfig(host="127.0.0.1", port=1),
                                 global_config_dict=OmegaConf.create({}))
    rollbox_server = RollboxResourcesServer(
        config=RollboxEnvConfig.model_validate(shipped_server_config("shell", monkeypatch)),
        server_client=client_config)
    assert rollbox_server.config.max_steps == 32
    with TestClient(rollbox_server.setup_webserver()) as client:
        assert client.post("/seed_session", json=row).status_code == 200
        step = client.post("/run_command", json={"command": "echo hello world > hello.txt"})
        assert step.json()["reward"] == 1.0
        verified = client.post("/verify", json={**row, **verify_body()})
        assert verified.status_code == 200, verified.text
        assert verified.json()["reward"] == 1.0
    assert sandbox_processes() == []


def test_the_dataset_command_prints_a_row_per_task() -> None:
    done = subprocess.run([sys.executable, "-m", "rollbox_nemo_gym.dataset", "shell"],
                          capture_output=True, text=True, timeout=120, check=True)
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [line["task_id"] for line in lines] == [t.id for t in load_tasks("shell")]
    assert lines[0]["responses_create_params"]["tools"][0]["name"] == "run_command"
