"""File operations and port connections, carried out by the sandbox's own agent.

The host never opens a path the sandbox controls: a helper of the agent (see
``_agent.py``) opens it inside the sandbox, as the sandbox's root without capabilities,
and moves the bytes through a pipe. A path therefore means exactly what it means to a
command (symlinks included) and reaches nothing the sandbox could not reach itself —
no host file, no host credentials. On the host side everything is a non-blocking pipe
on the event loop (or a thread copying between a pipe and a local file), so a slow or
hostile file never holds the loop, a thread pool slot or another sandbox's work.

Only regular files move: a directory, FIFO, socket or device is refused
(NotRegularFileError), and a file over the sandbox's size cap is refused
(FileTooLargeError) — reading ``/dev/zero`` or an endless file cannot grow the backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollbox.errors import (
    ExecTimeoutError,
    FileTooLargeError,
    NotRegularFileError,
    PortNotOpenError,
    RollboxError,
    SandboxError,
    SandboxFileNotFoundError,
)

from rollbox_local.statuspipe import Outcome, StatusLine

if TYPE_CHECKING:
    from rollbox_local.sandbox import LocalSandbox
    from rollbox_local.zygote import AgentChannel

CHUNK = 1 << 20


class FileOps:
    """The file API of one sandbox, done through its current generation's agent."""

    def __init__(self, sandbox: LocalSandbox) -> None:
        self.sandbox = sandbox

    @property
    def limit(self) -> int:
        """The largest file that moves in or out (the spec's file size limit)."""
        return self.sandbox.file_limit_bytes

    async def read(self, path: str) -> bytes:
        data = bytearray()
        too_big = False

        def keep(chunk: bytes) -> None:
            nonlocal too_big
            if len(data) + len(chunk) > self.limit:
                too_big = True
            else:
                data.extend(chunk)

        outcome = await self._op({"op": "read", "path": path, "limit": self.limit},
                                 path, outgoing=keep)
        if too_big:
            raise self._too_large(path, self.limit + 1)
        self._check(outcome, path)
        return bytes(data)

    async def write(self, path: str, data: bytes, mode: int) -> None:
        outcome = await self._op({"op": "write", "path": path, "mode": mode}, path,
                                 incoming=bytes(data))
        self._check(outcome, path)

    async def download(self, path: str, local: Path) -> None:
        """Stream a sandbox file to ``local`` (a thread copies the pipe to disk)."""
        outcome = await self._op({"op": "read", "path": path, "limit": self.limit}, path,
                                 pump=lambda fd: asyncio.to_thread(_pipe_to_file, fd, local))
        self._check(outcome, path)

    async def upload(self, local: Path, path: str, mode: int) -> None:
        """Stream ``local`` into the sandbox (a thread copies the file into the pipe)."""
        size = (await asyncio.to_thread(local.stat)).st_size
        if size > self.limit:
            raise self._too_large(path, size)
        outcome = await self._op({"op": "write", "path": path, "mode": mode}, path,
                                 pump=lambda fd: asyncio.to_thread(_file_to_pipe, local, fd),
                                 to_sandbox=True)
        self._check(outcome, path)

    async def connect(self, port: int, agent: AgentChannel | None = None) -> socket.socket:
        """A connected socket to ``port`` on the sandbox's own loopback (through
        ``agent``, a given generation's, else the current one's)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        agent = agent or await self.sandbox.agent_for_io()
        rid = self.sandbox.next_request_id()
        loop = asyncio.get_running_loop()
        try:
            with theirs:
                await self._send(agent, rid, {"op": "connect", "id": rid, "port": port},
                                 [theirs.fileno()])
            ours.setblocking(False)
            got: asyncio.Future[tuple[bytes, list[int]]] = loop.create_future()

            def readable() -> None:
                try:
                    msg, fds, _, _ = socket.recv_fds(ours, 4096, 1)
                except BlockingIOError:
                    return
                except OSError:
                    msg, fds = b"", []
                if not got.done():
                    got.set_result((msg, fds))

            loop.add_reader(ours.fileno(), readable)
            try:
                async with asyncio.timeout(self.sandbox.spec.timeouts.exec_s):
                    msg, fds = await got
            except TimeoutError:
                self.sandbox.tell_agent({"op": "kill", "id": rid})
                raise PortNotOpenError(
                    f"connecting to port {port} in sandbox {self.sandbox.id} timed out",
                    sandbox_id=self.sandbox.id) from None
            finally:
                loop.remove_reader(ours.fileno())
        finally:
            ours.close()
        if msg == b"ok" and fds:
            for extra in fds[1:]:
                os.close(extra)
            conn = socket.socket(fileno=fds[0])
            conn.setblocking(False)
            return conn
        for fd in fds:
            os.close(fd)
        if not msg:
            raise await self.sandbox.broken(f"its helper went away while connecting to port "
                                            f"{port}")
        raise PortNotOpenError(
            f"nothing accepts connections on port {port} inside sandbox {self.sandbox.id} "
            f"({msg[2:].decode(errors='replace').partition(' ')[2] or 'refused'}); start the "
            "server first, listening on 127.0.0.1 or 0.0.0.0", sandbox_id=self.sandbox.id)

    # -- the one request/response loop ---------------------------------------------------

    async def _op(
        self,
        request: dict[str, Any],
        path: str,
        *,
        outgoing: Callable[[bytes], None] | None = None,
        incoming: bytes | None = None,
        pump: Callable[[int], Awaitable[None]] | None = None,
        to_sandbox: bool = False,
    ) -> Outcome:
        """Send one file request; move its bytes; return the helper's final status.

        Data flows out of the sandbox into ``outgoing`` (read) or ``pump`` (download), or
        into it from ``incoming`` (write) or ``pump`` (upload, ``to_sandbox``)."""
        agent = await self.sandbox.agent_for_io()
        rid = self.sandbox.next_request_id()
        request = {**request, "id": rid}
        into = to_sandbox or incoming is not None
        data_r, data_w = os.pipe2(os.O_CLOEXEC)
        st_r, st_w = os.pipe2(os.O_CLOEXEC)
        theirs, ours = (data_r, data_w) if into else (data_w, data_r)
        try:
            await self._send(agent, rid, request, [theirs, st_w])
        except BaseException:
            for fd in (ours, st_r):
                os.close(fd)
            raise
        finally:
            os.close(theirs)
            os.close(st_w)
        status = StatusLine(st_r)
        mover: asyncio.Future[None]
        if pump is not None:
            mover = asyncio.ensure_future(_owning(pump, ours))
        elif into:
            mover = _feed(ours, incoming or b"")
        else:
            mover = _drain(ours, outgoing or (lambda _: None))
        try:
            async with asyncio.timeout(self.sandbox.spec.timeouts.exec_s):
                outcome = await status.final
                await mover
        except TimeoutError:
            self.sandbox.tell_agent({"op": "kill", "id": rid})
            raise ExecTimeoutError(
                f"moving {path} in sandbox {self.sandbox.id} took longer than "
                f"{self.sandbox.spec.timeouts.exec_s}s", sandbox_id=self.sandbox.id,
                timeout_s=self.sandbox.spec.timeouts.exec_s) from None
        except BaseException:
            self.sandbox.tell_agent({"op": "kill", "id": rid})
            raise
        finally:
            status.close()
            mover.cancel()
            with contextlib.suppress(BaseException):
                await mover
        if outcome is None:
            raise await self.sandbox.broken(f"its helper went away while moving {path}")
        return outcome

    async def _send(self, agent: AgentChannel, rid: int, request: dict[str, Any],
                    fds: list[int]) -> None:
        try:
            await agent.dispatch(rid, request, fds)
        except OSError as exc:
            raise await self.sandbox.broken(f"no helper took a file request ({exc})") from exc

    def _check(self, outcome: Outcome, path: str) -> None:
        sandbox_id = self.sandbox.id
        if outcome.tag == "X":
            return
        if outcome.tag == "T":
            raise NotRegularFileError(
                f"{path} in sandbox {sandbox_id} is a {outcome.rest}, not a regular file; "
                "the file API moves regular files only")
        if outcome.tag == "F":
            raise self._too_large(path, int(outcome.rest or 0))
        code_text, _, message = outcome.rest.partition(" ")
        code = int(code_text) if code_text.lstrip("-").isdigit() else 0
        raise _file_error(code, message, path, sandbox_id)

    def _too_large(self, path: str, size: int) -> RollboxError:
        return FileTooLargeError(
            f"{path} in sandbox {self.sandbox.id} is over the {self.limit} byte limit "
            f"({size}+ bytes); raise resources.file_size_mb in the spec")


def _file_error(code: int, message: str, path: str, sandbox_id: str) -> RollboxError:
    if code in (errno.ENOENT, errno.ENOTDIR):
        return SandboxFileNotFoundError(f"no such file in sandbox {sandbox_id}: {path}",
                                        sandbox_id=sandbox_id)
    if code == errno.EFBIG:
        return FileTooLargeError(f"{path} in sandbox {sandbox_id}: over the file size limit "
                                 "(resources.file_size_mb)")
    if code in (errno.ENOSPC, errno.EDQUOT):
        return SandboxError(f"{path} in sandbox {sandbox_id}: the sandbox's writable layer is "
                            "full (resources.disk_mb)", sandbox_id=sandbox_id)
    if code == errno.ELOOP:
        return SandboxError(f"{path} in sandbox {sandbox_id}: too many levels of symbolic "
                            "links", sandbox_id=sandbox_id)
    return SandboxError(f"{path} in sandbox {sandbox_id}: {message or os.strerror(code)}",
                        sandbox_id=sandbox_id)


async def _owning(pump: Callable[[int], Awaitable[None]], fd: int) -> None:
    """Run a thread pump over ``fd``; close ``fd`` once the thread is done with it.

    Cancelled (a timeout), the thread still holds ``fd``: it ends when the helper on the
    other side of the pipe is killed, and only then is ``fd`` closed."""
    os.set_blocking(fd, True)
    work = asyncio.ensure_future(pump(fd))
    work.add_done_callback(lambda _: os.close(fd))
    await asyncio.shield(work)


def _feed(fd: int, data: bytes) -> asyncio.Future[None]:
    """Write ``data`` into a pipe from the event loop, then close it (EOF)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    view = memoryview(data)
    os.set_blocking(fd, False)

    def finish() -> None:
        loop.remove_writer(fd)
        os.close(fd)
        if not done.done():
            done.set_result(None)

    def writable() -> None:
        nonlocal view
        try:
            view = view[os.write(fd, view[:CHUNK]):]
        except BlockingIOError:
            return
        except OSError:  # the helper stopped reading: its status says why
            view = view[:0]
        if not view:
            finish()

    if view:
        loop.add_writer(fd, writable)
    else:
        finish()
    done.add_done_callback(lambda f: _close_if_cancelled(f, loop, fd))
    return done


