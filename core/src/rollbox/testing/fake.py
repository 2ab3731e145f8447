"""An in-memory backend for fast tests and for third parties (like httpx.MockTransport).

Files live in a dict, commands go to a ``handler`` you pass (or to a tiny built-in
interpreter of ``true``, ``false``, ``echo``, ``cat``, ``sleep``, ``exit``, ``pwd``,
``env``). Delays use ``asyncio.sleep``, so the fake runs in virtual time too. Faults are
injected by hand: ``fail_creates``, ``kill(sandbox_id)``.
"""

from __future__ import annotations

import asyncio
import itertools
import shlex
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

from rollbox.backend import Backend
from rollbox.errors import (
    CommandNotFoundError,
    CreateFailedError,
    ExecTimeoutError,
    ImageNotFoundError,
    SandboxFileNotFoundError,
    SandboxLostError,
)
from rollbox.sandbox import (
    Capabilities,
    ExecRequest,
    ExecResult,
    OutputChunk,
    Process,
    Sandbox,
    Snapshot,
    resolve_path,
)
from rollbox.spec import SandboxSpec

Handler = Callable[["FakeSandbox", ExecRequest], Awaitable[ExecResult]]


class FakeSandbox(Sandbox):
    def __init__(self, backend: FakeBackend, sandbox_id: str, spec: SandboxSpec,
                 files: Mapping[str, bytes]) -> None:
        super().__init__(sandbox_id, spec)
        self.backend = backend
        self.base = dict(files)
        self.files = dict(files)
        self.lost = False
        self.closed = False
        self.exec_count = 0
        self._gone = asyncio.Event()  # set when killed or closed: running commands end

    def _check(self) -> None:
        if self.closed:
            raise SandboxLostError(f"sandbox {self.id} is closed", sandbox_id=self.id)
        if self.lost:
            raise SandboxLostError(f"sandbox {self.id} was killed", sandbox_id=self.id)

    async def run(self, request: ExecRequest) -> ExecResult:
        self._check()
        self.exec_count += 1
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            async with asyncio.timeout(request.timeout_s):
                if self.backend.exec_delay:
                    await asyncio.sleep(self.backend.exec_delay)
                result = await self._unless_gone(self.backend.handler(self, request))
        except TimeoutError:
            raise ExecTimeoutError(
                f"command {shlex.join(request.argv)!r} overran {request.timeout_s}s",
                sandbox_id=self.id, timeout_s=request.timeout_s,
            ) from None
        self._check()
        cap = request.output_limit
        return ExecResult(
            exit_code=result.exit_code,
            stdout=result.stdout[:cap],
            stderr=result.stderr[:cap],
            duration_s=loop.time() - started,
            stdout_truncated=len(result.stdout) > cap,
            stderr_truncated=len(result.stderr) > cap,
        )

    async def _unless_gone(self, work: Awaitable[ExecResult]) -> ExecResult:
        """Run ``work``; a kill or close meanwhile ends it with SandboxLostError."""
        task = asyncio.ensure_future(work)
        gone = asyncio.ensure_future(self._gone.wait())
        try:
            await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._check()
        return task.result()

    async def start(self, request: ExecRequest) -> Process:
        self._check()
        return _FakeProcess(self, request)

    async def read_file(self, path: str) -> bytes:
        self._check()
        key = resolve_path(path, self.spec.workdir)
        if key not in self.files:
            raise SandboxFileNotFoundError(f"no file {key} in sandbox {self.id}",
                                           sandbox_id=self.id)
        return self.files[key]

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        self._check()
        self.files[resolve_path(path, self.spec.workdir)] = bytes(data)

    async def reset(self) -> None:
        self._check()
        if self.backend.reset_delay:
            await asyncio.sleep(self.backend.reset_delay)
        self.files = dict(self.base)
        self.backend.resets += 1

    async def seal(self) -> None:
        """In memory, a command runs nothing that outlives it: nothing to end."""
        self._check()
        self.backend.seals += 1

    async def snapshot(self) -> Snapshot:
        self._check()
        snap = Snapshot(id=f"snap-{next(self.backend._ids)}", spec=self.spec, backend="fake")
        self.backend.snapshots[snap.id] = dict(self.files)
        return snap

    async def ping(self) -> bool:
        return not (self.closed or self.lost)

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._gone.set()
            self.backend.live.pop(self.id, None)


class _FakeProcess(Process):
    def __init__(self, sandbox: FakeSandbox, request: ExecRequest) -> None:
        self._task = asyncio.ensure_future(sandbox.run(request))
        self._signalled: int | None = None

    async def __aiter_impl(self) -> AsyncIterator[OutputChunk]:
        result = await self._result()
        if result.stdout:
            yield OutputChunk("stdout", result.stdout)
        if result.stderr:
            yield OutputChunk("stderr", result.stderr)

    def __aiter__(self) -> AsyncIterator[OutputChunk]:
        return self.__aiter_impl()

    async def _result(self) -> ExecResult:
        try:
            return await self._task
        except asyncio.CancelledError:
            if self._signalled is None:
                raise
            return ExecResult(exit_code=-self._signalled)

    async def write_stdin(self, data: bytes) -> None:
        return None

    async def close_stdin(self) -> None:
        return None

    async def send_signal(self, signum: int) -> None:
        self._signalled = signum
        self._task.cancel()

    async def wait(self) -> int:
        return (await self._result()).exit_code


