"""``rollbox serve`` as users run it: a server process, client processes that share its
pool and hand sandboxes to each other, clients and servers that die mid-work."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from rollbox_conformance.hostside import host_processes_with
from serve_support import ServeProcess

pytestmark = pytest.mark.slow

PRELUDE = """
import asyncio, json, sys
import rollbox
from rollbox import SandboxSpec
SPEC = SandboxSpec(image="host")
"""


def python(env: dict[str, str], code: str, *args: str, timeout: float = 120) -> str:
    """Run ``code`` in a new Python process (an unrelated client) and return its stdout."""
    done = subprocess.run([sys.executable, "-c", PRELUDE + code, *args], env=env,
                          capture_output=True, timeout=timeout, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


def rollbox(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rollbox", *args], env=env,
                          capture_output=True, text=True, timeout=120)


def wait_until(condition: object, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


def bwrap_under(home: Path) -> list[int]:
    """bwrap processes whose command line names a path under ``home``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if b"bwrap" in cmdline.split(b"\0", 1)[0] and str(home).encode() in cmdline:
            found.append(int(entry.name))
    return found


def test_three_commands_and_a_clean_shutdown(serve_process: ServeProcess) -> None:
    serve_process.start()
    env = serve_process.client_env()
    ran = rollbox(env, "run", "--", "sh", "-c", "echo through the server; exit 3")
    assert ran.returncode == 3, ran.stderr
    assert ran.stdout == "through the server\n"
    by_url = rollbox({**env, "ROLLBOX_BACKEND": "local"}, "run", "--url", serve_process.url,
                     "--", "echo", "by url")
    assert by_url.stdout == "by url\n", by_url.stderr
    held_id = python(env, """
async def main():
    backend = rollbox.open_backend()
    sandbox = await backend.create(SPEC)
    print(sandbox.id)          # exits without closing: the server keeps it
asyncio.run(main())
""").strip()
    listed = rollbox(env, "ps")
    assert held_id in listed.stdout and "local backend, 1 held" in listed.stdout, listed
    as_json = json.loads(rollbox(env, "ps", "--json").stdout)
    assert [s["id"] for s in as_json["sandboxes"]] == [held_id]
    token_file = serve_process.state / "serve" / "token"
    assert token_file.stat().st_mode & 0o777 == 0o600
    assert serve_process.socket.stat().st_mode & 0o777 == 0o600
    assert serve_process.stop(signal.SIGTERM) == 0
    assert not serve_process.socket.exists()
    assert not token_file.exists()
    assert not (serve_process.state / "serve" / "serve.pid").exists()
    assert wait_until(lambda: not bwrap_under(serve_process.home)), "sandboxes outlived it"


def test_two_processes_share_one_pool_and_hand_a_sandbox_over(
    serve_process: ServeProcess,
) -> None:
    serve_process.start()
    env = serve_process.client_env()
    creator = """
async def main():
    backend = rollbox.open_backend()
    warm = await backend.create(SPEC)
    await warm.exec(["true"])
    await warm.close()                   # back to the shared pool, reset
    sandbox = await backend.create(SPEC)
    await sandbox.write_file("/tmp/handoff.txt", b"made by process A")
    print(json.dumps({"id": sandbox.id, "health": backend.server}))
asyncio.run(main())
"""
    made = json.loads(python(env, creator))
    user = """
async def main():
    backend = rollbox.open_backend()
    sandbox = await backend.attach(sys.argv[1])
    data = await sandbox.read_file("/tmp/handoff.txt")
    result = await sandbox.exec("cat /tmp/handoff.txt; echo; echo $$")
    await sandbox.close()
    fresh = await backend.create(SPEC)   # warm: from the pool the other process filled
    print(json.dumps({"data": data.decode(), "out": result.text,
                      "fresh": (await fresh.exec(["true"])).ok}))
    await backend.aclose()
asyncio.run(main())
"""
    used = json.loads(python(env, user, made["id"]))
    assert used["data"] == "made by process A"
    assert used["out"].startswith("made by process A\n")
    assert used["fresh"]
    text = subprocess.run(
        [sys.executable, "-c", PRELUDE + """
from rollbox_remote import RemoteBackend
async def main():
    b = RemoteBackend()
    print((await b.http.request("GET", "/metrics", timeout=10)).body.decode())
asyncio.run(main())
"""], env=env, capture_output=True, text=True, timeout=60).stdout
    counters = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
                if line.startswith("rollbox_pool_events_total")}
    # one sandbox made; A's second create and B's create both reuse it, reset
    assert counters['rollbox_pool_events_total{event="creations"}'] == 1
    assert counters['rollbox_pool_events_total{event="reuses"}'] == 2