def _drain(fd: int, sink: Callable[[bytes], None]) -> asyncio.Future[None]:
    """Read a pipe on the event loop until EOF, handing each chunk to ``sink``."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    os.set_blocking(fd, False)

    def readable() -> None:
        try:
            chunk = os.read(fd, CHUNK)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if chunk:
            sink(chunk)
            return
        loop.remove_reader(fd)
        os.close(fd)
        if not done.done():
            done.set_result(None)

    loop.add_reader(fd, readable)
    done.add_done_callback(lambda f: _close_if_cancelled(f, loop, fd))
    return done


def _close_if_cancelled(done: asyncio.Future[None], loop: asyncio.AbstractEventLoop,
                        fd: int) -> None:
    """A pipe abandoned half-way (a timeout, an error elsewhere) is closed here."""
    if not done.cancelled():
        return
    with contextlib.suppress(OSError, ValueError):
        loop.remove_reader(fd)
        loop.remove_writer(fd)
    with contextlib.suppress(OSError):
        os.close(fd)


def _pipe_to_file(fd: int, local: Path) -> None:
    with open(local, "wb") as out:
        while chunk := os.read(fd, CHUNK):
            out.write(chunk)


def _file_to_pipe(local: Path, fd: int) -> None:
    with open(local, "rb") as src:
        size = os.fstat(src.fileno()).st_size
        sent = 0
        try:
            while sent < size:
                moved = os.sendfile(fd, src.fileno(), sent, min(CHUNK * 8, size - sent))
                if moved == 0:
                    break
                sent += moved
        except BrokenPipeError:
            pass  # the helper refused the file: its status says why

