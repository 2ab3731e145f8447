"""Streaming exec and signals over pod exec (``KubeSandbox.start`` → ``PodProcess``),
end to end against the emulator, whose pod exec streams from a real local sandbox."""

from __future__ import annotations

import asyncio
import signal
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from rollbox import OutputChunk, Process, Sandbox
from rollbox.errors import (
    CapabilityNotSupportedError,
    CommandNotFoundError,
    ExecTimeoutError,
    SandboxLostError,
)
from rollbox.spec import SandboxSpec
from rollbox_kubernetes import KubernetesBackend
from rollbox_kubernetes.podexec import V4
from rollbox_kubernetes.podprocess import HIGH_WATER, PodProcess
from rollbox_kubernetes.resources import PODS
from rollbox_kubernetes.sandbox import KubeSandbox
from rollbox_kubernetes.testing import ApiServerEmulator, container_runtime

BackendFactory = Callable[..., KubernetesBackend]
MiB = 1024 * 1024


@pytest.fixture
async def sandbox(make_backend: BackendFactory, spec: SandboxSpec) -> AsyncIterator[KubeSandbox]:
    box = await make_backend().create(spec)
    assert isinstance(box, KubeSandbox)
    try:
        yield box
    finally:
        await box.close()


async def read_until(stream: AsyncIterator[OutputChunk], wanted: bytes) -> bytes:
    """stdout chunks until ``wanted`` was seen (fails if the stream ends first)."""
    seen = b""
    while wanted not in seen:
        chunk = await anext(stream)
        if chunk.stream == "stdout":
            seen += chunk.data
    return seen


async def alive(sandbox: Sandbox, pid: int) -> bool:
    """Is ``pid`` still a running ``sleep`` in the pod (zombies and reused pids not)?"""
    result = await sandbox.exec(f"grep -q sleep /proc/{pid}/cmdline 2>/dev/null")
    return result.ok


# A command that starts a sleep outside its own process group (setsid, as a daemon
# would), prints its pid, then sleeps itself.
ESCAPER = "setsid sleep 300 & echo pid $!; sleep 300"


async def escaped_pid(process: Process) -> tuple[int, AsyncIterator[OutputChunk]]:
    stream = aiter(process)
    line = await read_until(stream, b"\n")
    return int(line.split()[1]), stream


async def test_output_arrives_while_the_command_waits_for_stdin(sandbox: KubeSandbox) -> None:
    """The command prints, then blocks reading stdin: its first line can only reach us
    while it still runs."""
    process = await sandbox.stream('echo first; read line; echo "second $line"', timeout=60)
    assert isinstance(process, PodProcess) and process.v5
    stream = aiter(process)
    async with asyncio.timeout(30):  # a stream that only delivers at the end hangs here
        assert await read_until(stream, b"first\n") == b"first\n"
    await process.write_stdin(b"from the test\n")
    rest = b"".join([chunk.data async for chunk in stream])
    assert rest == b"second from the test\n"
    assert await process.wait() == 0


async def test_interactive_stdin_is_echoed_line_by_line(sandbox: KubeSandbox) -> None:
    process = await sandbox.stream(["cat"], timeout=60)
    stream = aiter(process)
    for line in (b"one\n", b"two\n", b"three\n"):
        await process.write_stdin(line)
        assert await read_until(stream, line) == line
    await process.close_stdin()  # v5: EOF, so cat ends
    assert [chunk async for chunk in stream] == []
    assert await process.wait() == 0
    with pytest.raises(BrokenPipeError):
        await process.write_stdin(b"after close\n")


async def test_stderr_is_kept_apart_and_the_exit_code_reported(sandbox: KubeSandbox) -> None:
    process = await sandbox.stream("echo out; echo err >&2; exit 7", timeout=60)
    chunks = [chunk async for chunk in process]
    assert await process.wait() == 7
    assert b"".join(c.data for c in chunks if c.stream == "stdout") == b"out\n"
    assert b"".join(c.data for c in chunks if c.stream == "stderr") == b"err\n"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL])
async def test_signal_reaches_the_whole_tree(sandbox: KubeSandbox, signum: int) -> None:
    """The signal goes to every process carrying the command's marker, the one that
    left the process group too; pod exec reports the death as 128+N. (Not SIGINT here:
    a shell's background jobs ignore it, wherever it comes from.)"""
    process = await sandbox.stream(ESCAPER, timeout=60)
    pid, _ = await escaped_pid(process)
    assert await alive(sandbox, pid)
    await process.send_signal(signum)
    assert await process.wait() == 128 + signum
    assert not await alive(sandbox, pid)
    assert not sandbox.processes


async def test_a_signal_that_does_not_kill_is_delivered(sandbox: KubeSandbox) -> None:
    process = await sandbox.stream(
        "trap 'echo got USR1' USR1; echo ready; while :; do sleep 0.1; done", timeout=60)
    stream = aiter(process)
    await read_until(stream, b"ready\n")
    await process.send_signal(signal.SIGUSR1)
    await read_until(stream, b"got USR1\n")
    await process.send_signal(signal.SIGTERM)
    assert await process.wait() == 128 + signal.SIGTERM


async def test_signal_after_the_end_is_a_no_op(sandbox: KubeSandbox) -> None:
    process = await sandbox.stream(["true"], timeout=60)
    assert await process.wait() == 0
    await process.send_signal(signal.SIGTERM)
    assert await process.wait() == 0


async def test_output_limit_caps_each_stream(sandbox: KubeSandbox) -> None:
    process = await sandbox.stream("head -c 3000000 /dev/zero; echo done >&2", timeout=60,
                                   output_limit=100_000)
    chunks = [chunk async for chunk in process]
    assert await process.wait() == 0
    assert sum(len(c.data) for c in chunks if c.stream == "stdout") == 100_000
    assert b"".join(c.data for c in chunks if c.stream == "stderr") == b"done\n"
    assert isinstance(process, PodProcess)
    assert process.truncated == {"stdout": True, "stderr": False}


