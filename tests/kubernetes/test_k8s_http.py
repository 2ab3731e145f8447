"""The in-sandbox HTTP runtime transport, end to end against the emulator: its pods serve
agent-sandbox's runtime API on their own loopback address (``http_runtime=True``),
backed by the same real local sandboxes as pod exec."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from rollbox.errors import (
    BackendUnavailableError,
    CommandNotFoundError,
    ExecTimeoutError,
    InvalidSpecError,
    SandboxFileNotFoundError,
    SandboxLostError,
)
from rollbox.spec import SandboxSpec
from rollbox_kubernetes import KubernetesBackend, render
from rollbox_kubernetes.podexec import ExecOutput
from rollbox_kubernetes.runtime_http import RuntimeHttp
from rollbox_kubernetes.sandbox import KubeSandbox
from rollbox_kubernetes.testing import ApiServerEmulator, container_runtime
from rollbox_kubernetes.testing.runtime import SandboxRouter

BackendFactory = Callable[..., KubernetesBackend]


@pytest.fixture
async def served(local_state: Path) -> AsyncIterator[ApiServerEmulator]:
    """An emulator whose pods also serve the runtime (base directory /app)."""
    async with ApiServerEmulator(container_runtime(local_state),
                                 http_runtime=True) as emu:
        yield emu


@pytest.fixture
async def make_http(served: ApiServerEmulator, backends_on: Any
                    ) -> AsyncIterator[BackendFactory]:
    async with backends_on(served.url, run_id="http", warm_replicas=0) as make:
        yield make


def execs(backend: KubernetesBackend) -> int:
    return backend.stats.by_verb["exec"]


async def test_commands_over_http(make_http: BackendFactory, spec: SandboxSpec) -> None:
    backend = make_http(transport="http")
    async with await backend.create(spec) as sandbox:
        assert isinstance(sandbox, KubeSandbox) and sandbox.runtime is not None
        result = await sandbox.exec("echo out; echo err >&2; exit 7")
        assert (result.exit_code, result.stdout, result.stderr) == (7, b"out\n", b"err\n")
        assert (await sandbox.exec(["pwd"], cwd="/tmp", env={"X": "y"})).stdout == b"/tmp\n"
        assert (await sandbox.exec("echo $X; pwd", env={"X": "y"})).stdout == b"y\n/work\n"
        # not UTF-8, and more than the cap: binary-safe, capped in the pod
        binary = await sandbox.exec("printf '\\377\\000\\376'; head -c 5000 /dev/zero >&2",
                                    output_limit=1000)
        assert binary.stdout == b"\xff\x00\xfe"
        assert len(binary.stderr) == 1000 and binary.stderr_truncated
        assert not binary.stdout_truncated
        with pytest.raises(CommandNotFoundError):
            await sandbox.exec(["no-such-program-xyz"])
        await sandbox.reset()
        assert (await sandbox.read_file("tracked.txt")) == b"base\n"
    assert execs(backend) == 0  # nothing went through the API server's pod exec
    assert backend.transports.stats["execute"] > 0


async def test_timeout_kills_the_command_and_what_it_left(make_http: BackendFactory,
                                                         spec: SandboxSpec) -> None:
    backend = make_http(transport="http")
    async with await backend.create(spec) as sandbox:
        with pytest.raises(ExecTimeoutError) as info:
            await sandbox.exec("echo early; setsid sleep 300 > /dev/null 2>&1 & sleep 30",
                               timeout=1)
        assert info.value.stdout == b"early\n"
        left = await sandbox.exec("ps -eo args | grep -c '^sleep 300' || true")
        assert left.stdout.strip() == b"0"  # the marker sweep took the escaped daemon too
    assert execs(backend) == 0


async def test_files_over_http_inside_and_outside_the_base_dir(
        make_http: BackendFactory, spec: SandboxSpec) -> None:
    backend = make_http(transport="http")
    blob = bytes(range(256)) * 1000
    async with await backend.create(spec) as sandbox:
        # /work is outside the runtime's base directory /app: staging upload + move
        await sandbox.write_file("deep/dir/blob.bin", blob, mode=0o600)
        assert await sandbox.read_file("/work/deep/dir/blob.bin") == blob
        mode = await sandbox.exec("stat -c %a deep/dir/blob.bin")
        assert mode.stdout == b"600\n", mode
        # inside /app: the download endpoint
        await sandbox.write_file("/app/sub/x.bin", blob[:999], mode=0o755)
        downloads = backend.transports.stats["download"]
        assert await sandbox.read_file("/app/sub/x.bin") == blob[:999]
        assert backend.transports.stats["download"] == downloads + 1
        assert (await sandbox.exec("stat -c %a /app/sub/x.bin")).stdout == b"755\n"
        for missing in ("missing.txt", "/app/missing.txt"):
            with pytest.raises(SandboxFileNotFoundError):
                await sandbox.read_file(missing)
        assert (await sandbox.exec("ls -A /app")).stdout == b"sub\n"  # no staging left
    assert execs(backend) == 0


async def test_stdin_goes_through_pod_exec(make_http: BackendFactory, spec: SandboxSpec) -> None:
    backend = make_http(transport="http")
    async with await backend.create(spec) as sandbox:
        assert (await sandbox.exec(["cat"], stdin=b"piped")).stdout == b"piped"
    assert execs(backend) == 1


async def test_auto_uses_http_when_served(make_http: BackendFactory,
                                         served: ApiServerEmulator, spec: SandboxSpec) -> None:
    backend = make_http()
    async with await backend.create(spec) as sandbox:
        assert (await sandbox.exec("echo hi")).stdout == b"hi\n"
        assert served.cluster.runtimes is not None
        assert list(served.cluster.runtimes.by_pod) == [("default", sandbox.pod)]
    assert execs(backend) == 0 and backend.transports.stats["probe"] == 1
    async with asyncio.timeout(10):  # the pod went, and its runtime with it
        while True:
            if not served.cluster.runtimes.by_pod:
                break
            await asyncio.sleep(0.05)


@pytest.mark.parametrize("how", [{"warm_replicas": 1}, {}, {"mode": "pod"}],
                         ids=["claim", "sandbox", "pod"])
async def test_the_runtime_is_found_without_reading_the_pod(
        make_http: BackendFactory, spec: SandboxSpec, how: dict[str, Any]) -> None:
    """The pod IP comes with the ready object (``status.podIPs`` of the Sandbox, the
    claim's ``status.sandbox.podIPs``, the pod's own status): at a thousand creations a
    GET of each pod is a thousand requests through the client's pacing."""
    # (no look at a slow pod for image errors either: those are GETs of the pod too)
    backend = make_http(transport="http", probe_after_s=600, **how)
    async with await backend.create(spec) as sandbox:
        assert isinstance(sandbox, KubeSandbox) and sandbox.pod_ip.startswith("127.")
        assert (await sandbox.exec("echo hi")).stdout == b"hi\n"
    assert backend.stats.by_resource[("get", "pods")] == 0


