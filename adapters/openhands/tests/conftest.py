"""Fixtures for the OpenHands end-to-end tests (run in their own Python >= 3.12
environment by tests/openhands/test_openhands_env.py, against the real OpenHands
packages and real rollbox sandboxes).

- ``rollbox_home``: a temporary ROLLBOX_HOME for the whole session;
- ``agent_server_image(version, chromium)``: the image `rollbox openhands build-image`
  makes, built once per recipe into $ROLLBOX_OPENHANDS_IMAGE_CACHE and imported;
- ``runtime_api``: `rollbox serve --face openhands` as a subprocess, its URL and key;
- ``openhands_serve``: `rollbox openhands serve`, the same handlers standing alone.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from rollbox_openhands.testing.scripted_llm import ScriptedLLM

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("OPENHANDS_SUPPRESS_BANNER", "1")

IMAGE_SOURCE = Path(__file__).resolve().parents[1] / "src" / "rollbox_openhands" / "image.py"


@pytest.fixture(scope="session")
def rollbox_home() -> Iterator[Path]:
    home = Path(tempfile.mkdtemp(prefix="rollbox-openhands-home-", dir="/var/tmp"))
    home.chmod(0o755)  # as root, the sandbox user must reach it
    previous = os.environ.get("ROLLBOX_HOME")
    os.environ["ROLLBOX_HOME"] = str(home)
    yield home
    if previous is None:
        os.environ.pop("ROLLBOX_HOME", None)
    else:
        os.environ["ROLLBOX_HOME"] = previous
    shutil.rmtree(home, ignore_errors=True)


def _image_cache() -> Path:
    configured = os.environ.get("ROLLBOX_OPENHANDS_IMAGE_CACHE")
    if configured:
        return Path(configured)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rollbox-openhands"


@pytest.fixture(scope="session")
def agent_server_image(rollbox_home: Path) -> Callable[[str, bool], str]:
    """``agent_server_image(version, chromium)`` -> an image name in the store."""
    made: dict[tuple[str, bool], str] = {}

    def get(version: str, chromium: bool = False) -> str:
        if (version, chromium) in made:
            return made[(version, chromium)]
        recipe = f"{version}:{chromium}:{sys.base_prefix}:" + IMAGE_SOURCE.read_text()
        key = hashlib.sha256(recipe.encode()).hexdigest()[:16]
        layout = _image_cache() / f"agent-server-{version}-{key}"
        name = f"openhands-agent-server:{version}" + ("-chromium" if chromium else "")
        if not (layout / "index.json").exists():
            shutil.rmtree(layout, ignore_errors=True)
            partial = layout.with_name(layout.name + ".partial")
            _rollbox("openhands", "build-image", "--version", version, "--name", "",
                     "--python", sys.executable, "--output", str(partial),
                     *(["--chromium"] if chromium else []), timeout=1800)
            partial.rename(layout)
        _rollbox("images", "import", str(layout), "--name", name, timeout=900)
        made[(version, chromium)] = name
        return name

    return get


def _rollbox(*args: str, timeout: float) -> str:
    result = subprocess.run([sys.executable, "-m", "rollbox", *args], capture_output=True,
                            text=True, timeout=timeout)
    if result.returncode != 0:
        pytest.fail(f"rollbox {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}",
                    pytrace=False)
    return result.stdout


@pytest.fixture(scope="session")
def sdk_image(agent_server_image: Callable[[str, bool], str]) -> str:
    """The agent-server the SDK tests use (imported before any server starts: a running
    backend does not see names another process imports)."""
    return agent_server_image("1.58.2", False)


@pytest.fixture(scope="session")
def app_image(agent_server_image: Callable[[str, bool], str]) -> str:
    """The agent-server openhands-ai 1.11.0 bundles, with chromium (its browser tool)."""
    return agent_server_image("1.34.0", True)


@dataclass(frozen=True)
class RuntimeAPIServer:
    url: str
    api_key: str
    process: subprocess.Popen[str]
    log: Path
    server_url: str = ""
    """`rollbox serve`'s own address (its remote backend API), if it is that server."""
    token: str = ""


@pytest.fixture
def llm() -> Iterator[ScriptedLLM]:
    """The scripted LLM; a test sets its ``command``."""
    with ScriptedLLM("echo no command given") as scripted:
        yield scripted


def _serve(command: list[str], ready: str, log: Path, env: dict[str, str]) -> tuple[
        str, subprocess.Popen[str]]:
    """Start ``command``; its URL once its log matches ``ready``."""
    with log.open("w") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, text=True,
                                   env={**os.environ, **env})
    for _ in range(600):
        match = re.search(ready, log.read_text())
        if match:
            return match.group(1), process
        if process.poll() is not None:
            break
        time.sleep(0.1)
    process.kill()
    pytest.fail(f"{' '.join(command[2:5])} did not start:\n{log.read_text()}")


def _stop(server: RuntimeAPIServer, agent_logs: Path) -> None:
    for agent_log in sorted(agent_logs.glob("*.log")):
        print(f"--- {agent_log.name} (last 3000 characters)\n{agent_log.read_text()[-3000:]}")
    server.process.send_signal(signal.SIGTERM)
    try:
        code = server.process.wait(timeout=120)
    except subprocess.TimeoutExpired:
        server.process.kill()
        pytest.fail(f"the Runtime API did not stop:\n{server.log.read_text()[-4000:]}")
    assert code == 0, server.log.read_text()[-4000:]


@pytest.fixture
def runtime_api(rollbox_home: Path, tmp_path: Path,
                llm: ScriptedLLM) -> Iterator[RuntimeAPIServer]:
    """`rollbox serve --face openhands` on a free port (sandboxes without network, the
    LLM's port forwarded), with a Runtime API key of its own; stopped (and checked) at
    the end. ``url`` is the Runtime API's (``.../openhands``)."""
    api_key = "test-key-" + os.urandom(8).hex()
    token = "server-token-" + os.urandom(8).hex()
    agent_logs = tmp_path / "agent-servers"
    base, process = _serve(
        [sys.executable, "-m", "rollbox", "serve", "--listen", "127.0.0.1:0",
         "--state-dir", str(tmp_path / "serve"), "--face", "openhands",
         "--pool-idle", "600"],  # no surplus closed while a test waits for a boot
        r"local backend on (http://\S+)", tmp_path / "serve.log",
        {"ROLLBOX_TOKEN": token, "ROLLBOX_OPENHANDS_API_KEY": api_key,
         "ROLLBOX_OPENHANDS_FORWARD": str(llm.port),
         "ROLLBOX_OPENHANDS_AGENT_LOGS": str(agent_logs)})
    server = RuntimeAPIServer(f"{base}/openhands", api_key, process, tmp_path / "serve.log",
                              base, token)
    yield server
    _stop(server, agent_logs)


@pytest.fixture
def openhands_serve(rollbox_home: Path, tmp_path: Path,
                    llm: ScriptedLLM) -> Iterator[RuntimeAPIServer]:
    """`rollbox openhands serve --warm 2` (the same handlers on a pool of its own)."""
    api_key = "test-key-" + os.urandom(8).hex()
    agent_logs = tmp_path / "agent-servers"
    url, process = _serve(
        [sys.executable, "-m", "rollbox", "openhands", "serve", "--port", "0",
         "--api-key", api_key, "--warm", "2", "--forward", str(llm.port),
         "--agent-logs", str(agent_logs)],
        r"OpenHands Runtime API on (\S+)", tmp_path / "serve.log", {})
    server = RuntimeAPIServer(url, api_key, process, tmp_path / "serve.log")
    yield server
    _stop(server, agent_logs)