def test_a_client_killed_mid_stream_leaves_the_command_to_its_timeout(
    serve_process: ServeProcess,
) -> None:
    serve_process.start()
    env = serve_process.client_env()
    marker = f"rbx-orphan-{uuid.uuid4().hex}"
    client = subprocess.Popen([sys.executable, "-c", PRELUDE + f"""
async def main():
    backend = rollbox.open_backend()
    sandbox = await backend.create(SPEC)
    process = await sandbox.stream("echo started; exec sh -c 'sleep 60; :' {marker}",
                                   timeout=4)
    async for chunk in process:
        print(sandbox.id, flush=True)
        await asyncio.sleep(600)     # killed here, mid-stream
asyncio.run(main())
"""], env=env, stdout=subprocess.PIPE, text=True)
    assert client.stdout is not None
    sandbox_id = client.stdout.readline().strip()
    started = time.monotonic()
    client.kill()
    client.wait()
    assert host_processes_with(marker), "the command died with its client"
    assert wait_until(lambda: not host_processes_with(marker), timeout=30)
    assert time.monotonic() - started >= 2.5, "killed long before its 4 s timeout"
    after = python(env, """
async def main():
    backend = rollbox.open_backend()
    sandbox = await backend.attach(sys.argv[1])
    print((await sandbox.exec(["echo", "usable"])).text, end="")
    await sandbox.close()
asyncio.run(main())
""", sandbox_id)
    assert after == "usable\n"


def test_a_server_killed_with_sigkill_is_cleaned_up_by_the_next(
    serve_process: ServeProcess,
) -> None:
    serve_process.start()
    env = serve_process.client_env()
    old_token = serve_process.token
    python(env, """
async def main():
    backend = rollbox.open_backend()
    for _ in range(2):
        await (await backend.create(SPEC)).exec(["true"])
asyncio.run(main())
""")
    assert len(bwrap_under(serve_process.home)) >= 2
    serve_process.stop(signal.SIGKILL)
    assert serve_process.socket.exists(), "nothing left over: the test proves nothing"
    assert wait_until(lambda: not bwrap_under(serve_process.home)), (
        "sandboxes outlived a killed server")
    refused = rollbox(env, "ps")
    assert refused.returncode == 2 and "unavailable" in refused.stderr
    serve_process.start()
    assert serve_process.token != old_token
    fresh_env = serve_process.client_env()
    listed = rollbox(fresh_env, "ps")
    assert "0 held" in listed.stdout, listed
    assert rollbox(fresh_env, "run", "--", "true").returncode == 0
    assert rollbox(env, "ps").returncode == 2, "the old token still works"


def test_a_second_server_on_a_live_state_dir_refuses_to_start(
    serve_process: ServeProcess, state_dir: Path
) -> None:
    serve_process.start()
    second = subprocess.run([sys.executable, "-m", "rollbox", *["serve", *serve_process.args]],
                            env=serve_process.env, capture_output=True, text=True, timeout=60)
    assert second.returncode == 2
    assert "already runs" in second.stderr
    assert serve_process.process is not None and serve_process.process.poll() is None
    assert rollbox(serve_process.client_env(), "ps").returncode == 0


