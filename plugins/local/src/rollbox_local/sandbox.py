"""A local sandbox: a bwrap instance over a copy-on-write layer, commands via the zygote.

Reset drops the writable layer: the instance is killed (the kernel kills every process
in its pid namespace), a new one starts over a fresh, empty upper directory, and the old
layer is deleted in the background. The image below is never touched.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import itertools
import os
import resource
import signal
import socket
import stat
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from rollbox.backend import ahead_of_need
from rollbox.errors import (
    CommandNotFoundError,
    ExecTimeoutError,
    ResetFailedError,
    SandboxError,
    SandboxFileNotFoundError,
    SandboxLostError,
    SnapshotFailedError,
    UsageError,
    WorkloadError,
)
from rollbox.sandbox import (
    Endpoint,
    ExecRequest,
    ExecResult,
    OutputChunk,
    Process,
    Sandbox,
    Snapshot,
    resolve_path,
)
from rollbox.spec import MiB, Network, Resources, SandboxSpec

from rollbox_local.execution import Execution
from rollbox_local.fileops import FileOps
from rollbox_local.generation import Generation, boot_generation, cgroup_name
from rollbox_local.ports import PortRelays
from rollbox_local.statuspipe import StatusLine
from rollbox_local.zygote import AgentChannel

if TYPE_CHECKING:
    from rollbox_local.backend import LocalBackend
    from rollbox_local.images import Image

STANDBY_DELAY_S = 0.005
RETIRE_DELAY_S = 0.05
"""How long a reset lets the old generation of a sandbox without network live on.

Killing a generation makes the kernel tear down its namespaces and overlay mount at
once, on the CPU the next rollout's first command needs. The old generation shares
nothing writable with the fresh one (own mount, pid, net and user namespaces, own
upper layer) and, without network, cannot reach anything outside, so it is killed a
moment later, off that command's path. With ``network="host"`` it is killed at once."""

DELIVERY_ATTEMPTS = 3
"""How often a command is sent when no helper takes it up (``_undelivered``)."""
AGENT_EXIT_GRACE_S = 0.5
"""How long a request whose helper died waits to see whether the agent is dying too."""
KILL_CONFIRM_S = 0.45
"""How long a timed-out command's helper has to confirm its tree is dead before the
agent kills the helper itself, and the agent then to have done so: a timeout is
enforced within a second, whatever the sandbox's processes do to its helpers."""