async def test_unread_output_is_not_buffered_without_bound(sandbox: KubeSandbox) -> None:
    """Nobody iterates while the command writes 6 MiB and then leaves a flag file: the
    reader stops at the high-water mark instead of buffering everything."""
    flag = f"/tmp/written-{uuid.uuid4().hex}"
    process = await sandbox.stream(f"head -c {6 * MiB} /dev/zero; touch {flag}; sleep 300",
                                   timeout=120, output_limit=16 * MiB)
    assert isinstance(process, PodProcess)
    async with asyncio.timeout(60):
        while not (await sandbox.exec(["test", "-e", flag])).ok:
            pass
    for _ in range(3):  # a few more round trips, for frames still in flight
        await sandbox.exec(["true"])
    assert process._backlog <= HIGH_WATER + MiB
    total = 0
    stream = aiter(process)
    while total < 6 * MiB:
        total += len((await anext(stream)).data)
    assert total == 6 * MiB
    await process.send_signal(signal.SIGKILL)
    assert await process.wait() == 128 + signal.SIGKILL


async def test_wait_without_iterating_does_not_deadlock(sandbox: KubeSandbox) -> None:
    process = await sandbox.stream(f"head -c {5 * MiB} /dev/zero", timeout=60,
                                   output_limit=8 * MiB)
    assert await process.wait() == 0
    assert sum([len(chunk.data) async for chunk in process]) == 5 * MiB


async def test_timeout_kills_the_tree_and_raises(sandbox: KubeSandbox) -> None:
    process = await sandbox.stream(ESCAPER, timeout=2)
    pid, stream = await escaped_pid(process)
    assert [chunk async for chunk in stream] == []
    with pytest.raises(ExecTimeoutError) as info:
        await process.wait()
    assert info.value.timeout_s == 2
    assert not await alive(sandbox, pid)
    assert (await sandbox.exec(["true"])).ok


async def test_missing_program_raises_command_not_found(sandbox: KubeSandbox) -> None:
    process = await sandbox.stream(["no-such-program-xyz"], timeout=60)
    assert [chunk async for chunk in process if chunk.stream == "stdout"] == []
    with pytest.raises(CommandNotFoundError):
        await process.wait()


async def test_dropped_websocket_raises_and_leaves_nothing_running(
    sandbox: KubeSandbox, emulator: ApiServerEmulator
) -> None:
    """The connection breaks mid-command: iteration and wait() raise SandboxLostError,
    the command's processes in the pod are killed (a broken exec stream does not stop
    them on Kubernetes), the socket is closed, and the sandbox stays usable."""
    process = await sandbox.stream(ESCAPER, timeout=120)
    assert isinstance(process, PodProcess)
    pid, stream = await escaped_pid(process)
    assert emulator.drop_execs() == 1
    with pytest.raises(SandboxLostError, match="broke"):
        async for _ in stream:
            pass
    with pytest.raises(SandboxLostError):
        await process.wait()
    assert not await alive(sandbox, pid)
    assert process._ws.closed
    assert not sandbox.processes
    assert not sandbox.lost
    assert (await sandbox.exec(["echo", "still here"])).stdout == b"still here\n"


async def test_pod_deleted_mid_stream_is_sandbox_lost(sandbox: KubeSandbox) -> None:
    process = await sandbox.stream("echo up; sleep 300", timeout=120)
    stream = aiter(process)
    await read_until(stream, b"up\n")
    client, ns = sandbox.backend.client, sandbox.backend.options.namespace
    await client.call("delete", "DELETE", PODS.path(ns, sandbox.pod), idempotent=True,
                      body={"kind": "DeleteOptions", "apiVersion": "v1",
                            "gracePeriodSeconds": 0})
    with pytest.raises(SandboxLostError):
        async for _ in stream:
            pass
    with pytest.raises(SandboxLostError):
        await process.wait()
    assert sandbox.lost
    with pytest.raises(SandboxLostError):
        await sandbox.stream(["true"])


async def test_close_stops_a_stream_and_wait_raises(make_backend: BackendFactory,
                                                    spec: SandboxSpec) -> None:
    box = await make_backend().create(spec)
    assert isinstance(box, KubeSandbox)
    process = await box.stream(["sleep", "300"], timeout=600)
    await box.close()
    with pytest.raises(SandboxLostError):
        await process.wait()
    assert not box.processes


async def test_v4_server_streams_but_cannot_close_stdin(local_state: Path,
                                                        spec: SandboxSpec) -> None:
    """Before Kubernetes 1.30 (v4.channel.k8s.io only) there is no stdin EOF:
    close_stdin says so; writing, reading and signals still work."""
    async with ApiServerEmulator(container_runtime(local_state),
                                 exec_protocols=(V4,)) as emulator:
        backend = KubernetesBackend(host=emulator.url, run_id="v4", warm_replicas=1)
        try:
            async with await backend.create(spec) as sandbox:
                process = await sandbox.stream(["cat"], timeout=60)
                assert isinstance(process, PodProcess) and not process.v5
                await process.write_stdin(b"over v4\n")
                assert await read_until(aiter(process), b"over v4\n") == b"over v4\n"
                with pytest.raises(CapabilityNotSupportedError, match=r"v5\.channel\.k8s\.io"):
                    await process.close_stdin()
                await process.send_signal(signal.SIGTERM)
                assert await process.wait() == 128 + signal.SIGTERM
        finally:
            await backend.aclose()