async def test_auto_falls_back_to_pod_exec_when_not_served(
        make_backend: BackendFactory, spec: SandboxSpec) -> None:
    backend = make_backend()  # the plain emulator: nothing listens at the pod IP
    async with await backend.create(spec) as sandbox:
        assert isinstance(sandbox, KubeSandbox) and sandbox.runtime is None
        assert (await sandbox.exec("echo hi")).stdout == b"hi\n"
    assert execs(backend) >= 2  # the reset baseline and the command
    assert backend.transports.stats["probe"] == 1


async def test_exec_transport_never_probes(make_http: BackendFactory, spec: SandboxSpec) -> None:
    backend = make_http(transport="exec")
    async with await backend.create(spec) as sandbox:
        assert (await sandbox.exec("echo hi")).stdout == b"hi\n"
    assert execs(backend) >= 2 and sum(backend.transports.stats.values()) == 0


async def test_http_without_a_runtime_fails_create_and_leaves_nothing(
        make_backend: BackendFactory, emulator: ApiServerEmulator, spec: SandboxSpec) -> None:
    backend = make_backend(transport="http", warm_replicas=0, runtime_wait_s=0.5)
    with pytest.raises(BackendUnavailableError, match=r"runtime.*did not answer"):
        await backend.create(spec)
    assert await backend.leftovers() == []
    await asyncio.sleep(0.1)
    assert emulator.store.list("pods", "default") == []


def test_unknown_transport_is_refused() -> None:
    with pytest.raises(InvalidSpecError, match="transport"):
        KubernetesBackend(host="http://127.0.0.1:1", transport="grpc")


async def test_runtime_dying_mid_command_loses_the_sandbox(
        make_http: BackendFactory, served: ApiServerEmulator, spec: SandboxSpec) -> None:
    backend = make_http(transport="http")
    sandbox = await backend.create(spec)
    assert isinstance(sandbox, KubeSandbox)
    runtime = served.cluster.runtimes.by_pod[("default", sandbox.pod)]  # type: ignore[union-attr]
    command = asyncio.ensure_future(sandbox.exec("sleep 20"))
    await asyncio.sleep(0.5)
    await runtime.kill()
    with pytest.raises(SandboxLostError, match="outcome is unknown"):
        await command
    with pytest.raises(SandboxLostError):
        await sandbox.exec("true")
    await sandbox.close()