async def builtin_handler(sandbox: FakeSandbox, request: ExecRequest) -> ExecResult:
    """A very small shell: enough for lifecycle, pool and runner tests."""
    argv = list(request.argv)
    if argv[:2] == ["/bin/sh", "-c"] and len(argv) == 3:
        argv = shlex.split(argv[2])
    if not argv:
        return ExecResult(0)
    cmd, args = argv[0].rsplit("/", 1)[-1], argv[1:]
    if cmd == "true":
        return ExecResult(0)
    if cmd == "false":
        return ExecResult(1)
    if cmd == "exit":
        return ExecResult(int(args[0]) if args else 0)
    if cmd == "echo":
        return ExecResult(0, stdout=(" ".join(args) + "\n").encode())
    if cmd == "pwd":
        return ExecResult(0, stdout=(request.cwd + "\n").encode())
    if cmd == "env":
        return ExecResult(0, stdout="".join(f"{k}={v}\n" for k, v in request.env.items()).encode())
    if cmd == "cat":
        if not args and request.stdin is not None:
            return ExecResult(0, stdout=request.stdin)
        out = b""
        for name in args:
            key = resolve_path(name, request.cwd)
            if key not in sandbox.files:
                return ExecResult(1, stderr=f"cat: {name}: No such file or directory\n".encode())
            out += sandbox.files[key]
        return ExecResult(0, stdout=out)
    if cmd == "sleep":
        await asyncio.sleep(float(args[0]))
        return ExecResult(0)
    raise CommandNotFoundError(f"{cmd}: command not found in fake sandbox {sandbox.id}",
                               sandbox_id=sandbox.id)


class FakeBackend(Backend):
    """In-memory sandboxes. ``images`` maps image name → {path: bytes}."""

    name = "fake"
    capabilities = Capabilities(
        reset_in_place=True, snapshot=True, fork=True, streaming=True, signals=True,
        network_none=True,  # in memory: no network at all
        shell=False, seal=True,
    )

    def __init__(
        self,
        handler: Handler | None = None,
        *,
        images: Mapping[str, Mapping[str, bytes]] | None = None,
        create_delay: float = 0.0,
        exec_delay: float = 0.0,
        reset_delay: float = 0.0,
        fail_creates: int = 0,
    ) -> None:
        self.handler: Handler = handler or builtin_handler
        self.images: dict[str, Mapping[str, bytes]] = {"host": {}, **(images or {})}
        self.create_delay = create_delay
        self.exec_delay = exec_delay
        self.reset_delay = reset_delay
        self.fail_creates = fail_creates
        self.live: dict[str, FakeSandbox] = {}
        self.snapshots: dict[str, dict[str, bytes]] = {}
        self.created = 0
        self.resets = 0
        self.seals = 0
        self.prefetched: list[str] = []
        self._ids = itertools.count(1)

    async def create(self, spec: SandboxSpec) -> FakeSandbox:
        self.check_spec(spec)
        if spec.image not in self.images:
            raise ImageNotFoundError(
                f"fake image {spec.image!r} does not exist; pass it in FakeBackend(images=...)"
            )
        return await self._make(spec, self.images[spec.image])

    async def _make(self, spec: SandboxSpec, files: Mapping[str, bytes]) -> FakeSandbox:
        if self.create_delay:
            await asyncio.sleep(self.create_delay)
        if self.fail_creates > 0:
            self.fail_creates -= 1
            raise CreateFailedError("injected create failure (FakeBackend.fail_creates)")
        self.created += 1
        sandbox = FakeSandbox(self, f"fake-{next(self._ids)}", spec, files)
        self.live[sandbox.id] = sandbox
        return sandbox

    async def fork(self, snapshot: Snapshot) -> FakeSandbox:
        sandbox = await self._make(snapshot.spec, self.snapshots[snapshot.id])
        sandbox.base = dict(self.snapshots[snapshot.id])
        return sandbox

    async def drop_snapshot(self, snapshot: Snapshot) -> None:
        self.snapshots.pop(snapshot.id, None)

    async def prefetch(self, image: str) -> None:
        if image not in self.images:
            raise ImageNotFoundError(f"fake image {image!r} does not exist")
        self.prefetched.append(image)

    def kill(self, sandbox_id: str) -> None:
        """Simulate a sandbox dying: running commands and the next operation raise
        SandboxLostError."""
        sandbox = self.live[sandbox_id]
        sandbox.lost = True
        sandbox._gone.set()

    async def aclose(self) -> None:
        for sandbox in list(self.live.values()):
            await sandbox.close()

    async def leftovers(self) -> list[str]:
        return [f"sandbox {sandbox_id} is still open" for sandbox_id in self.live]
