"""Requests go from the backend straight to an idle helper (``helpers.py``), not through
the agent: the bookkeeping on real sockets, and the agent left asleep by commands."""

from __future__ import annotations

import asyncio
import json
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from rollbox import SandboxSpec
from rollbox_local import LocalBackend
from rollbox_local.helpers import MAX_IDLE, REFILL_AFTER_S, Helpers, NoHelperError
from rollbox_local.sandbox import LocalSandbox


class FakeAgent:
    """Stands in for the agent: counts asks and makes helpers (socket pairs) on demand."""

    def __init__(self) -> None:
        self.asks = 0
        self.helpers = Helpers(self.ask)
        self.ends: dict[int, socket.socket] = {}  # the helpers' ends, by pid

    def ask(self) -> None:
        self.asks += 1

    def give(self, pid: int) -> socket.socket:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.helpers.arrived(pid, ours)
        self.ends[pid] = theirs
        return theirs


@pytest.fixture
async def agent() -> AsyncIterator[FakeAgent]:
    fake = FakeAgent()
    yield fake
    fake.helpers.fail(OSError("test over"))
    for end in fake.ends.values():
        end.close()


def received(end: socket.socket) -> tuple[dict[str, object], list[int]]:
    msg, fds, _, _ = socket.recv_fds(end, 4096, 8)
    return json.loads(msg), fds


async def dispatch(agent: FakeAgent, rid: int) -> int:
    """Dispatch an exec-like request with a fresh pipe; returns the pipe's read end."""
    r, w = os.pipe()
    try:
        await agent.helpers.dispatch(rid, {"op": "exec", "id": rid}, [w])
    finally:
        os.close(w)
    return r


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def test_a_request_goes_to_an_idle_helper_and_it_comes_back(agent: FakeAgent) -> None:
    end = agent.give(7)
    os.close(await dispatch(agent, 1))
    message, fds = received(end)
    assert message == {"op": "exec", "id": 1} and len(fds) == 1
    os.close(fds[0])
    assert agent.helpers.busy[1].pid == 7 and not agent.helpers.idle
    end.send(b"idle")
    await settle()
    assert [link.pid for link in agent.helpers.idle] == [7] and not agent.helpers.busy


async def test_with_no_idle_helper_a_request_waits_for_the_one_it_asked_for(
        agent: FakeAgent) -> None:
    waiting = asyncio.ensure_future(dispatch(agent, 1))
    await settle()
    assert agent.asks == 1 and not waiting.done()
    end = agent.give(8)
    os.close(await waiting)
    assert received(end)[0]["id"] == 1


async def test_a_spare_is_asked_for_only_once_the_last_idle_helper_stays_busy(
        agent: FakeAgent) -> None:
    end = agent.give(7)
    os.close(await dispatch(agent, 1))
    end.send(b"idle")  # back at once: no spare needed
    await asyncio.sleep(2 * REFILL_AFTER_S)
    assert agent.asks == 0
    os.close(await dispatch(agent, 2))  # busy past the refill delay: a spare
    await asyncio.sleep(2 * REFILL_AFTER_S)
    assert agent.asks == 1


async def test_idle_helpers_past_the_limit_are_let_go(agent: FakeAgent) -> None:
    ends = [agent.give(pid) for pid in range(10, 10 + MAX_IDLE + 1)]
    assert len(agent.helpers.idle) == MAX_IDLE
    assert ends[-1].recv(16) == b"", "the surplus helper's socket is closed: it exits"


async def test_a_helper_that_died_idle_is_skipped(agent: FakeAgent) -> None:
    alive = agent.give(7)
    agent.give(8).close()  # killed while idle (a command's cleanup sweep)
    os.close(await dispatch(agent, 1))
    assert received(alive)[0]["id"] == 1


async def test_a_refused_helper_fails_the_request_on_its_own_status(agent: FakeAgent) -> None:
    waiting = asyncio.ensure_future(dispatch(agent, 1))
    await settle()
    agent.helpers.refused(NoHelperError(11, "at the sandbox's process limit"))
    status = await waiting
    try:
        assert os.read(status, 200) == b"E 11 at the sandbox's process limit\n"
    finally:
        os.close(status)


async def test_when_the_agent_is_gone_waiting_requests_fail(agent: FakeAgent) -> None:
    waiting = asyncio.ensure_future(dispatch(agent, 1))
    await settle()
    agent.helpers.fail(OSError("the agent exited"))
    with pytest.raises(OSError, match="the agent exited"):
        await waiting


async def test_orders_reach_the_helper_serving_the_request(agent: FakeAgent) -> None:
    end = agent.give(7)
    os.close(await dispatch(agent, 1))
    for fd in received(end)[1]:
        os.close(fd)
    assert agent.helpers.order(1, {"op": "kill", "id": 1}) == 7
    assert json.loads(end.recv(64)) == {"op": "kill", "id": 1}
    assert agent.helpers.order(2, {"op": "kill", "id": 2}) is None, "no such request"


# -- on a real sandbox ----------------------------------------------------------------------


def voluntary_switches(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("voluntary_ctxt_switches:")[1].split()[0])


async def test_commands_do_not_wake_the_agent(backend: LocalBackend) -> None:
    """Each command used to pass through the agent (woken twice: the request, then its
    helper saying it is idle again); now the agent sleeps while commands run."""
    sandbox = await backend.create(SandboxSpec(image="host"))
    assert isinstance(sandbox, LocalSandbox)
    try:
        await sandbox.exec(["sleep", "0.02"])  # outlasts the refill delay: a spare comes
        await asyncio.sleep(0.05)
        assert sandbox._current is not None and sandbox._current.agent is not None
        agent = sandbox._current.agent.pid
        before = voluntary_switches(agent)
        for _ in range(50):
            assert (await sandbox.exec(["true"])).ok
        assert voluntary_switches(agent) - before <= 2
    finally:
        await sandbox.close()
