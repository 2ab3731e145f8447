"""The test cluster's node agent frees what a pod held once, and only after its start.

A pod deleted while its start was still creating the sandbox used to leave that sandbox,
and the runtime started after it, running for good; a deletion and its DELETED event each
ran a release, so an address could come free while its runtime still listened. A pod IP
something else on the machine listens on is skipped, not a pod that fails to start."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from typing import Any

import pytest
from rollbox import ExecRequest, ExecResult, SandboxSpec
from rollbox.testing import FakeBackend
from rollbox.testing.fake import FakeSandbox, builtin_handler
from rollbox_kubernetes.testing.nodeagent import NodeAgent


class Backing(FakeBackend):
    """In-memory sandboxes that take a pod's limits as given (the fake enforces none) and
    run every command but the runtime's ``mkdir`` as the fake's small shell does."""

    def __init__(self, **options: Any) -> None:
        super().__init__(self._run, **options)

    def check_spec(self, spec: SandboxSpec) -> None:
        pass

    @staticmethod
    async def _run(sandbox: FakeSandbox, request: ExecRequest) -> ExecResult:
        if request.argv[0] == "mkdir":
            return ExecResult(0)
        return await builtin_handler(sandbox, request)


class StatusSink:
    """Stands in for the API client: the agent only writes pod status and deletes."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    async def call(self, verb: str, method: str, path: str, **_: Any) -> dict[str, Any]:
        self.calls.append((method, path))
        return {}


def pod(uid: str = "u1", *, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"namespace": "ns", "name": "p", "uid": uid}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-07T00:00:00Z"
    return {"metadata": meta, "status": {"phase": "Pending"},
            "spec": {"nodeName": "n0", "containers": [{"name": "c", "image": "host"}]}}


def agent(backing: FakeBackend, *, pod_cidr: str = "127.66.0.0/24",
          runtime_port: int = 0) -> NodeAgent:
    return NodeAgent(StatusSink(), backing, nodes=["n0"],  # type: ignore[arg-type]
                     listen=("127.0.0.1", 0), tls=None, pod_cidr=pod_cidr,
                     runtime_port=runtime_port)


async def settle(node: NodeAgent) -> None:
    while node._tasks:
        await asyncio.gather(*node._tasks, return_exceptions=True)


async def test_a_pod_deleted_while_its_sandbox_is_made_leaves_nothing_running() -> None:
    backing = Backing(create_delay=0.3)
    node = agent(backing)
    node._on_pod("ADDED", pod())
    await asyncio.sleep(0.1)  # the start is inside create
    node._on_pod("DELETED", pod())
    await settle(node)
    assert backing.live == {} and node.ips.in_use == set() and node.pods == {}
    await node.aclose()


async def test_a_deletion_and_its_deleted_event_release_once() -> None:
    backing = Backing()
    node = agent(backing)
    node._on_pod("ADDED", pod())
    await settle(node)
    state = node.pods["u1"]
    assert state.runtime is not None and node.ips.in_use == {state.ip}
    node._on_pod("MODIFIED", pod(deleting=True))
    node._on_pod("DELETED", pod())
    await settle(node)
    assert state.released is not None and state.released.done()
    assert backing.live == {} and node.ips.in_use == set() and node.pods == {}
    await node.aclose()


async def test_a_pod_ip_another_listener_holds_is_skipped(
        caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.66.1.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        node = agent(Backing(), pod_cidr="127.66.1.0/29", runtime_port=port)
        with caplog.at_level(logging.WARNING, logger="rollbox.nodeagent"):
            node._on_pod("ADDED", pod())
            await settle(node)
        state = node.pods["u1"]
        assert state.runtime is not None and state.ip == "127.66.1.2"
        assert node.ips.in_use == {"127.66.1.1", "127.66.1.2"}  # .1 is not handed out again
        assert "127.66.1.1" in caplog.text and f"pid {os.getpid()}" in caplog.text
        await node.aclose()
