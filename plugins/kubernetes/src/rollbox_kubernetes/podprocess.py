"""A command streaming over one pod-exec WebSocket: what ``KubeSandbox.start`` returns.

stdout and stderr frames are handed out as they arrive. ``write_stdin`` sends channel-0
frames; ``close_stdin`` sends the close-channel message of ``v5.channel.k8s.io``
(channel 255, then 0 for stdin). A v4-only API server (Kubernetes < 1.30) has no such
message: there ``close_stdin`` raises CapabilityNotSupportedError, and a command that
reads stdin to its end runs until its timeout.

Pod exec has no signal channel, so ``send_signal`` opens a second, short exec in the
pod that signals every process whose environment carries the command's
``ROLLBOX_EXEC=<token>`` marker: the command, its process group, and whatever it started
that left the group (setsid, daemons), all in one ``kill``. If the command has not
appeared yet (its exec was only just opened), that exec looks again for up to 5 s.

Buffering is bounded: at most ``output_limit`` bytes of each stream are delivered (the
rest is dropped, as ``run`` drops it), and once more than ``HIGH_WATER`` bytes wait
unread, the socket is not read until the consumer catches up, so back-pressure reaches
the kubelet. A pending ``wait()`` lifts that pause (output then queues up to the output
limit), so waiting without iterating cannot deadlock.

The outcome is reported as ``KubeSandbox.run`` reports it: death by signal N is exit code
128+N (what pod exec reports), a timeout kills the command's tree (the ``timeout -s KILL``
wrapper, then the marker sweep) and raises ExecTimeoutError, a missing program raises
CommandNotFoundError. A WebSocket that breaks before the exit status arrives raises
SandboxLostError, from the iterator as well as from ``wait()``, after the command's
processes were swept (closing an exec stream does not stop them on Kubernetes).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shlex
import signal
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Literal

import aiohttp
from rollbox.errors import (
    CapabilityNotSupportedError,
    CommandNotFoundError,
    ExecTimeoutError,
    SandboxError,
    SandboxLostError,
)
from rollbox.sandbox import ExecRequest, OutputChunk, Process

from rollbox_kubernetes.client import ApiError
from rollbox_kubernetes.podexec import (
    CLOSE,
    DEADLINE_GRACE_S,
    STATUS,
    STDERR,
    STDIN,
    STDOUT,
    V5,
    exit_code_of,
    open_exec,
)
from rollbox_kubernetes.render import CONTAINER

if TYPE_CHECKING:
    from rollbox_kubernetes.sandbox import KubeSandbox

HIGH_WATER = 1024 * 1024
KILLED = 128 + signal.SIGKILL
_HANDSHAKE_S = 60.0
_FRAME = 256 * 1024
_HEAD = 512
# $1 signal number, $2 the marker (NAME=token): signal every process carrying it, at once.
# Exit 1 when none appeared within 100 x 0.05 s.
_SIGNAL = """tries=0
while :; do
  pids=
  for d in /proc/[0-9]*; do
    if tr '\\0' '\\n' < "$d/environ" 2>/dev/null | grep -qx -- "$2"; then
      pids="$pids ${d#/proc/}"
    fi
  done
  if [ -n "$pids" ]; then kill -"$1" $pids 2>/dev/null; exit 0; fi
  tries=$((tries + 1)); [ "$tries" -lt 100 ] || exit 1
  sleep 0.05
