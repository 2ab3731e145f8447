"""A sandbox whose pod is deleted, or made again under its name, is lost: its next
command never runs in a stranger's pod (podwatch.py), against the emulator, whose
controller makes a Sandbox's deleted pod again as agent-sandbox's does."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from polling import until
from rollbox.errors import SandboxLostError
from rollbox.spec import SandboxSpec
from rollbox_kubernetes import KubernetesBackend
from rollbox_kubernetes.resources import PODS
from rollbox_kubernetes.sandbox import KubeSandbox

BackendFactory = Callable[..., KubernetesBackend]


async def delete_pod(sandbox: KubeSandbox) -> None:
    client, ns = sandbox.backend.client, sandbox.backend.options.namespace
    await client.call("delete", "DELETE", PODS.path(ns, sandbox.pod), idempotent=True,
                      body={"kind": "DeleteOptions", "apiVersion": "v1",
                            "gracePeriodSeconds": 0})


async def made_again(sandbox: KubeSandbox, uid: str) -> None:
    client, ns = sandbox.backend.client, sandbox.backend.options.namespace
    while True:
        try:
            pod = await client.get(PODS, ns, sandbox.pod)
            if pod["metadata"]["uid"] != uid and pod.get("status", {}).get("podIP"):
                return
        except Exception:
            pass
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("mode", ["claim", "pod"])
async def test_a_sandbox_knows_its_pod_by_uid(make_backend: BackendFactory, spec: SandboxSpec,
                                             mode: str) -> None:
    async with await make_backend(mode=mode).create(spec) as sandbox:
        assert isinstance(sandbox, KubeSandbox)
        await until(lambda: sandbox.pod_uid)
        pod = await sandbox.backend.client.get(PODS, sandbox.backend.options.namespace,
                                               sandbox.pod)
        assert sandbox.pod_uid == pod["metadata"]["uid"]
        assert not sandbox.lost


async def test_a_pod_made_again_under_the_same_name_is_not_the_sandboxs(
        make_backend: BackendFactory, spec: SandboxSpec) -> None:
    async with await make_backend().create(spec) as sandbox:
        assert isinstance(sandbox, KubeSandbox)
        await sandbox.write_file("/work/progress.txt", b"half done")
        await until(lambda: sandbox.pod_uid)
        uid = sandbox.pod_uid
        await delete_pod(sandbox)
        async with asyncio.timeout(20):
            await made_again(sandbox, uid)
        await until(lambda: sandbox.lost)
        with pytest.raises(SandboxLostError):
            await sandbox.exec(["cat", "/work/progress.txt"])


async def test_a_pod_deleted_between_commands_loses_its_sandbox(
        make_backend: BackendFactory, spec: SandboxSpec) -> None:
    async with await make_backend(mode="pod").create(spec) as sandbox:
        assert isinstance(sandbox, KubeSandbox)
        assert (await sandbox.exec(["true"])).ok
        await delete_pod(sandbox)
        await until(lambda: sandbox.lost)
        with pytest.raises(SandboxLostError):
            await sandbox.exec(["true"])


async def test_the_check_after_a_failed_command_compares_the_uid(
        make_backend: BackendFactory, spec: SandboxSpec) -> None:
    """Without the watch (``stopped_by``: no leave to list pods), a command that fails
    makes the sandbox look at its pod, and a stranger under its name is a loss."""
    backend = make_backend()
    async with await backend.create(spec) as sandbox:
        assert isinstance(sandbox, KubeSandbox)
        await until(lambda: sandbox.pod_uid)
        assert backend.pod_watch is not None
        await backend.pod_watch.aclose()
        uid = sandbox.pod_uid
        await delete_pod(sandbox)
        async with asyncio.timeout(20):
            await made_again(sandbox, uid)
        assert not sandbox.lost
        await sandbox._check_pod()
        assert sandbox.lost
