"""``rollbox run`` wired to the terminal: stdin in, output out, nothing cut silently."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import time
from pathlib import Path

import pytest
from cli_support import SCRIPT, Rollbox, cli_env


def test_piped_stdin_reaches_the_command_and_ends(rollbox: Rollbox) -> None:
    result = rollbox("run", "--timeout", "30", "--", "cat", input="hi\nthere\n")
    assert (result.returncode, result.stdout) == (0, "hi\nthere\n"), result.stderr


def test_dev_null_stdin_is_an_immediate_end(rollbox: Rollbox) -> None:
    started = time.monotonic()
    result = rollbox("run", "--timeout", "30", "--", "cat", stdin=subprocess.DEVNULL)
    assert (result.returncode, result.stdout) == (0, ""), result.stderr
    assert time.monotonic() - started < 25, "cat waited for input that never comes"


def test_a_file_as_stdin_is_passed_whole(rollbox: Rollbox, tmp_path: Path) -> None:
    data = os.urandom(300_000).hex()  # bigger than a pipe buffer
    (tmp_path / "in.txt").write_text(data)
    with open(tmp_path / "in.txt") as stdin:
        result = rollbox("run", "--timeout", "30", "--", "sh", "-c", "wc -c", stdin=stdin)
    assert (result.returncode, result.stdout.strip()) == (0, str(len(data))), result.stderr


def test_a_command_that_ignores_stdin_does_not_wait_for_it(rollbox: Rollbox) -> None:
    """A pipe that never closes (a terminal left alone, say) does not hold the run."""
    read_end, write_end = os.pipe()
    try:
        result = rollbox("run", "--timeout", "30", "--", "echo", "done", stdin=read_end)
    finally:
        os.close(read_end)
        os.close(write_end)
    assert (result.returncode, result.stdout) == (0, "done\n"), result.stderr


def test_a_terminal_as_stdin_is_passed_line_by_line_until_ctrl_d(home: Path) -> None:
    controller, terminal = pty.openpty()
    process = subprocess.Popen([str(SCRIPT), "run", "--timeout", "30", "--", "cat"],
                               stdin=terminal, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env=cli_env(home))
    os.close(terminal)
    try:
        time.sleep(1.0)  # let it start; typing earlier would be buffered by the tty anyway
        os.write(controller, b"typed line\n")
        os.write(controller, b"\x04")  # Ctrl-D at the start of a line: end of input
        _drain(controller, until=lambda: process.poll() is not None, seconds=25)
        out, err = process.communicate(timeout=5)
    finally:
        process.kill()
        os.close(controller)
    assert process.returncode == 0, err
    assert out == b"typed line\n"


def _drain(fd: int, *, until: object, seconds: float) -> None:
    """Read the terminal's echo so the pty never fills, until ``until()`` or timeout."""
    deadline = time.monotonic() + seconds
    while not until() and time.monotonic() < deadline:  # type: ignore[operator]
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                os.read(fd, 4096)
            except OSError:
                return


def test_output_over_the_cap_is_announced_and_fails_the_run(rollbox: Rollbox) -> None:
    result = rollbox("run", "--max-output", "1", "--", "head", "-c", "3000000", "/dev/zero")
    assert len(result.stdout) == 1024 * 1024
    assert result.returncode == 125
    assert "stdout cut at 1 MiB" in result.stderr and "--max-output" in result.stderr


def test_output_at_the_cap_is_whole_and_succeeds(rollbox: Rollbox) -> None:
    result = rollbox("run", "--max-output", "1", "--", "head", "-c", "1048576", "/dev/zero")
    assert (result.returncode, len(result.stdout), result.stderr) == (0, 1024 * 1024, "")


def test_max_output_raises_the_cap(rollbox: Rollbox) -> None:
    result = rollbox("run", "--max-output", "8", "--", "head", "-c", "6000000", "/dev/zero")
    assert (result.returncode, len(result.stdout)) == (0, 6_000_000), result.stderr


def test_a_failing_command_keeps_its_exit_code_when_output_is_cut(rollbox: Rollbox) -> None:
    result = rollbox("run", "--max-output", "0.001", "--", "sh", "-c",
                     "head -c 5000 /dev/zero >&2; exit 3")
    assert result.returncode == 3 and "stderr cut" in result.stderr


def test_a_closed_stdout_ends_the_command(home: Path) -> None:
    """``rollbox run -- yes | head -1``: as SIGPIPE would, not after the timeout."""
    started = time.monotonic()
    pipeline = subprocess.run(
        f"'{SCRIPT}' run --timeout 60 -- yes | head -1; echo \"status ${{PIPESTATUS[0]}}\"",
        shell=True, executable="/bin/bash", capture_output=True, text=True, timeout=90,
        env=cli_env(home))
    assert pipeline.stdout == "y\nstatus 141\n", pipeline.stderr
    assert "Traceback" not in pipeline.stderr
    assert time.monotonic() - started < 45


def test_help_states_the_default_timeout(rollbox: Rollbox) -> None:
    result = rollbox("run", "--help")
    assert "(default: 600.0)" in result.stdout and "exit 124" in result.stdout


@pytest.mark.parametrize(("argv", "message"), [
    (["--", ""], "program name (command argument 0) is empty"),
    (["--", "echo", "a\x01b"], None),  # control characters other than NUL are fine
])
def test_a_bad_command_is_refused_before_a_sandbox(rollbox: Rollbox, argv: list[str],
                                                   message: str | None) -> None:
    result = rollbox("run", *argv)
    if message is None:
        assert result.returncode == 0, result.stderr
    else:
        assert result.returncode == 2 and message in result.stderr
        assert "retry" not in result.stderr and "died" not in result.stderr


@pytest.mark.parametrize("closed", ["<&-", ">&-", "2>&-"])
def test_a_closed_standard_stream_is_no_problem(home: Path, closed: str) -> None:
    """``rollbox run ... >&-``: the sandbox still starts (helpers the backend starts must
    not find a closed fd 1 or 2) and the command's exit code comes through."""
    script = (f"'{SCRIPT}' run --timeout 30 -- sh -c 'echo out; echo err >&2; exit 3' "
              f"{closed}; echo \"status $?\" >&2")
    result = subprocess.run(script, shell=True, executable="/bin/bash", capture_output=True,
                            text=True, timeout=90, env=cli_env(home))
    assert "status 3" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and "failed to start" not in result.stderr
