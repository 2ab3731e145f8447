"""One NeMo Gym sandbox: a rollbox lease and what NeMo Gym expects of it.

Runs on the process's rollbox loop only (``rollbox.envs.bridge``). NeMo Gym's conventions,
kept here: a command that exits non-zero is a result, not an exception; a command that
overruns is return code 125 with ``error_type="timeout"``; a sandbox that is gone (lost,
closed, past its ``ttl_s``) is 125 with ``error_type="sandbox"``. Closing gives the
sandbox back to its pool, which resets it in place for the next caller, unless it broke.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from pathlib import Path

from nemo_gym.sandbox import SandboxEndpoint, SandboxExecResult, SandboxStatus
from rollbox.backend import Backend
from rollbox.envs.bridge import LoopThread
from rollbox.errors import (
    CapabilityNotSupportedError,
    CommandNotFoundError,
    ExecTimeoutError,
    RollboxError,
    SandboxError,
    SandboxFileNotFoundError,
    SandboxLostError,
)
from rollbox.pool import Lease, Outcome
from rollbox.sandbox import ExecResult, Sandbox, Snapshot
from rollbox_remote.backend import RemoteSandbox

from rollbox_nemo_gym.specs import MappedSpec

RUNTIME_RETURN_CODE = 125
"""NeMo Gym's return code for a command the sandbox runtime could not see through."""

_serial = itertools.count(1)
_without_bash: set[str] = set()
"""Images whose sandboxes had no bash (``shell: auto`` runs sh there right away)."""