class LocalSandbox(Sandbox):
    def __init__(
        self,
        backend: LocalBackend,
        sandbox_id: str,
        spec: SandboxSpec,
        image: Image,
        directory: Path,
        lowers: tuple[Path, ...],
    ) -> None:
        super().__init__(sandbox_id, spec)
        self.base_env = dict(image.env)
        self.backend = backend
        self.image = image
        self.directory = directory
        self.lowers = lowers
        self.resources = backend.resources_for(spec)
        self.rlimits = _rlimits(self.resources, memory_by_cgroup=backend.cgroups is not None)
        self._current: Generation | None = None
        self._standby: asyncio.Task[Generation] | None = None
        self._standby_cgroup: str | None = None
        self._numbers = itertools.count()
        self._request_ids = itertools.count(1)
        self._standby_due = False
        self._closed = False
        self._teardown: asyncio.Future[None] | None = None
        self._retiring: set[Generation] = set()
        self._stopping: set[asyncio.Task[None]] = set()
        self.files = FileOps(self)
        self.ports = PortRelays(sandbox_id, self.open_port)
        """The host side of ``endpoint``: a loopback relay per exposed port."""

    # -- lifecycle -----------------------------------------------------------------------

    async def boot(self) -> None:
        self._current = await boot_generation(self, next(self._numbers),
                                              background=ahead_of_need())

    def _live(self) -> Generation:
        if self._closed:
            raise SandboxLostError(f"sandbox {self.id} is closed", sandbox_id=self.id)
        current = self._current
        if current is None or not current.alive:
            raise self.died("its init process is gone; acquire a new one")
        return current

    def died(self, why: str) -> SandboxError:
        """The error for a generation that died: the workload's doing where the kernel
        killed it for the sandbox's own memory limit (``WorkloadError``, an outcome),
        else ``SandboxLostError`` (retryable)."""
        current, cgroups = self._current, self.backend.cgroups
        if (current is not None and current.cgroup is not None and cgroups is not None
                and cgroups.oom_kills(current.cgroup)):
            return WorkloadError(
                f"sandbox {self.id} died ({why}): its processes exhausted its memory "
                f"(resources.memory_mb={self.resources.memory_mb}) and the kernel killed "
                "its init; this counts as the rollout's outcome", sandbox_id=self.id,
                cause="memory")
        return SandboxLostError(f"sandbox {self.id} died ({why})", sandbox_id=self.id)

    def _schedule_standby(self) -> None:
        if self._standby is None and not self._standby_due:
            self._standby_due = True
            asyncio.get_running_loop().call_later(
                STANDBY_DELAY_S, self._prepare_standby, self._current)

    def _prepare_standby(self, for_generation: Generation | None) -> None:
        """In use: boot the next generation meanwhile, so that reset is a swap.

        Scheduled STANDBY_DELAY_S after a generation's first command starts: a quick
        first command (the one TTFC measures) is over before the boot competes for the
        CPU, and a long one gives the standby its run time as a head start (booting it
        only once the first command had ended made a reset right after a 40 ms command
        wait 31 ms for the boot)."""
        self._standby_due = False
        in_use = for_generation is not None and self._current is for_generation
        if self._standby is None and not self._closed and in_use:
            number = next(self._numbers)
            self._standby_cgroup = cgroup_name(self, number)
            self._standby = asyncio.ensure_future(
                boot_generation(self, number, agent=True, background=True))

    async def prepare(self) -> None:
        """Start the agent now rather than with the first command (about 2 ms). A pool
        prepares what it warms ahead of need: that is not a use (the generation keeps a
        standby's CPU weight)."""
        await self._agent(use=False)

    async def ping(self) -> bool:
        return not self._closed and self._current is not None and self._current.alive

    async def reset(self) -> None:
        if self._closed:
            raise ResetFailedError(f"sandbox {self.id} is closed", sandbox_id=self.id)
        await self.ports.reset()  # a reset sandbox exposes nothing
        old, standby = self._current, self._standby
        self._current, self._standby = None, None
        if old is not None:
            self._retiring.add(old)
            delay = RETIRE_DELAY_S if self.spec.network is Network.NONE else 0.0
            asyncio.get_running_loop().call_later(delay, self._retire, old)
        try:
            if standby is not None:
                if not standby.done():  # the reset waits for it now
                    self.backend.put_to_use(self._standby_cgroup)
                try:
                    fresh = await standby
                except SandboxError:
                    fresh = await boot_generation(self, next(self._numbers), agent=True)
            else:
                fresh = await boot_generation(self, next(self._numbers), agent=True)
        except SandboxError as exc:
            raise ResetFailedError(f"sandbox {self.id} did not come back: {exc.message}",
                                   sandbox_id=self.id) from exc
        if not fresh.alive:
            await fresh.stop()
            raise ResetFailedError(f"sandbox {self.id}'s fresh generation died at once",
                                   sandbox_id=self.id)
        self._current = fresh
        if self.spec.reset_command is not None:
            await self._run_reset_command(self.spec.reset_command)

    async def _run_reset_command(self, command: str) -> None:
        """The spec's ``reset_command`` runs after the layer is dropped, as on every
        backend that resets in place (here the image's state is already back)."""
        try:
            result = await self.exec(command, timeout=self.spec.timeouts.reset_s)
        except SandboxError as exc:
            raise ResetFailedError(f"sandbox {self.id}: reset_command failed: {exc.message}",
                                   sandbox_id=self.id) from exc
        if not result.ok:
            raise ResetFailedError(
                f"sandbox {self.id}: reset_command exited {result.exit_code}: "
                f"{result.stderr[-300:].decode(errors='replace')}", sandbox_id=self.id)

    def _retire(self, old: Generation) -> None:
        """Kill a replaced generation now (if close has not); its teardown is waited for
        off the hot path."""
        if old in self._retiring:
            self._retiring.discard(old)
            old.signal_kill()
            self.backend.discard(old)

    async def close(self) -> None:
        """Stop every generation. The teardown runs to its end even if the caller is
        cancelled (a cancelled close must not leave the processes running and the
        sandbox marked closed); a second close waits for the same teardown."""
        if self._teardown is None:
            self._closed = True
            self._teardown = asyncio.ensure_future(self._tear_down())
        await asyncio.shield(self._teardown)

    async def _tear_down(self) -> None:
        for task in self._stopping:
            task.cancel()
        await self.ports.aclose()
        for old in list(self._retiring):
            self._retire(old)
        generations = [self._current] if self._current is not None else []
        if self._standby is not None:  # let it finish booting, then stop it with the rest
            with contextlib.suppress(SandboxError):
                generations.append(await self._standby)
        self._current = self._standby = None
        try:
            for generation in generations:
                await generation.stop()
            self.backend.remove_later(self.directory)
        finally:
            self.backend.forget(self)  # even if cleanup failed: never report it as open

    # -- commands ------------------------------------------------------------------------

    async def _agent(self, *, use: bool = True) -> AgentChannel:
        try:
            generation = self._live()
            if use:
                # After this turn of the loop: the caller sends its request first, and
                # the weight's write (0.1-0.3 ms of cgroupfs) overlaps the agent's work.
                asyncio.get_running_loop().call_soon(generation.put_to_use)
            return await generation.start_agent(self)
        except SandboxError as exc:
            raise SandboxLostError(f"sandbox {self.id}: {exc.message}",
                                   sandbox_id=self.id) from exc

    async def _launch(self, agent: AgentChannel, request: ExecRequest, *,
                      on_chunk: Callable[[str, bytes], None] | None = None) -> Execution:
        stdin_r, stdin_w = os.pipe2(os.O_CLOEXEC)
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        st_r, st_w = os.pipe2(os.O_CLOEXEC)
        rid = next(self._request_ids)
        try:
            await agent.dispatch(
                rid,
                {"op": "exec", "id": rid, "argv": list(request.argv), "env": dict(request.env),
                 "cwd": request.cwd},
                [stdin_r, out_w, err_w, st_w],
            )
        except BaseException as exc:
            for fd in (stdin_w, out_r, err_r, st_r):
                os.close(fd)
            if isinstance(exc, OSError):
                raise await self.broken(f"no helper took a command ({exc.strerror or exc})") \
                    from exc
            raise
        finally:
            for fd in (stdin_r, out_w, err_w, st_w):
                os.close(fd)
        return Execution(
            request_id=rid, stdout=out_r, stderr=err_r, status=st_r, stdin=stdin_w,
            stdin_data=request.stdin, limit=request.output_limit, on_chunk=on_chunk,
        )

    def _tell(self, message: dict[str, int | str]) -> bool:
        """An order (signal, kill) for a running request; False when the sandbox's
        agent is gone (nobody is left to carry it out)."""
        agent = self._current.agent if self._current is not None else None
        if agent is None or not agent.alive:
            return False
        agent.order(int(message["id"]), message)
        return True

    async def run(self, request: ExecRequest) -> ExecResult:
        loop = asyncio.get_running_loop()
        started = loop.time()
        for _ in range(DELIVERY_ATTEMPTS):
            ex = await self._launch(await self._agent(), request)
            self._schedule_standby()
            try:
                await self._await_end(ex, request)
                ex.drain()
            finally:
                ex.close()
            if not self._undelivered(ex):
                break
        out, err = ex.captures["stdout"], ex.captures["stderr"]
        return ExecResult(
            exit_code=await self._exit_code(ex, request),
            stdout=bytes(out.data),
            stderr=bytes(err.data),
            duration_s=loop.time() - started,
            stdout_truncated=out.truncated,
            stderr_truncated=err.truncated,
        )

    def _undelivered(self, ex: Execution) -> bool:
        """No helper took the request up: its status ended before the "received" line,
        the sandbox alive. A command that kills the sandbox's other processes (a cleanup
        ``kill -9`` sweep) kills the agent's spare helpers too, and a request handed to
        one while it was dying is lost with it; sending it again runs nothing twice."""
        st = ex.status
        return (not st.received and st.exit_code is None and st.error is None
                and not st.killed and self._current is not None and self._current.alive)

    async def _await_end(self, ex: Execution, request: ExecRequest) -> None:
        try:
            async with asyncio.timeout(request.timeout_s):
                await asyncio.shield(ex.ended)
            return
        except TimeoutError:
            pass
        except asyncio.CancelledError:
            await self._kill(ex)
            raise
        await self._kill(ex)
        ex.drain()
        raise ExecTimeoutError(
            f"command {request.argv[-1][:80]!r} overran its {request.timeout_s}s timeout; it and "
            "every process it started were killed",
            sandbox_id=self.id, timeout_s=request.timeout_s,
            stdout=bytes(ex.captures["stdout"].data), stderr=bytes(ex.captures["stderr"].data),
        )

    async def _kill(self, ex: Execution) -> None:
        """Kill the command's whole tree, in about a second whatever the sandbox does.

        Its helper kills the tree and confirms. One that has not within KILL_CONFIRM_S
        (its own command keeps it stopped, or the host is short of CPU) is killed by
        the agent, which no process of the sandbox can stop or signal, and the tree with
        it (the agent kills what a killed helper leaves behind). If the agent has not
        managed that within KILL_CONFIRM_S either, the caller goes on, and the generation
        is stopped unless the helper's end comes within ``timeouts.reset_s`` (a sandbox
        merely slow to get the CPU is not lost)."""
        current = self._current
        agent = current.agent if current is not None else None
        if agent is None or not agent.alive:
            return
        agent.order(ex.request_id, {"op": "kill", "id": ex.request_id})
        if await _ends_within(ex, KILL_CONFIRM_S) or not agent.slay(ex.request_id):
            return
        if await _ends_within(ex, KILL_CONFIRM_S):
            return
        assert current is not None
        task = asyncio.ensure_future(self._stop_unless_ended(ex, current))
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    async def _stop_unless_ended(self, ex: Execution, generation: Generation) -> None:
        if not await _ends_within(ex, self.spec.timeouts.reset_s):
            await generation.stop()

    async def _exit_code(self, ex: Execution, request: ExecRequest) -> int:
        st = ex.status
        if st.error is not None:
            code, message = st.error
            missing = code in (errno.ENOENT, errno.ENOTDIR)
            if missing and "working directory" in message:
                raise SandboxFileNotFoundError(
                    f"{message}: create it first or pass an existing cwd", sandbox_id=self.id)
            if missing:
                raise CommandNotFoundError(
                    f"{message} (no such program in image {self.spec.image!r})",
                    sandbox_id=self.id,
                )
            return 126  # found but not executable, as a shell reports it
        if st.exit_code is not None:
            return st.exit_code
        current = self._current
        if current is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.wait(
                    current.exits, return_when=asyncio.FIRST_COMPLETED), AGENT_EXIT_GRACE_S)
        if current is None or not current.alive:
            raise self.died(f"while running {request.argv[-1][:80]!r}")
        return -signal.SIGKILL  # its helper was killed from inside the sandbox

    async def start(self, request: ExecRequest) -> Process:
        process = LocalProcess(self, request)
        await process.launch(await self._agent())
        self._schedule_standby()
        return process

    # -- files and ports (done by the agent, inside the sandbox: fileops.py) ---------------

    @property
    def file_limit_bytes(self) -> int:
        return (self.resources.file_size_mb or 0) * MiB

    async def agent_for_io(self) -> AgentChannel:
        return await self._agent()

    def next_request_id(self) -> int:
        return next(self._request_ids)

    def tell_agent(self, message: dict[str, int | str]) -> bool:
        return self._tell(message)

    def lost(self, why: str) -> SandboxLostError:
        return SandboxLostError(f"sandbox {self.id}: {why}; retry on a fresh sandbox",
                                sandbox_id=self.id)

    async def broken(self, why: str) -> SandboxError:
        """The error for a request whose helper went away before it answered.

        If the sandbox died, ``died``'s. If its agent lives on, ``WorkloadError``: only
        the sandbox's own processes (or its memory limit) kill helpers. A dying agent
        takes its helpers with it before it is seen to exit, so that is waited for first
        (as ``_exit_code`` does)."""
        current = self._current
        if current is not None and current.alive:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.wait(
                    current.exits, return_when=asyncio.FIRST_COMPLETED), AGENT_EXIT_GRACE_S)
        if self._closed:
            return self.lost("it was closed meanwhile")
        if current is None or not current.alive or current is not self._current:
            return self.died(why)
        return WorkloadError(
            f"sandbox {self.id}: {why}: its own processes killed the helpers rollbox runs "
            "requests through (or its memory limit did); this counts as the rollout's "
            "outcome", sandbox_id=self.id, cause="helpers")

    async def read_file(self, path: str) -> bytes:
        return await self.files.read(resolve_path(path, self.spec.workdir))

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        await self.files.write(resolve_path(path, self.spec.workdir), data, mode & 0o7777)

    async def upload(self, local: str | Path, remote: str) -> None:
        source = Path(local)
        try:
            mode = (await asyncio.to_thread(source.stat)).st_mode
        except OSError as exc:
            raise UsageError(f"cannot upload {source}: {exc.strerror}") from exc
        if not stat.S_ISREG(mode):
            raise UsageError(f"cannot upload {source}: not a regular file")
        await self.files.upload(source, resolve_path(remote, self.spec.workdir), mode & 0o7777)

    async def download(self, remote: str, local: str | Path) -> None:
        target = Path(local)
        try:
            await asyncio.to_thread(target.touch)
        except OSError as exc:
            raise UsageError(f"cannot download to {target}: {exc.strerror}") from exc
        await self.files.download(resolve_path(remote, self.spec.workdir), target)

    async def open_port(self, port: int) -> socket.socket:
        """A new connection to ``port`` on the sandbox's own loopback (its network
        namespace: a sandbox without network is reachable this way and no other).

        The in-sandbox agent connects and passes the socket back; raises
        PortNotOpenError when nothing accepts connections there."""
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise UsageError(f"port must be an int in 1..65535, got {port!r}")
        return await self.files.connect(port)

    async def endpoint(self, port: int) -> Endpoint:
        """A loopback address on the host relayed to ``port`` inside (``ports.py``)."""
        self._live()
        return await self.ports.endpoint(port)

    # -- the end of the workload ---------------------------------------------------------

    async def seal(self) -> None:
        """Kill every process of the current generation but its agent (helpers
        included: fresh ones serve what comes next) and keep its files. A generation
        whose agent never started ran nothing, so nothing lives in it."""
        generation = self._live()
        if generation.agent is None and not generation.booting_agent:
            return
        agent = await self._agent(use=False)
        try:
            await agent.seal(self.spec.timeouts.reset_s)
        except (OSError, TimeoutError) as exc:
            await generation.stop()
            why = exc.strerror if isinstance(exc, OSError) else "the agent did not answer"
            raise self.lost(f"its processes could not all be ended ({why})") from exc

    # -- snapshots -----------------------------------------------------------------------

    async def snapshot(self) -> Snapshot:
        """A frozen copy of the writable layer. The sandbox's processes are stopped
        while it is copied, so they cannot change (or swap symlinks into) what is read."""
        generation = self._live()
        await self._freeze(generation, True)
        try:
            return await self.backend.snapshot_of(self, generation)
        finally:
            with contextlib.suppress(SandboxError):
                await self._freeze(generation, False)

    async def _freeze(self, generation: Generation, stop: bool) -> None:
        """Through the generation's cgroup freezer where there is one, else by the
        agent stopping every process of the sandbox."""
        cgroups = self.backend.cgroups
        if cgroups is not None and generation.cgroup is not None:
            try:
                done = await asyncio.to_thread(cgroups.freeze, generation.cgroup, stop)
            except OSError as exc:
                done, why = False, exc.strerror
            else:
                why = "the kernel did not report it done"
            if not done:
                raise SnapshotFailedError(
                    f"could not {'freeze' if stop else 'thaw'} sandbox {self.id}: {why}",
                    sandbox_id=self.id)
            return
        await self._freeze_by_agent(stop)

    async def _freeze_by_agent(self, stop: bool) -> None:
        agent = await self._agent()
        st_r, st_w = os.pipe2(os.O_CLOEXEC)
        try:
            agent.send({"op": "freeze" if stop else "thaw"}, [st_w])
        except OSError as exc:
            os.close(st_r)
            raise self.died(f"its agent stopped answering: {exc}") from exc
        finally:
            os.close(st_w)
        status = StatusLine(st_r)
        try:
            async with asyncio.timeout(self.spec.timeouts.reset_s):
                outcome = await status.final
        except TimeoutError:
            outcome = None
        finally:
            status.close()
        if outcome is None or outcome.tag != "X":
            why = outcome.rest if outcome is not None else "no answer"
            raise SnapshotFailedError(f"could not {'stop' if stop else 'continue'} the "
                                      f"processes of sandbox {self.id}: {why}",
                                      sandbox_id=self.id)


