"""A process that owns sandboxes and dies without closing them (``kill -9``, the OOM
killer), for the crash-cleanup test.

The owner runs in a fresh interpreter: the backend's ``owner_script()`` (which defines
``make_backend()``) followed by ``DRIVER``. It makes a busy sandbox (a command running,
a daemon left behind) and an idle one (and a snapshot where the backend can), prints
what it holds, and waits to be killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pickle
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

from rollbox import SandboxSpec

DRIVER = """

import asyncio, json, pickle, sys


async def _own(marker, spec):
    backend = make_backend()
    busy = await backend.create(spec)
    idle = await backend.create(spec)
    if backend.capabilities.shell:
        # Loops of short sleeps: every process that lives long has the marker in its
        # command line (the test kills what survives, a sleep of 1 s ends by itself).
        loop = f"sh -c 'while :; do sleep 1; done' {marker} </dev/null >/dev/null 2>&1"
        await busy.exec(f"(setsid {loop} &)", timeout=60)
        running = busy.exec(loop, timeout=600)
    else:
        running = busy.exec(["sleep", "300"], timeout=600)
    task = asyncio.ensure_future(running)
    snapshots = []
    if backend.capabilities.snapshot:
        await idle.write_file("/tmp/rbx-owned.txt", b"owned")
        snapshots.append(await idle.snapshot())
    await asyncio.sleep(0.5)
    report = {"leftovers": await backend.leftovers(),
              "snapshot_meta": [dict(s.meta) for s in snapshots]}
    print(json.dumps(report), flush=True)
    await task


if __name__ == "__main__":
    asyncio.run(_own(sys.argv[1], pickle.loads(bytes.fromhex(sys.argv[2]))))
"""


@dataclass
class Owner:
    """The owner process, started from ``script`` (which defines ``make_backend()``)."""

    script: str
    marker: str
    spec: SandboxSpec
    directory: Path
    process: asyncio.subprocess.Process | None = None

    async def start(self, timeout: float) -> dict[str, list[str]]:
        """Start the owner; return what it reported holding once it is set up."""
        program = self.directory / "owner.py"
        program.write_text(self.script + DRIVER)
        self.process = await asyncio.create_subprocess_exec(
            sys.executable, str(program), self.marker, pickle.dumps(self.spec).hex(),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            start_new_session=True)
        assert self.process.stdout is not None and self.process.stderr is not None
        try:
            async with asyncio.timeout(timeout):
                line = await self.process.stdout.readline()
        except TimeoutError:
            line = b""
        if not line:
            self.kill()
            err = await self.process.stderr.read()
            raise AssertionError(f"the owner process did not set up its sandboxes in "
                                 f"{timeout:.0f}s: {err.decode(errors='replace')[-3000:]}")
        report: dict[str, list[str]] = json.loads(line)
        return report

    def kill(self) -> None:
        """SIGKILL the owner alone (not its process group: what it started must notice
        by itself)."""
        if self.process is not None and self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGKILL)

    async def wait(self) -> None:
        if self.process is not None:
            await self.process.wait()


def named_paths(report: dict[str, list]) -> list[str]:  # type: ignore[type-arg]
    """Absolute paths the owner named as its own: in its ``leftovers()`` lines, and
    snapshot meta values that are one absolute path."""
    paths = [word.rstrip(",;:)") for line in report["leftovers"] for word in line.split()
             if word.startswith("/")]
    paths += [value for meta in report["snapshot_meta"] for value in meta.values()
              if isinstance(value, str) and value.startswith("/") and os.pathsep not in value]
    return sorted(set(paths))