done
"""
Stream = Literal["stdout", "stderr"]


async def start_process(sandbox: KubeSandbox, request: ExecRequest, argv: list[str],
                        marker: str) -> PodProcess:
    """Open the exec WebSocket for ``argv`` (already wrapped by ``argv_for``) and return
    the running process."""
    if sandbox.closed or sandbox.lost:
        raise SandboxLostError(f"sandbox {sandbox.id} is closed or its pod {sandbox.pod} is "
                               "gone", sandbox_id=sandbox.id)
    backend = sandbox.backend
    try:
        async with asyncio.timeout(_HANDSHAKE_S):
            ws = await open_exec(backend.client, backend.ws_api, backend.options.namespace,
                                 sandbox.pod, argv, container=CONTAINER, stdin=True)
    except TimeoutError:
        raise SandboxLostError(f"exec in pod {sandbox.pod} did not open within "
                               f"{_HANDSHAKE_S:g}s", sandbox_id=sandbox.id) from None
    except ApiError as err:
        raise sandbox.lost_by(err) from None
    process = PodProcess(sandbox, request, marker, ws)
    if request.stdin:
        await process.write_stdin(request.stdin)
    return process


class PodProcess(Process):
    """One command, its output streamed as it arrives; see the module docstring."""

    def __init__(self, sandbox: KubeSandbox, request: ExecRequest, marker: str,
                 ws: aiohttp.ClientWebSocketResponse) -> None:
        self._sandbox = sandbox
        self._request = request
        self._marker = marker
        self._ws = ws
        self.v5 = ws.protocol == V5
        self._started = asyncio.get_running_loop().time()
        self._chunks: asyncio.Queue[OutputChunk | None] = asyncio.Queue()
        self._backlog = 0
        self._room = asyncio.Event()
        self._room.set()
        self._waiting = False
        self._budget: dict[Stream, int] = {"stdout": request.output_limit,
                                           "stderr": request.output_limit}
        self.truncated: dict[Stream, bool] = {"stdout": False, "stderr": False}
        self._saw_stdout = False
        self._stderr_head = b""
        self._stdin_closed = False
        self._send_lock = asyncio.Lock()
        self._watchdog: asyncio.Timeout | None = None
        self._task = asyncio.ensure_future(self._pump())
        self._task.add_done_callback(self._ended)
        sandbox.processes.add(self)

    # -- the reader --------------------------------------------------------------------

    async def _pump(self) -> int:
        overran = False
        try:
            status = await self._receive()
        except TimeoutError:
            status, overran = None, True
        except (aiohttp.ClientError, ConnectionError):
            status = None  # reported as a broken stream
        finally:
            await self._ws.close()
        return await self._outcome(status, overran)

    async def _receive(self) -> dict[str, Any] | None:
        """Read frames until the exit status; None if the stream ended without one."""
        async with asyncio.timeout(self._request.timeout_s + DEADLINE_GRACE_S) as self._watchdog:
            async for msg in self._ws:
                if msg.type != aiohttp.WSMsgType.BINARY or not msg.data:
                    continue
                channel, data = msg.data[0], msg.data[1:]
                if channel == STDOUT:
                    await self._deliver("stdout", data)
                elif channel == STDERR:
                    await self._deliver("stderr", data)
                elif channel == STATUS and data:
                    try:
                        status: dict[str, Any] = json.loads(data)
                    except ValueError:
                        return {"status": "Failure", "message": "unreadable exec status"}
                    return status
        return None

    async def _deliver(self, stream: Stream, data: bytes) -> None:
        if stream == "stdout":
            self._saw_stdout = True
        elif len(self._stderr_head) < _HEAD:
            self._stderr_head += data[:_HEAD]
        room = self._budget[stream]
        if len(data) > room:
            self.truncated[stream] = True
            data = data[:room]
        if not data:
            return
        self._budget[stream] = room - len(data)
        self._backlog += len(data)
        self._chunks.put_nowait(OutputChunk(stream, data))
        if self._backlog > HIGH_WATER and not self._waiting:
            # Paused for the consumer: that time does not count against the watchdog.
            deadline = self._watchdog.when() if self._watchdog is not None else None
            self._watchdog_pause(None)
            while self._backlog > HIGH_WATER and not self._waiting:
                self._room.clear()
                await self._room.wait()
            if deadline is not None:
                now = asyncio.get_running_loop().time()
                self._watchdog_pause(max(deadline, now + DEADLINE_GRACE_S))

    async def _outcome(self, status: dict[str, Any] | None, overran: bool) -> int:
        """The exit code, or the error ``run`` would raise for the same ending."""
        sandbox, request = self._sandbox, self._request
        command = shlex.join(request.argv)
        if overran:
            await sandbox._kill_marked(self._marker)
            raise ExecTimeoutError(
                f"command {command!r} overran {request.timeout_s}s and its exec stream did "
                "not end", sandbox_id=sandbox.id, timeout_s=request.timeout_s)
        if status is None:
            await sandbox._kill_marked(self._marker)
            await sandbox._check_pod()
            raise SandboxLostError(
                f"the exec stream of {command!r} in pod {sandbox.pod} broke before the "
                "command ended; its processes were killed", sandbox_id=sandbox.id)
        code, failure = exit_code_of(status)
        if code is None:
            if "executable file not found" in failure or "no such file" in failure:
                raise CommandNotFoundError(failure, sandbox_id=sandbox.id)
            await sandbox._check_pod()
            raise SandboxLostError(f"exec in pod {sandbox.pod}: {failure}",
                                   sandbox_id=sandbox.id)
        elapsed = asyncio.get_running_loop().time() - self._started
        timed_out = elapsed >= request.timeout_s * 0.99
        if code == KILLED and not timed_out:
            await sandbox._check_pod()  # SIGKILL: the pod may be going (deleted, evicted)
            if sandbox.lost:
                raise SandboxLostError(f"pod {sandbox.pod} of sandbox {sandbox.id} went "
                                       "away during the command", sandbox_id=sandbox.id)
        if code == KILLED and timed_out:
            await sandbox._kill_marked(self._marker)
            raise ExecTimeoutError(f"command {command!r} overran {request.timeout_s}s; "
                                   "killed", sandbox_id=sandbox.id,
                                   timeout_s=request.timeout_s)
        if code == 127 and not self._saw_stdout and self._stderr_head.startswith(
            (b"timeout: failed to run command", b"env: ")
        ):
            raise CommandNotFoundError(
                f"{request.argv[0]}: command not found in image {sandbox.spec.image}",
                sandbox_id=sandbox.id)
        return code

    def _watchdog_pause(self, when: float | None) -> None:
        if self._watchdog is not None:
            self._watchdog.reschedule(when)

    def _ended(self, _: object) -> None:
        self._chunks.put_nowait(None)
        self._sandbox.processes.discard(self)

    def _broken(self) -> SandboxLostError | None:
        """The error that ended the stream early, for the iterator to raise."""
        task = self._task
        if task.cancelled():
            return SandboxLostError(f"sandbox {self._sandbox.id} was closed while the "
                                    "command ran", sandbox_id=self._sandbox.id)
        error = task.exception()
        return error if isinstance(error, SandboxLostError) else None

    # -- Process -----------------------------------------------------------------------

    async def _iterate(self) -> AsyncIterator[OutputChunk]:
        while (chunk := await self._chunks.get()) is not None:
            self._backlog -= len(chunk.data)
            if self._backlog <= HIGH_WATER:
                self._room.set()
            yield chunk
        self._chunks.put_nowait(None)  # a second iteration ends at once too
        error = self._broken()
        if error is not None:
            raise error

    def __aiter__(self) -> AsyncIterator[OutputChunk]:
        return self._iterate()

    async def _send(self, frame: bytes) -> None:
        if self._task.done() or self._ws.closed:
            return  # the command ended: like a pipe to an exited process, nobody reads
        async with self._send_lock:
            with contextlib.suppress(ConnectionError, aiohttp.ClientConnectionError):
                await self._ws.send_bytes(frame)  # a broken stream is reported by wait()

    async def write_stdin(self, data: bytes) -> None:
        if self._stdin_closed:
            raise BrokenPipeError("stdin is closed")
        for start in range(0, len(data), _FRAME):
            await self._send(bytes([STDIN]) + data[start:start + _FRAME])

    async def close_stdin(self) -> None:
        if not self.v5:
            raise CapabilityNotSupportedError(
                f"the API server in front of pod {self._sandbox.pod} does not speak "
                "v5.channel.k8s.io, so stdin cannot be closed (needs Kubernetes >= 1.30); "
                "pass the input to exec(stdin=...) instead")
        if not self._stdin_closed:
            self._stdin_closed = True
            await self._send(bytes([CLOSE, STDIN]))

    async def send_signal(self, signum: int) -> None:
        """Signal the command's processes through a second exec (see the module
        docstring); returns once they were signalled or the command ended."""
        if self._task.done():
            return
        delivery = asyncio.ensure_future(
            self._sandbox._sh(_SIGNAL, str(int(signum)), self._marker, timeout_s=30.0))
        try:
            await asyncio.wait({delivery, self._task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not delivery.done():
                delivery.cancel()
                with contextlib.suppress(asyncio.CancelledError, SandboxError):
                    await delivery
        if delivery.done() and not delivery.cancelled() and not self._task.done():
            try:
                delivery.result()  # SandboxLostError when the pod is gone
            except TimeoutError:
                raise SandboxLostError(f"the signal exec in pod {self._sandbox.pod} did not "
                                       "end", sandbox_id=self._sandbox.id) from None

    async def wait(self) -> int:
        self._waiting = True
        self._room.set()
        try:
            return await asyncio.shield(self._task)
        except asyncio.CancelledError:
            if self._task.cancelled():
                raise self._broken() or SandboxLostError("cancelled") from None
            raise

    def abort(self) -> None:
        """Stop reading (the sandbox is closing); the pod's teardown ends the command."""
        self._task.cancel()