class LocalProcess(Process):
    """A streaming command: chunks as they arrive, stdin, signals.

    Like ``run``, it sends a request again that no helper took up (see
    ``LocalSandbox._undelivered``), with whatever was written to its stdin meanwhile:
    until the "received" line that stdin is kept, since no command has read it."""

    _ex: Execution
    _watchdog: asyncio.Future[None]

    def __init__(self, sandbox: LocalSandbox, request: ExecRequest) -> None:
        self._sandbox = sandbox
        self._request = request
        self._queue: asyncio.Queue[OutputChunk | None] = asyncio.Queue()
        self._budget = {"stdout": request.output_limit, "stderr": request.output_limit}
        self.truncated = False
        self._code: int | None = None
        self._unreceived_stdin = bytearray()
        self._stdin_ended = False

    async def launch(self, agent: AgentChannel) -> None:
        self._ex = await self._relaunch(agent)
        # Enforces the timeout from the start, whether or not anyone is waiting yet.
        self._watchdog = asyncio.ensure_future(self._supervise())

    async def _relaunch(self, agent: AgentChannel) -> Execution:
        ex = await self._sandbox._launch(agent, self._request, on_chunk=self._chunk)
        if self._unreceived_stdin:
            ex.feed_stdin(bytes(self._unreceived_stdin))
        if self._stdin_ended:
            ex.end_stdin()
        return ex

    async def _supervise(self) -> None:
        """Until the command's end (or its timeout): send the request again while no
        helper took it up. Then the stream ends once the command's pipes close, or
        shortly after its end (background processes may keep them open)."""
        try:
            for attempt in range(1, DELIVERY_ATTEMPTS + 1):
                ex = self._ex
                await self._sandbox._await_end(ex, self._request)
                if attempt == DELIVERY_ATTEMPTS or not self._sandbox._undelivered(ex):
                    return
                # The old one stays open (stdin written meanwhile goes nowhere, and is
                # kept) until the new one has a helper: there is always one to write to.
                self._ex = await self._relaunch(await self._sandbox._agent())
                ex.close()
        finally:
            last = self._ex
            asyncio.get_running_loop().call_later(0.05, last.close)
            last.streams_closed.add_done_callback(lambda _: self._queue.put_nowait(None))

    def _chunk(self, stream: str, data: bytes) -> None:
        room = self._budget[stream]
        if len(data) > room:
            self.truncated = True
            data = data[:room]
        self._budget[stream] = room - len(data)
        if data:
            self._queue.put_nowait(OutputChunk(stream, data))  # type: ignore[arg-type]

    async def _iterate(self) -> AsyncIterator[OutputChunk]:
        while (chunk := await self._queue.get()) is not None:
            yield chunk

    def __aiter__(self) -> AsyncIterator[OutputChunk]:
        return self._iterate()

    async def write_stdin(self, data: bytes) -> None:
        if self._ex.status.received:  # never sent again: no copy to keep
            self._unreceived_stdin.clear()
        else:
            self._unreceived_stdin += data
        self._ex.feed_stdin(data)

    async def close_stdin(self) -> None:
        self._stdin_ended = True
        self._ex.end_stdin()

    async def send_signal(self, signum: int) -> None:
        self._sandbox._tell({"op": "signal", "id": self._ex.request_id, "sig": int(signum)})

    async def wait(self) -> int:
        if self._code is None:
            try:
                await asyncio.shield(self._watchdog)
            finally:
                self._ex.drain()
            self._code = await self._sandbox._exit_code(self._ex, self._request)
        return self._code


