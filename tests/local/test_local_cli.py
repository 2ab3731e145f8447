"""The ``rollbox`` command against the local backend, run as a real subprocess
(``python -m rollbox``) with its own ``ROLLBOX_HOME``."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rollbox_local.oci_build import write_docker_archive, write_oci_layout


def rollbox(*args: str, home: Path, timeout: float = 60,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLBOX_")}
    full_env.update(ROLLBOX_HOME=str(home), **(env or {}))
    return subprocess.run([sys.executable, "-m", "rollbox", *args], capture_output=True,
                          text=True, timeout=timeout, env=full_env)


class Listener:
    """A TCP listener on the host's loopback that records whether anyone connected."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            conn.sendall(b"host-listener\n")
            conn.close()

    def close(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        self.sock.close()
        self._thread.join(timeout=5)


@pytest.fixture
def listener() -> Iterator[Listener]:
    listener = Listener()
    try:
        yield listener
    finally:
        listener.close()


def test_run_passes_output_and_exit_code_through(state_dir: Path) -> None:
    result = rollbox("run", "--", "sh", "-c", "echo out; echo err >&2; exit 7", home=state_dir)
    assert (result.returncode, result.stdout, result.stderr) == (7, "out\n", "err\n")


def test_run_death_by_signal_is_128_plus_n(state_dir: Path) -> None:
    result = rollbox("run", "--", "sh", "-c", "kill -TERM $$", home=state_dir)
    assert result.returncode == 128 + 15


def test_run_timeout_exits_124_and_kills_the_command(state_dir: Path) -> None:
    started = time.monotonic()
    result = rollbox("run", "--timeout", "0.5", "--", "sh", "-c", "echo begun; sleep 30",
                     home=state_dir)
    assert result.returncode == 124
    assert time.monotonic() - started < 15
    assert "begun" in result.stdout and "timed out" in result.stderr


def test_run_network_none_blocks_and_host_reaches(state_dir: Path, listener: Listener) -> None:
    code = (f"import socket; s = socket.create_connection(('127.0.0.1', {listener.port}), "
            "timeout=3); print(s.recv(100).decode().strip())")
    blocked = rollbox("run", "--network", "none", "--", "python3", "-c", code, home=state_dir)
    assert blocked.returncode != 0 and "host-listener" not in blocked.stdout
    assert listener.connections == 0
    reached = rollbox("run", "--network", "host", "--", "python3", "-c", code, home=state_dir)
    assert (reached.returncode, reached.stdout) == (0, "host-listener\n"), reached.stderr
    assert listener.connections == 1


def test_run_without_a_command_is_a_usage_error(state_dir: Path) -> None:
    result = rollbox("run", home=state_dir)
    assert result.returncode == 2 and "give a command" in result.stderr


def test_run_missing_program_and_unknown_image(state_dir: Path) -> None:
    missing = rollbox("run", "--", "no-such-program-rbx", home=state_dir)
    assert missing.returncode == 127 and "no-such-program-rbx" in missing.stderr
    unknown = rollbox("run", "--image", "no-such-image-rbx", "--", "true", home=state_dir)
    assert unknown.returncode == 2 and "no-such-image-rbx" in unknown.stderr


@pytest.mark.parametrize(("bwrap", "problem"), [
    ("/nonexistent/bwrap", "is not an executable file"),
    ("/bin/true", "is not bubblewrap"),  # its --version names a version too (coreutils')
])
def test_a_bad_rollbox_bwrap_is_named_by_run_and_failed_by_doctor(
        state_dir: Path, bwrap: str, problem: str) -> None:
    env = {"ROLLBOX_BWRAP": bwrap}
    run = rollbox("run", "--", "true", home=state_dir, env=env)
    assert run.returncode == 2 and f"ROLLBOX_BWRAP='{bwrap}' {problem}" in run.stderr
    doctor = rollbox("doctor", home=state_dir, env=env)
    assert doctor.returncode == 1 and "[FAIL] bubblewrap" in doctor.stdout
    assert "ROLLBOX_BWRAP" in doctor.stdout and "9.1" not in doctor.stdout
    assert "cannot run here" in doctor.stdout


def test_doctor_passes_here_and_names_what_it_checked(state_dir: Path) -> None:
    result = rollbox("doctor", home=state_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "[ok  ] bubblewrap:" in out and "user namespaces" in out
    assert "[ok  ] trial sandbox" in out and "'local' can run here" in out
    assert "FAIL" not in out


def test_images_import_ls_run_prefetch_rm_round_trip(state_dir: Path, tmp_path: Path) -> None:
    layout = write_oci_layout(tmp_path / "task", {"repo/hello.txt": b"from the image\n"},
                              base_host=True, env={"TASK": "t1"})
    archive = write_docker_archive(tmp_path / "other.tar", {"data": b"d"})

    imported = rollbox("images", "import", str(layout), "--name", "task:1", home=state_dir)
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.startswith("task:1\tsha256:") and "(over host)" in imported.stdout

    ran = rollbox("run", "--image", "task:1", "--", "sh", "-c", "cat /repo/hello.txt; echo $TASK",
                  home=state_dir)
    assert (ran.returncode, ran.stdout) == (0, "from the image\nt1\n"), ran.stderr

    prefetched = rollbox("images", "prefetch", f"docker-archive:{archive}", home=state_dir)
    assert prefetched.returncode == 0, prefetched.stderr

    listed = rollbox("images", "ls", "--json", home=state_dir)
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    assert sorted(r["refs"][0] for r in rows) == sorted(["task:1", f"docker-archive:{archive}"])
    assert all(r["pinned"] == 0 for r in rows)
    table = rollbox("images", "ls", home=state_dir)
    assert "task:1" in table.stdout and "2 image(s)" in table.stdout

    assert rollbox("images", "rm", "task:1", home=state_dir).returncode == 0
    again = rollbox("images", "rm", "task:1", home=state_dir)
    assert again.returncode == 2 and "task:1" in again.stderr
    gone = rollbox("run", "--image", "task:1", "--", "true", home=state_dir)
    assert gone.returncode == 2 and "task:1" in gone.stderr
    left = rollbox("images", "ls", "--json", home=state_dir)
    assert [json.loads(line)["refs"][0] for line in left.stdout.splitlines()] == [
        f"docker-archive:{archive}"]
    assert list((state_dir / "sandboxes").iterdir()) == []


@pytest.mark.parametrize("args", [[], ["run"], ["doctor"], ["images"], ["images", "import"]])
def test_help_everywhere(args: list[str], state_dir: Path) -> None:
    result = rollbox(*args, "--help", home=state_dir)
    assert result.returncode == 0 and result.stdout.startswith("usage: rollbox")


@pytest.mark.parametrize("value", ["abc", "-1"])
def test_malformed_image_capacity_is_a_usage_error(state_dir: Path, value: str) -> None:
    env = {"ROLLBOX_IMAGE_CAPACITY_GB": value}
    for args in (["run", "--", "true"], ["images", "ls"]):
        result = rollbox(*args, home=state_dir, env=env)
        assert result.returncode == 2, result.stderr
        assert "ROLLBOX_IMAGE_CAPACITY_GB" in result.stderr and "Traceback" not in result.stderr
