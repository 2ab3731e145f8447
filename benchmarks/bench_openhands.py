"""OpenHands on rollbox: how long until an agent-server answers, and until a
conversation's first tool result — warm vs cold rollbox, vs OpenHands' own process
sandbox (RUNTIME=process: an agent-server as a plain subprocess, no isolation).

Run it in an environment with the OpenHands SDK (Python >= 3.12), e.g. the one the
tests make (tests/openhands/test_openhands_env.py, recipe ``openhands-sdk``):

    ENV=~/.cache/rollbox-test-envs/openhands-sdk-*/
    ROLLBOX_HOME=/var/tmp/rb-bench nice -n 19 $ENV/bin/python \
        benchmarks/bench_openhands.py --image openhands-agent-server:1.58.2 --rounds 5

(build the image first: ``rollbox openhands build-image``, import it into that home).
The Runtime API is ``rollbox serve --face openhands`` (``--via standalone``: ``rollbox
openhands serve``, the same handlers). A warm sample waits ``--settle`` seconds after a
booted agent-server is ready (the background boots of the previous round finish first).
Prints medians and ratios; ``--json PATH`` writes every sample. Timing is never
asserted anywhere.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from rollbox_openhands.testing.scripted_llm import ScriptedLLM

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
os.environ.setdefault("OPENHANDS_SUPPRESS_BANNER", "1")


@contextmanager
def runtime_api(warm: int, log_dir: Path, llm_port: int,
                via: str = "face") -> Iterator[tuple[str, str]]:
    """The Runtime API: ``rollbox serve --face openhands`` (via "face") or ``rollbox
    openhands serve`` (via "standalone"); yields its URL and key."""
    key = "bench-" + os.urandom(6).hex()
    log = log_dir / f"serve-{via}-warm{warm}.log"
    if via == "face":
        command = [sys.executable, "-m", "rollbox", "serve", "--listen", "127.0.0.1:0",
                   "--state-dir", str(log_dir / f"serve-warm{warm}"), "--face", "openhands"]
        env = {**os.environ, "ROLLBOX_TOKEN": "bench-token-" + os.urandom(6).hex(),
               "ROLLBOX_OPENHANDS_API_KEY": key, "ROLLBOX_OPENHANDS_WARM": str(warm),
               "ROLLBOX_OPENHANDS_FORWARD": str(llm_port)}
        ready, suffix = r"local backend on (http://\S+)", "/openhands"
    else:
        command = [sys.executable, "-m", "rollbox", "openhands", "serve", "--port", "0",
                   "--api-key", key, "--warm", str(warm), "--forward", str(llm_port)]
        env, ready, suffix = dict(os.environ), r"Runtime API on (\S+)", ""
    with log.open("w") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env)
    try:
        for _ in range(600):
            found = re.search(ready, log.read_text())
            if found:
                break
            if process.poll() is not None:
                raise SystemExit(f"{' '.join(command[2:4])} exited:\n{log.read_text()}")
            time.sleep(0.1)
        else:
            raise SystemExit(f"{' '.join(command[2:4])} did not start")
        yield found.group(1) + suffix, key
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=120)


def start_to_healthy(url: str, key: str, image: str) -> tuple[float, str]:
    """POST /start, poll the session until ready, GET /health: seconds, runtime id.
    (One client made before the clock starts: a new httpx client loads its TLS
    certificates, tens of milliseconds that are not the server's.)"""
    headers = {"X-API-Key": key}
    # What APIRemoteWorkspace sends (so both ask for the same kind of agent-server).
    body = {"image": image, "command": "/usr/local/bin/openhands-agent-server --port 60000",
            "working_dir": "/", "environment": {},
            "session_id": "bench-" + os.urandom(6).hex()}
    with httpx.Client(timeout=300) as client:
        began = time.perf_counter()
        runtime = client.post(f"{url}/start", json=body, headers=headers).json()
        while runtime["pod_status"] != "ready":
            if runtime["pod_status"] == "failed":
                raise SystemExit(f"the runtime failed: {runtime}")
            time.sleep(0.02)
            runtime = client.get(f"{url}/sessions/{body['session_id']}",
                                 headers=headers).json()
        assert client.get(runtime["url"] + "/health").status_code == 200
        return time.perf_counter() - began, runtime["runtime_id"]


def stop(url: str, key: str, runtime_id: str) -> None:
    httpx.post(f"{url}/stop", json={"runtime_id": runtime_id}, headers={"X-API-Key": key},
               timeout=120)


def wait_warm(url: str, key: str, settle: float, seconds: float = 600) -> None:
    """Until the server has a booted agent-server waiting (GET /rollbox/warm), then
    ``settle`` seconds more: the sandbox reset after the last round boots its next
    agent-server in the background, and a sample taken meanwhile shares the CPU with
    that boot (on 2 cores, it measures the boot as much as the hand-out)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if httpx.get(f"{url}/rollbox/warm", headers={"X-API-Key": key}).json()["ready"]:
            time.sleep(settle)
            return
        time.sleep(0.2)
    raise SystemExit("no warm agent-server within the time allowed")


def process_start_to_healthy(log_dir: Path) -> float:
    """OpenHands' RUNTIME=process: the agent-server as a subprocess of the host."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    workdir = Path(tempfile.mkdtemp(dir=log_dir))
    began = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "openhands.agent_server", "--host", "127.0.0.1", "--port",
         str(port)], cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        # The PATH a sandbox has: with the host's (uvx on it) the agent-server's tool
        # preload tries to download Chromium at boot, which no sandbox does.
        env={**os.environ, "OH_SESSION_API_KEYS_0": "bench", "PATH": SYSTEM_PATH})
    try:
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    return time.perf_counter() - began
            except httpx.HTTPError:
                pass
            if process.poll() is not None:
                raise SystemExit("the agent-server subprocess exited")
            time.sleep(0.02)
    finally:
        process.terminate()
        process.wait(timeout=30)