class Box:
    """A sandbox handed to NeMo Gym: leased from a pool by ``open``, or attached by id
    (a sandbox another process made, through ``rollbox serve``); ended by ``close``."""

    def __init__(
        self, sandbox: Sandbox, lease: Lease | None, mapped: MappedSpec, backend: Backend,
        shell: str, thread: LoopThread,
    ) -> None:
        self.lease = lease
        self.mapped = mapped
        self.backend = backend
        self.shell = shell
        self.thread = thread
        """The rollbox loop this sandbox lives on: every method runs there."""
        self.rollbox_id = sandbox.id
        # Unique per hand-out: a pool reuses a sandbox (and its rollbox id) after reset,
        # and NeMo Gym must never mistake the next holder's sandbox for this one.
        self.id = f"{sandbox.id}-{next(_serial)}"
        self.sandbox = sandbox
        self.forked: Sandbox | None = None  # after resume: a fork, outside the pool
        self.snapshots: list[Snapshot] = []
        self.paused = False
        self.broken = False
        self.ended: str | None = None  # why it is over, once it is
        self._expiry: asyncio.TimerHandle | None = None
        self._closing: asyncio.Task[None] | None = None

    @classmethod
    async def open(
        cls, lease: Lease, mapped: MappedSpec, backend: Backend, shell: str, thread: LoopThread
    ) -> Box:
        """The leased sandbox with ``mapped.files`` written and its ``ttl_s`` running."""
        box = cls(lease.sandbox, lease, mapped, backend, shell, thread)
        try:
            for path, text in mapped.files.items():
                await box.sandbox.write_file(path, text.encode())
        except BaseException as exc:
            broken = isinstance(exc, SandboxError)
            await lease.release(Outcome.BROKEN if broken else Outcome.OK)
            raise
        if mapped.ttl_s is not None:
            loop = asyncio.get_running_loop()
            box._expiry = loop.call_later(mapped.ttl_s, box._expire)
        return box

    # -- commands and files --------------------------------------------------------------

    async def exec(
        self, command: str, *, cwd: str | None, env: dict[str, str] | None, timeout_s: float
    ) -> SandboxExecResult:
        if self.ended is not None:
            return _gone(f"sandbox {self.id} {self.ended}")
        if self.paused:
            return _gone(f"sandbox {self.id} is paused; resume it first")
        try:
            result = await self._run(command, cwd=cwd, env=env, timeout_s=timeout_s)
        except ExecTimeoutError as exc:
            return SandboxExecResult(
                stdout=_text(exc.stdout),
                stderr=_lines(_text(exc.stderr), f"rollbox: {exc.message}"),
                return_code=RUNTIME_RETURN_CODE,
                error_type="timeout",
            )
        except SandboxFileNotFoundError as exc:  # the cwd does not exist: as `cd` says it
            return SandboxExecResult(stdout="", stderr=f"rollbox: {exc.message}", return_code=1)
        except SandboxError as exc:
            self.broken = not isinstance(exc, CommandNotFoundError)
            return _gone(f"rollbox: {exc.message}")
        return _result(result)

    async def _run(
        self, command: str, *, cwd: str | None, env: dict[str, str] | None, timeout_s: float
    ) -> ExecResult:
        image = self.mapped.spec.image
        shell = "sh" if self.shell == "auto" and image in _without_bash else self.shell
        if shell != "auto":
            argv = ["/bin/sh" if shell == "sh" else "bash", "-c", command]
            return await self.sandbox.exec(argv, cwd=cwd, env=env, timeout=timeout_s)
        try:
            return await self.sandbox.exec(["bash", "-c", command], cwd=cwd, env=env,
                                           timeout=timeout_s)
        except CommandNotFoundError:
            _without_bash.add(image)
        return await self.sandbox.exec(["/bin/sh", "-c", command], cwd=cwd, env=env,
                                       timeout=timeout_s)

    async def upload(self, source: Path, target: str) -> None:
        self._usable()
        await self.sandbox.upload(source, target)

    async def download(self, source: str, target: Path) -> None:
        self._usable()
        await asyncio.to_thread(target.parent.mkdir, parents=True, exist_ok=True)
        await self.sandbox.download(source, target)

    async def endpoint(self, port: int) -> SandboxEndpoint:
        """Where the host reaches ``port`` inside (declared in the spec's ``ports``)."""
        if port not in self.mapped.ports:
            raise ValueError(f"sandbox port {port} was not declared in SandboxSpec.ports; "
                             f"declared ports: {list(self.mapped.ports)}")
        self._usable()
        found = await self.sandbox.endpoint(port)
        return SandboxEndpoint(endpoint=found.url, headers=dict(found.headers))

    async def status(self) -> SandboxStatus:
        if self.ended is not None:
            return SandboxStatus.STOPPED
        if self.paused:
            return SandboxStatus.PAUSED
        if self.broken:
            return SandboxStatus.ERROR
        return SandboxStatus.RUNNING if await self.sandbox.ping() else SandboxStatus.ERROR

    # -- pause and resume: a snapshot of the files, the sandbox itself given back ---------

    async def pause(self) -> None:
        if self.paused and self.ended is None:
            return
        self._usable()
        caps = self.backend.capabilities
        if not (caps.snapshot and caps.fork):
            raise CapabilityNotSupportedError(
                f"backend {self.backend.name!r} cannot pause a sandbox (it needs snapshot and "
                "fork); keep the sandbox running instead"
            )
        self.snapshots.append(await self.sandbox.snapshot())
        await self._give_back()
        self.paused = True

    async def resume(self) -> None:
        if self.ended is not None:
            raise SandboxLostError(f"sandbox {self.id} {self.ended}", sandbox_id=self.id)
        if not self.paused:
            return
        self.forked = self.sandbox = await self.backend.fork(self.snapshots[-1])
        self.paused = False

    # -- the end ---------------------------------------------------------------------------

    async def close(self) -> None:
        """End it (idempotent, concurrent calls wait for the same end)."""
        if self._closing is None:
            self._closing = asyncio.ensure_future(self._close())
        await asyncio.shield(self._closing)

    async def _close(self) -> None:
        if self.ended is None:
            self.ended = "was stopped"
        if self._expiry is not None:
            self._expiry.cancel()
        try:
            await self._give_back()
        finally:
            for snapshot in reversed(self.snapshots):
                with contextlib.suppress(RollboxError, OSError):
                    await self.backend.drop_snapshot(snapshot)
            self.snapshots.clear()

    async def _give_back(self) -> None:
        """Back to the pool (reset in place) if sound; a fork or an attached sandbox is
        closed (an attached one goes back to its server's pool)."""
        if self.forked is not None:
            forked, self.forked = self.forked, None
            with contextlib.suppress(RollboxError, OSError):
                await forked.close()
        elif self.lease is not None:
            if not self.lease.released:
                await self.lease.release(Outcome.BROKEN if self.broken else Outcome.OK)
        elif not self.paused:
            with contextlib.suppress(RollboxError, OSError):
                await self.sandbox.close()

    async def let_go(self) -> None:
        """Stop using a sandbox attached from another process without ending it (its
        creator does): what this process opened for it (port relays) closes."""
        if self.ended is None:
            self.ended = "was let go by this process; its creator still holds it"
        if isinstance(self.sandbox, RemoteSandbox) and self.lease is None:
            with contextlib.suppress(RollboxError, OSError):
                await self.sandbox.detach()

    def _expire(self) -> None:
        self._expiry = None
        if self.ended is None:
            self.ended = f"reached its ttl_s of {self.mapped.ttl_s:g}s and was ended"
            self._closing = asyncio.ensure_future(self._close())

    def _usable(self) -> None:
        if self.ended is not None:
            raise SandboxLostError(f"sandbox {self.id} {self.ended}", sandbox_id=self.id)
        if self.paused:
            raise SandboxLostError(f"sandbox {self.id} is paused; resume it first",
                                   sandbox_id=self.id)


def _result(result: ExecResult) -> SandboxExecResult:
    stdout, stderr = _text(result.stdout), _text(result.stderr)
    for stream, cut in (("stdout", result.stdout_truncated), ("stderr", result.stderr_truncated)):
        if cut:
            stderr = _lines(stderr, f"rollbox: {stream} was cut at the sandbox's output limit")
    code = result.exit_code
    # -N (killed by signal N) as a shell and `docker exec` report it.
    return SandboxExecResult(stdout=stdout, stderr=stderr,
                             return_code=code if code >= 0 else 128 - code)


def _gone(message: str) -> SandboxExecResult:
    return SandboxExecResult(stdout=None, stderr=message, return_code=RUNTIME_RETURN_CODE,
                             error_type="sandbox")


def _lines(text: str, note: str) -> str:
    """``note`` on a line of its own after ``text``."""
    if text and not text.endswith("\n"):
        text += "\n"
    return text + note


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace")