async def _ends_within(ex: Execution, seconds: float) -> bool:
    """Whether the request ``ex`` ends (its status closes, or says how it ended)
    within ``seconds``."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(ex.ended), seconds)
    return ex.ended.done()


def _rlimits(r: Resources, *, memory_by_cgroup: bool) -> list[tuple[int, int, int]]:
    """Per-process limits. Memory is per process (RLIMIT_AS) only where no cgroup holds
    the sandbox as a whole: address space is not memory, and runtimes that reserve
    much of it (Go, the JVM, V8) fail under an RLIMIT_AS they would never fill."""
    assert r.pids is not None and r.file_size_mb is not None and r.memory_mb is not None
    limits = [
        (resource.RLIMIT_NPROC, r.pids, r.pids),
        (resource.RLIMIT_FSIZE, r.file_size_mb * MiB, r.file_size_mb * MiB),
        (resource.RLIMIT_NOFILE, 4096, 4096),
        (resource.RLIMIT_CORE, 0, 0),
    ]
    if not memory_by_cgroup:
        limits.append((resource.RLIMIT_AS, r.memory_mb * MiB, r.memory_mb * MiB))
    if r.cpu_seconds is not None:
        limits.append((resource.RLIMIT_CPU, r.cpu_seconds, r.cpu_seconds))
    return limits