async def test_long_timeouts_go_through_pod_exec(make_http: BackendFactory,
                                                 spec: SandboxSpec) -> None:
    backend = make_http(transport="http", runtime_max_timeout_s=60)
    async with await backend.create(spec) as sandbox:
        execs_before = execs(backend)
        assert (await sandbox.exec("echo long", timeout=120)).stdout == b"long\n"
        assert execs(backend) == execs_before + 1


async def test_through_a_router_with_upstreams_headers(
        make_http: BackendFactory, served: ApiServerEmulator, spec: SandboxSpec) -> None:
    runtimes = served.cluster.runtimes
    assert runtimes is not None
    router = SandboxRouter(runtimes, token="s3cret")
    await router.start()
    try:
        backend = make_http(transport="http", runtime_url=router.url, runtime_token="s3cret")
        async with await backend.create(spec) as sandbox:
            assert (await sandbox.exec("echo routed")).stdout == b"routed\n"
            await sandbox.write_file("/app/r.txt", b"r")
            assert await sandbox.read_file("/app/r.txt") == b"r"
        assert router.forwarded > 0 and execs(backend) == 0
        wrong = make_http(transport="http", runtime_url=router.url, runtime_token="nope",
                          runtime_wait_s=0.3)
        with pytest.raises(BackendUnavailableError):
            await wrong.create(spec)
    finally:
        await router.stop()


@contextlib.asynccontextmanager
async def _limited_runtime(
        local_state: Path) -> AsyncIterator[tuple[KubernetesBackend, KubernetesBackend]]:
    """An emulator whose pods' runtime kills every command at once, and two backends on
    it: ``transport="auto"`` and ``"http"``."""
    async with ApiServerEmulator(container_runtime(local_state), http_runtime=True,
                                 runtime_exec_timeout_s=0) as emu:
        auto = KubernetesBackend(host=emu.url, run_id="auto", warm_replicas=0)
        strict = KubernetesBackend(host=emu.url, run_id="strict", warm_replicas=0,
                                   transport="http", runtime_wait_s=0.3)
        try:
            yield auto, strict
        finally:
            await auto.aclose()
            await strict.aclose()


async def test_a_runtime_that_cannot_run_commands_is_not_used(local_state: Path,
                                                             spec: SandboxSpec) -> None:
    """It answers GET / but kills every command at once (its own time limit): auto
    falls back to pod exec, http refuses to create, saying why."""
    async with _limited_runtime(local_state) as (auto, strict):
        async with await auto.create(spec) as sandbox:
            assert (await sandbox.exec("echo hi")).stdout == b"hi\n"
        assert execs(auto) >= 2
        with pytest.raises(BackendUnavailableError, match="its own limit"):
            await strict.create(spec)
        assert await strict.leftovers() == []


async def test_a_runtime_that_passes_its_probe_but_kills_real_commands_is_not_used(
        local_state: Path, spec: SandboxSpec, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same runtime, had its probe's ``pwd`` finished inside the limit (with a 1 ms
    limit the test above failed 2-3 times in 20 on that): the first real command (the
    reset baseline) is killed at the runtime's own limit, and the create still falls
    back to pod exec under auto, or says why under http."""
    real_probe = RuntimeHttp.probe

    async def passing_probe(self: RuntimeHttp, timeout_s: float) -> bool:
        with monkeypatch.context() as patched:  # the probe's command runs unlimited
            patched.setattr(self, "_runtime_failure", lambda *_: ExecOutput(
                0, f"{self.sandbox.spec.workdir}\n".encode(), b"", False, False))
            await real_probe(self, timeout_s)
        self.base_dir = self.sandbox.spec.workdir
        return True

    monkeypatch.setattr(RuntimeHttp, "probe", passing_probe)
    async with _limited_runtime(local_state) as (auto, strict):
        async with await auto.create(spec) as sandbox:
            assert sandbox.runtime is None  # type: ignore[attr-defined]
            assert (await sandbox.exec("echo hi")).stdout == b"hi\n"
        with pytest.raises(BackendUnavailableError, match="its own limit"):
            await strict.create(spec)
        assert await strict.leftovers() == []


def test_http_pods_run_the_images_own_entrypoint(spec: SandboxSpec) -> None:
    """The runtime is the image's own command: under transport='http' the container's
    command is not replaced by the keep-alive ``sleep infinity``."""
    def command(**options: object) -> object:
        backend = KubernetesBackend(host="http://127.0.0.1:1", **options)  # type: ignore[arg-type]
        container = render.pod_spec(spec, backend.options)["containers"][0]
        return container.get("command")

    assert command(transport="http") is None
    assert command() == ["sleep", "infinity"]  # auto: any image must stay up
    assert command(keepalive=()) is None
    assert command(transport="http", keepalive=["/start-runtime"]) == ["/start-runtime"]
