"""The backend's side of the zygote and of each sandbox's agent (see ``_agent.py``)."""

from __future__ import annotations

import array
import asyncio
import contextlib
import errno
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rollbox.errors import BackendUnavailableError, CreateFailedError

from rollbox_local.cgroups import CgroupPlan
from rollbox_local.helpers import Helpers, NoHelperError, ancillary
from rollbox_local.pidfd import ProcessHandle
from rollbox_local.statuspipe import StatusLine

AGENT_SCRIPT = Path(__file__).with_name("_agent.py")


class AgentChannel(ProcessHandle):
    """The backend's end of one sandbox agent's socket, a pidfd on the agent, and the
    agent's helpers (``helpers.py``): requests go to them, not through the agent."""

    def __init__(self, sock: socket.socket, pid: int,
                 helpers: Sequence[tuple[int, socket.socket]] = ()) -> None:
        super().__init__(pid)  # killing it, its pid namespace's init, kills everything inside
        self.sock = sock
        self.helpers = Helpers(lambda: self.send({"op": "helper"}))
        for helper_pid, helper_sock in helpers:
            self.helpers.arrived(helper_pid, helper_sock)
        self._reading = True
        asyncio.get_running_loop().add_reader(sock.fileno(), self._readable)

    def send(self, message: dict[str, Any], fds: Sequence[int] = ()) -> None:
        """Queue a request for the agent itself (never blocks for long: they are tiny)."""
        self.sock.sendmsg([json.dumps(message).encode()], ancillary(fds))

    async def dispatch(self, rid: int, message: dict[str, Any], fds: Sequence[int]) -> None:
        """Hand request ``rid`` (exec, read, write, connect) to an idle helper.
        Raises OSError when none takes it (the agent is gone)."""
        await self.helpers.dispatch(rid, message, fds)

    def order(self, rid: int, message: dict[str, Any]) -> None:
        """Signal or kill request ``rid`` (nothing to do once it is done)."""
        helper = self.helpers.order(rid, message)
        if helper is not None and message.get("op") == "kill":
            with contextlib.suppress(OSError):  # its command may have stopped it
                self.send({"op": "cont", "pid": helper})

    def slay(self, rid: int) -> bool:
        """Have the agent kill the helper serving request ``rid``, and with it the
        request's tree (a helper its own command keeps stopped cannot kill it itself).
        False when no helper has it any more."""
        helper = self.helpers.serving(rid)
        if helper is None:
            return False
        with contextlib.suppress(OSError):
            self.send({"op": "slay", "pid": helper})
        return True

    async def seal(self, timeout: float) -> None:
        """Have the agent kill every process of the sandbox but itself (see
        ``Agent.seal``), then forget the helpers, which died too.

        Raises OSError with the agent's reason, or TimeoutError."""
        st_r, st_w = os.pipe2(os.O_CLOEXEC)
        try:
            self.send({"op": "seal"}, [st_w])
        except BaseException:
            os.close(st_r)
            raise
        finally:
            os.close(st_w)
        status = StatusLine(st_r)
        try:
            async with asyncio.timeout(timeout):
                outcome = await status.final
        finally:
            status.close()
        self.helpers.forget_all()
        if outcome is None or outcome.tag != "X":
            code, _, why = (outcome.rest if outcome else "0 the agent went away").partition(" ")
            raise OSError(int(code) if code.isdigit() else 0, why)

    def _readable(self) -> None:
        try:
            msg, fds = _receive(self.sock)
        except BlockingIOError:
            return
        except OSError:
            msg, fds = b"", []
        if not msg:
            self._stop_reading()
            self.helpers.fail(OSError(errno.EPIPE, "the sandbox's agent went away"))
            return
        _from_agent(self.helpers, msg, fds)

    def _on_exit(self) -> None:
        super()._on_exit()
        self.helpers.fail(OSError(errno.EPIPE, "the sandbox's agent exited"))

    def _stop_reading(self) -> None:
        if self._reading:
            self._reading = False
            with contextlib.suppress(OSError, ValueError):
                asyncio.get_running_loop().remove_reader(self.sock.fileno())

    def close(self) -> None:
        self._stop_reading()
        self.helpers.fail(OSError(errno.EPIPE, "the sandbox's agent was closed"))
        self.sock.close()
        if not self.alive:
            self.release()


def _from_agent(helpers: Helpers, msg: bytes, fds: list[int]) -> None:
    """"H <pid>" with a helper's socket, or "N <errno> <why>" (none could be forked)."""
    tag, _, rest = msg.decode(errors="replace").partition(" ")
    if tag == "H" and rest.isdigit() and fds:
        helpers.arrived(int(rest), socket.socket(fileno=fds.pop(0)))
    elif tag == "N":
        code, _, why = rest.partition(" ")
        helpers.refused(NoHelperError(int(code) if code.isdigit() else 0,
                                      f"cannot start a process at the sandbox's limit: {why}"))
    for fd in fds:
        os.close(fd)


def _receive(sock: socket.socket) -> tuple[bytes, list[int]]:
    """One message from the agent and its descriptors (close-on-exec), not waiting."""
    msg, ancdata, _, _ = sock.recvmsg(
        4096, socket.CMSG_SPACE(4 * 4), socket.MSG_CMSG_CLOEXEC | socket.MSG_DONTWAIT)
    fds = array.array("i")
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    return msg, list(fds)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def _next_message(sock: socket.socket) -> tuple[bytes, list[int]]:
    loop = asyncio.get_running_loop()
    while True:
        try:
            return _receive(sock)
        except BlockingIOError:
            pass
        readable: asyncio.Future[None] = loop.create_future()
        loop.add_reader(sock.fileno(), _resolve, readable)
        try:
            await readable
        finally:
            loop.remove_reader(sock.fileno())


