"""Fixtures for the OpenHands end-to-end tests (run in their own Python >= 3.12
environment by tests/openhands/test_openhands_env.py, against the real OpenHands
packages and real rollbox sandboxes).

- ``rollbox_home``: a temporary ROLLBOX_HOME for the whole session;
- ``agent_server_image(version, chromium)``: the image `rollbox openhands build-image`
  makes, built once per recipe into $ROLLBOX_OPENHANDS_IMAGE_CACHE and imported;
- ``runtime_api``: `rollbox openhands serve` as a subprocess, its URL and key.
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


@pytest.fixture
def llm() -> Iterator[ScriptedLLM]:
    """The scripted LLM; a test sets its ``command``."""
    with ScriptedLLM("echo no command given") as scripted:
        yield scripted


@pytest.fixture
def runtime_api(rollbox_home: Path, tmp_path: Path,
                llm: ScriptedLLM) -> Iterator[RuntimeAPIServer]:
    """`rollbox openhands serve` on a free port (sandboxes without network, the LLM's
    port forwarded), stopped (and checked) at the end."""
    api_key = "test-key-" + os.urandom(8).hex()
    log = tmp_path / "serve.log"
    with log.open("w") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "rollbox", "openhands", "serve", "--port", "0",
             "--api-key", api_key, "--warm", "1", "--forward", str(llm.port),
             "--agent-logs", str(tmp_path / "agent-servers")],
            stdout=sink, stderr=subprocess.STDOUT, text=True)
    url = None
    for _ in range(600):
        match = re.search(r"OpenHands Runtime API on (\S+)", log.read_text())
        if match:
            url = match.group(1)
            break
        if process.poll() is not None:
            break
        import time

        time.sleep(0.1)
    if url is None:
        process.kill()
        pytest.fail(f"rollbox openhands serve did not start:\n{log.read_text()}")
    yield RuntimeAPIServer(url, api_key, process, log)
    for agent_log in sorted((tmp_path / "agent-servers").glob("*.log")):
        print(f"--- {agent_log.name} (last 3000 characters)\n{agent_log.read_text()[-3000:]}")
    process.send_signal(signal.SIGTERM)
    try:
        code = process.wait(timeout=120)
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail(f"rollbox openhands serve did not stop:\n{log.read_text()[-4000:]}")
    assert code == 0, log.read_text()[-4000:]