def test_a_given_token_file_must_be_private(serve_process: ServeProcess,
                                            state_dir: Path) -> None:
    token_file = state_dir / "given-token"
    token_file.write_text("a-token-chosen-by-the-operator\n")
    token_file.chmod(0o644)
    refused = subprocess.run(
        [sys.executable, "-m", "rollbox", "serve", *serve_process.args,
         "--token-file", str(token_file)],
        env=serve_process.env, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "chmod 600" in refused.stderr
    token_file.chmod(0o600)
    serve_process.args += ["--token-file", str(token_file)]
    serve_process.start()
    env = serve_process.client_env("a-token-chosen-by-the-operator")
    assert rollbox(env, "run", "--", "true").returncode == 0
    serve_process.stop()
    assert token_file.exists(), "a given token file is the operator's: never removed"


def test_serving_over_tcp(serve_process: ServeProcess) -> None:
    serve_process.args += ["--listen", "127.0.0.1:0"]
    serve_process.start()
    log = serve_process.log.read_text()
    url = next(w for w in log.split() if w.startswith("ROLLBOX_URL=")).split("=", 1)[1]
    assert url.startswith("http://127.0.0.1:")
    env = {**serve_process.client_env(), "ROLLBOX_URL": url}
    assert rollbox(env, "run", "--", "echo", "tcp").stdout == "tcp\n"


def test_rollbox_programs_run_through_the_server(serve_process: ServeProcess,
                                                 tmp_path: Path) -> None:
    """``ROLLBOX_BACKEND=remote`` is all the bench, the runner and Gymnasium need."""
    serve_process.start()
    env = serve_process.client_env()
    report = tmp_path / "bench.json"
    bench = rollbox(env, "bench", "--images", "3", "--rollouts", "2", "--concurrency", "2",
                    "--think-ms", "0", "--padding-mb", "0.05", "--quiet",
                    "--workdir", str(serve_process.home / "bench"), "--json", str(report))
    assert bench.returncode == 0, bench.stderr
    arms = json.loads(report.read_text())["arms"]
    for arm in arms.values():
        assert arm["rollouts"]["requested"] == arm["rollouts"]["succeeded"] == 6
        assert arm["leftovers"] == [] and arm["leaked_sandboxes"] == 0
    episode = python(env, """
import gymnasium
import rollbox_gymnasium
env = gymnasium.make("rollbox/Shell-v0")
obs, info = env.reset(seed=0)
obs, reward, terminated, truncated, info = env.step("echo from gymnasium")
print(obs.strip())
env.close()
""")
    assert episode.strip().endswith("from gymnasium")


def test_a_hung_server_is_a_retryable_error_not_a_hang(serve_process: ServeProcess) -> None:
    serve_process.start()
    env = serve_process.client_env()
    client = subprocess.Popen([sys.executable, "-c", PRELUDE + """
import time
from rollbox.errors import ServerUnavailableError
from rollbox_remote import RemoteBackend
async def main():
    backend = RemoteBackend(timeout_s=3, slack_s=2)
    sandbox = await backend.create(SPEC)
    process = await sandbox.stream(["sleep", "30"], timeout=1)
    print("ready", flush=True)
    sys.stdin.readline()                     # the server is stopped now
    outcomes = []
    for what in ("exec", "stream", "read_file"):
        started = time.monotonic()
        try:
            if what == "exec":
                await sandbox.exec(["true"], timeout=1)
            elif what == "stream":
                async for _ in process:
                    pass
                await process.wait()
            else:
                await sandbox.read_file("/etc/hostname")
        except ServerUnavailableError as exc:
            outcomes.append([what, exc.retryable, time.monotonic() - started])
    print(json.dumps(outcomes), flush=True)
asyncio.run(main())
"""], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert client.stdin is not None and client.stdout is not None
    assert client.stdout.readline().strip() == "ready"
    assert serve_process.process is not None
    serve_process.process.send_signal(signal.SIGSTOP)
    try:
        client.stdin.write("go\n")
        client.stdin.flush()
        outcomes = json.loads(client.stdout.readline())
        client.wait(30)
    finally:
        serve_process.process.send_signal(signal.SIGCONT)
    assert [o[0] for o in outcomes] == ["exec", "stream", "read_file"], outcomes
    assert all(retryable and seconds < 10 for _, retryable, seconds in outcomes), outcomes
    assert serve_process.stop() == 0