def conversation_to_first_tool_result(url: str, key: str, image: str,
                                      llm: ScriptedLLM) -> float:
    """APIRemoteWorkspace + Conversation until the scripted LLM receives the terminal
    tool's result (workspace provisioning included)."""
    from openhands.sdk import LLM, Agent, Conversation, Tool
    from openhands.tools.terminal import TerminalTool
    from openhands.workspace import APIRemoteWorkspace
    from pydantic import SecretStr

    llm.first_tool_result_at = None
    agent = Agent(llm=LLM(model="openai/scripted", base_url=llm.base_url,
                          api_key=SecretStr("none"), usage_id="agent", num_retries=0),
                  tools=[Tool(name=TerminalTool.name)])
    began = time.perf_counter()
    with APIRemoteWorkspace(runtime_api_url=url, runtime_api_key=key, server_image=image,
                            init_timeout=300, startup_wait_timeout=300) as workspace:
        conversation = Conversation(agent=agent, workspace=workspace)
        conversation.send_message("run it")
        conversation.run()
        elapsed = llm.first_tool_result_at - began if llm.first_tool_result_at else -1.0
        conversation.close()
    return elapsed


def median(samples: list[float]) -> float:
    return statistics.median(samples) if samples else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", default="openhands-agent-server:1.58.2")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", default=None)
    parser.add_argument("--via", choices=("face", "standalone"), default="face",
                        help="rollbox serve --face openhands (default) or rollbox "
                             "openhands serve")
    parser.add_argument("--settle", type=float, default=20.0,
                        help="seconds to wait after a warm agent-server is ready before a "
                             "warm sample (background boots finish; default 20)")
    parser.add_argument("--skip-process", action="store_true",
                        help="skip the RUNTIME=process baseline (slow on a loaded machine)")
    parser.add_argument("--skip-conversations", action="store_true")
    args = parser.parse_args()
    log_dir = Path(tempfile.mkdtemp(prefix="rollbox-bench-openhands-"))
    samples: dict[str, list[float]] = {k: [] for k in (
        "start_healthy_cold", "start_healthy_warm", "start_healthy_process",
        "conversation_cold", "conversation_warm")}

    llm = ScriptedLLM("echo bench").__enter__()
    with runtime_api(0, log_dir, llm.port, args.via) as (url, key):
        for _ in range(args.rounds):
            elapsed, runtime_id = start_to_healthy(url, key, args.image)
            samples["start_healthy_cold"].append(elapsed)
            stop(url, key, runtime_id)
        for _ in range(0 if args.skip_conversations else max(1, args.rounds // 2)):
            samples["conversation_cold"].append(
                conversation_to_first_tool_result(url, key, args.image, llm))
    with runtime_api(1, log_dir, llm.port, args.via) as (url, key):
        # The first /start of a kind boots cold; from then on the kind is kept warm.
        stop(url, key, start_to_healthy(url, key, args.image)[1])
        for _ in range(args.rounds):
            wait_warm(url, key, args.settle)
            elapsed, runtime_id = start_to_healthy(url, key, args.image)
            samples["start_healthy_warm"].append(elapsed)
            stop(url, key, runtime_id)
        for _ in range(0 if args.skip_conversations else max(1, args.rounds // 2)):
            wait_warm(url, key, args.settle)
            samples["conversation_warm"].append(
                conversation_to_first_tool_result(url, key, args.image, llm))
    for _ in range(0 if args.skip_process else args.rounds):
        samples["start_healthy_process"].append(process_start_to_healthy(log_dir))

    medians = {k: median(v) for k, v in samples.items()}
    print(f"{'measure':34} {'median s':>9}  samples")
    for name, values in samples.items():
        print(f"{name:34} {medians[name]:9.3f}  {' '.join(f'{v:.3f}' for v in values)}")
    ratio = medians["start_healthy_cold"] / medians["start_healthy_warm"]
    versus_process = medians["start_healthy_process"] / medians["start_healthy_warm"]
    conversations = medians["conversation_cold"] / medians["conversation_warm"]
    print(f"cold/warm /start->healthy: {ratio:.1f}x; process/warm: {versus_process:.1f}x; "
          f"conversation cold/warm: {conversations:.1f}x")
    if args.json:
        Path(args.json).write_text(json.dumps({"samples": samples, "medians": medians}, indent=1))


if __name__ == "__main__":
    main()
