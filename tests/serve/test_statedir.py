"""The state directory's record of a running server."""

from __future__ import annotations

import os
import subprocess

from rollbox_serve import statedir


def test_a_killed_server_not_yet_reaped_does_not_hold_the_state_directory() -> None:
    child = subprocess.Popen(["sleep", "60"])
    started = statedir._start_time(child.pid)
    assert statedir._alive(child.pid, started)
    child.kill()
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: a zombie
    try:
        assert not statedir._alive(child.pid, started)
    finally:
        child.wait()
    assert not statedir._alive(child.pid, started)