class Zygote:
    """One zygote process per backend; restarted transparently if it dies."""

    def __init__(self) -> None:
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    def _start(self) -> socket.socket:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-S", str(AGENT_SCRIPT), str(theirs.fileno())],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C in the caller's terminal is not for it
                env={},  # sandboxes can read /proc/<agent>/environ: it must hold nothing
            )
        except OSError as exc:
            ours.close()
            raise BackendUnavailableError(f"cannot start the rollbox zygote: {exc}") from exc
        finally:
            theirs.close()
        self._sock = ours
        return ours

    def _send(self, header: bytes, fds: Sequence[int]) -> None:
        for attempt in (1, 2):
            sock = self._sock or self._start()
            try:
                sock.sendmsg([header], ancillary(fds))
                return
            except OSError:
                self.close()
                if attempt == 2:
                    raise

    def spawn_bwrap(self, argv: Sequence[str], *, block_fd: int, info_fd: int, log_path: str,
                    make_dirs: Sequence[tuple[str, int]] = (), ids: tuple[int, int] | None,
                    nice: int = 0, cgroup: CgroupPlan | None = None,
                    tmpfs: dict[str, object] | None = None) -> None:
        """Start bwrap; inside its argv the block pipe is fd 3 and the info pipe fd 4.

        As the sandbox user, the zygote's child first creates ``make_dirs`` and opens
        ``log_path`` for bwrap's stderr: filesystem calls that can wait on a busy disk's
        journal, so they are not made on the event loop. ``nice`` > 0 for work nobody
        waits on (a standby generation), so that its setup yields the CPU to commands
        that are running now. ``cgroup``: the group it makes, limits and enters first.
        ``tmpfs``: a tmpfs it mounts for the writable layer, in a mount namespace of its
        own (``path``, ``size`` bytes, ``inodes``, ``owner``), before ``make_dirs``."""
        message = {"op": "spawn", "argv": list(argv), "nice": nice, "log": log_path,
                   "mkdirs": [list(d) for d in make_dirs],
                   "uid": ids[0] if ids else None, "gid": ids[1] if ids else None,
                   "cgroup": cgroup.as_request() if cgroup else None, "tmpfs": tmpfs}
        self._send(json.dumps(message).encode(), [block_fd, info_fd])

    async def copy_layer(self, *, holder: int, src: str, dest: str, timeout: float) -> None:
        """Copy the writable layer ``src`` to ``dest`` (which must not exist) as the
        sandbox's own root, in the user namespace ``holder`` is in (see ``_agent.py``).

        Raises OSError with the copy's reason, or TimeoutError."""
        st_r, st_w = os.pipe2(os.O_CLOEXEC)
        try:
            self._send(json.dumps({"op": "copy", "holder": holder, "src": src,
                                   "dest": dest}).encode(), [st_w])
        except BaseException:
            os.close(st_r)
            raise
        finally:
            os.close(st_w)
        status = StatusLine(st_r)
        try:
            async with asyncio.timeout(timeout):
                outcome = await status.final
        finally:
            status.close()
        if outcome is None or outcome.tag != "X":
            code, _, why = (outcome.rest if outcome else "0 the copy died").partition(" ")
            raise OSError(int(code) if code.isdigit() else 0, why)

    async def boot_agent(
        self, *, holder: int, rlimits: Sequence[tuple[int, int, int]], sandbox_id: str,
        timeout: float, cgroup_procs: Sequence[str] = (), workload_cgroup: Sequence[str] = (),
        holder_ready: bool = True, isolate: bool = True,
    ) -> AgentChannel:
        """Start the agent in the namespaces ``holder`` keeps (and in the cgroup entered
        through the ``cgroup_procs`` files: ``CgroupPlan.procs``; its helpers enter the
        workload's, ``CgroupPlan.workload``); wait until it serves.

        ``holder_ready=False``: bwrap may still be setting the sandbox up; the agent's
        first process waits for it (``Instance.start(await_ready=False)``). ``isolate``:
        each helper enters a Landlock domain of its own (``LocalBackend.exec_isolation``)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        header = json.dumps(
            {"op": "boot", "holder": holder, "rlimits": [list(r) for r in rlimits],
             "cgroup_procs": list(cgroup_procs), "workload_cgroup": list(workload_cgroup),
             "await_holder": None if holder_ready else timeout, "isolate": isolate}
        ).encode()
        try:
            self._send(header, [theirs.fileno()])
        finally:
            theirs.close()
        pid, ready = 0, False
        helpers: list[tuple[int, socket.socket]] = []
        try:
            async with asyncio.timeout(timeout):
                # C1's "P" and the agent's "H" (its first helper) and "R" come in any order
                while not (ready and pid):
                    reply, fds = await _next_message(ours)
                    if reply.startswith(b"H ") and reply[2:].isdigit() and fds:
                        helpers.append((int(reply[2:]), socket.socket(fileno=fds.pop(0))))
                    for fd in fds:
                        os.close(fd)
                    if reply.startswith(b"P "):
                        pid = int(reply[2:])
                    elif reply == b"R":
                        ready = True
                    elif not reply.startswith(b"H "):
                        why = reply[2:].decode(errors="replace") if reply else "it exited"
                        raise CreateFailedError(
                            f"the agent of sandbox {sandbox_id} failed: {why}",
                            sandbox_id=sandbox_id)
            return AgentChannel(ours, pid, helpers)
        except BaseException as exc:
            for _, helper in helpers:
                helper.close()
            ours.close()
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if isinstance(exc, TimeoutError | OSError):
                raise CreateFailedError(
                    f"the agent of sandbox {sandbox_id} did not start: {exc!r}",
                    sandbox_id=sandbox_id) from None
            raise

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None
