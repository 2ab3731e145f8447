"""A process that exits with shared pools open closes them cleanly: the bridge's exit
hook runs before concurrent.futures stops taking work (closing a local sandbox deletes
its layer through a thread pool)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PROGRAM = """
from rollbox import SandboxSpec
from rollbox.envs.pools import registry

thread, pools = registry()
shared = thread.run(pools.attach("local", {}, {}))
lease = thread.run(shared.pool.acquire(SandboxSpec()))
assert thread.run(lease.sandbox.exec("true")).ok
print("left open")
"""


def test_pools_left_open_at_exit_close_without_errors(state_dir: Path) -> None:
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "ROLLBOX_HOME": str(state_dir)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "left open"
    assert "Traceback" not in done.stderr, done.stderr
