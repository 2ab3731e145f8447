"""The backend's side of one sandbox agent's helpers: requests go straight to them.

The agent (``_agent.py``) forks helpers and hands each one's socket to the backend. The
backend keeps the idle ones, sends each request (exec, file operations, connect) to one
and takes it back when it says "idle". A request thus crosses one process boundary,
backend to helper, instead of two (through the agent: ~0.1 ms of a ~1 ms exec, and
one process fewer to wake after an idle spell). Orders for a running request (signal,
kill) go to the helper that has it.

A helper runs inside the sandbox: what it says is checked, never trusted ("idle" is the
only word that counts; anything else, such as its "warm" after its warm-up, is ignored,
and its socket closing means it is gone).
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import errno
import json
import os
import socket
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

MAX_IDLE = 2
"""Idle helpers kept per agent; a surplus one is let go (its socket closed: it exits)."""
REFILL_AFTER_S = 0.005
"""A spare is asked for only once the last idle helper has been busy this long: a
command that ends sooner (most do) brings its own helper back, and the fork never
competes with a command that has just started."""
DISPATCH_ATTEMPTS = 3


class NoHelperError(OSError):
    """The agent could not fork a helper: the sandbox is at its process limit."""


def ancillary(fds: Sequence[int]) -> list[tuple[int, int, bytes]]:
    """``fds`` as sendmsg's SCM_RIGHTS ancillary data (none for none)."""
    if not fds:
        return []
    return [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())]


class HelperLink:
    """One helper: its pid inside the sandbox, its socket, the request it serves."""

    __slots__ = ("pid", "request", "sock")

    def __init__(self, pid: int, sock: socket.socket) -> None:
        self.pid = pid
        self.sock = sock
        self.request: int | None = None


class Helpers:
    """The helpers of one agent. ``ask`` sends the agent one ``{"op": "helper"}``."""

    def __init__(self, ask: Callable[[], None]) -> None:
        self._loop = asyncio.get_running_loop()
        self._ask_agent = ask
        self.idle: list[HelperLink] = []
        self.busy: dict[int, HelperLink] = {}  # by request id
        self._waiting: deque[asyncio.Future[HelperLink]] = deque()
        self._asked = 0  # helpers asked of the agent and not yet arrived
        self._refill: asyncio.TimerHandle | None = None
        self._failure: OSError | None = None

    # -- from the agent --------------------------------------------------------------

    def arrived(self, pid: int, sock: socket.socket) -> None:
        """A helper the agent forked ("H <pid>" and its socket)."""
        self._asked = max(0, self._asked - 1)
        if self._failure is not None:
            sock.close()
            return
        sock.setblocking(False)
        link = HelperLink(pid, sock)
        self._loop.add_reader(sock.fileno(), self._readable, link)
        self._release(link)

    def refused(self, why: NoHelperError) -> None:
        """The agent could not fork one ("N …"): the first waiter gets the error."""
        self._asked = max(0, self._asked - 1)
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_exception(why)
                return

    def fail(self, why: OSError) -> None:
        """The agent is gone: every waiter gets ``why``, every helper is let go."""
        self._failure = why
        if self._refill is not None:
            self._refill.cancel()
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_exception(why)
        for link in [*self.idle, *self.busy.values()]:
            self._drop(link)

    def forget_all(self) -> None:
        """Every helper was killed (the agent sealed the sandbox): let them all go; the
        next request asks the agent for a fresh one."""
        for link in [*self.idle, *self.busy.values()]:
            self._drop(link)

    # -- requests --------------------------------------------------------------------

    async def dispatch(self, rid: int, message: dict[str, Any], fds: Sequence[int]) -> None:
        """Send request ``rid`` to an idle helper, waiting for one only if none is
        idle. Raises OSError when no helper takes it (the agent is gone).

        When no helper can be forked (the sandbox is at its process limit), the request
        fails as it would in a helper that cannot start it: an ``E`` answer on its own
        answer channel, the last of ``fds`` (a status pipe; a connect's reply socket).
        The sandbox stays usable once its processes end."""
        data = json.dumps(message).encode()
        for _ in range(DISPATCH_ATTEMPTS):
            try:
                link = await self._take()
            except NoHelperError as exc:
                line = f"E {exc.errno} {exc.strerror}"
                with contextlib.suppress(OSError):  # a fresh pipe or socket: room
                    os.write(fds[-1], (line if message.get("op") == "connect"
                                       else line + "\n").encode())
                return
            try:
                link.sock.sendmsg([data], ancillary(fds))
            except OSError:  # it died idle (a command's cleanup sweep): the next one
                self._drop(link)
                continue
            link.request = rid
            self.busy[rid] = link
            return
        raise OSError(errno.EPIPE, "no helper of the sandbox's agent took the request")

    def serving(self, rid: int) -> int | None:
        """The pid of the helper serving request ``rid``, None once it is done."""
        link = self.busy.get(rid)
        return None if link is None else link.pid

    def order(self, rid: int, message: dict[str, Any]) -> int | None:
        """Send an order (signal, kill) to the helper serving ``rid``; its pid, or None
        when no helper has it any more (the request is done)."""
        link = self.busy.get(rid)
        if link is None:
            return None
        with contextlib.suppress(OSError):  # a stopped helper's full socket: the
            link.sock.send(json.dumps(message).encode())  # caller's wait decides
        return link.pid

    async def _take(self) -> HelperLink:
        if self._failure is not None:
            raise self._failure
        if self.idle:
            link = self.idle.pop()
            if not self.idle and self._refill is None:
                self._refill = self._loop.call_later(REFILL_AFTER_S, self._refill_now)
            return link
        waiter: asyncio.Future[HelperLink] = self._loop.create_future()
        self._waiting.append(waiter)
        if self._asked < len(self._waiting):
            self._ask()
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self._release(waiter.result())
            raise

    def _ask(self) -> None:
        self._asked += 1
        try:
            self._ask_agent()
        except OSError as exc:  # the agent's socket: it is gone
            self._asked -= 1
            self.fail(exc)

    def _refill_now(self) -> None:
        self._refill = None
        if not self.idle and not self._asked and self._failure is None:
            self._ask()

    # -- from a helper ---------------------------------------------------------------

    def _readable(self, link: HelperLink) -> None:
        try:
            msg = link.sock.recv(64)
        except BlockingIOError:
            return
        except OSError:
            msg = b""
        if not msg:
            self._drop(link)  # it exited (or was killed by a command of its sandbox)
        elif msg == b"idle" and link.request is not None:
            if self.busy.get(link.request) is link:
                del self.busy[link.request]
            self._release(link)

    def _release(self, link: HelperLink) -> None:
        link.request = None
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(link)
                return
        if len(self.idle) < MAX_IDLE:
            self.idle.append(link)
        else:
            self._drop(link)

    def _drop(self, link: HelperLink) -> None:
        if link.sock.fileno() >= 0:
            self._loop.remove_reader(link.sock.fileno())
            link.sock.close()
        if link.request is not None and self.busy.get(link.request) is link:
            del self.busy[link.request]
        if link in self.idle:
            self.idle.remove(link)
        if not self.idle and self._refill is None and self._failure is None:
            self._refill = self._loop.call_later(REFILL_AFTER_S, self._refill_now)
