"""End to end against the emulator: claims bound from warm pools, exec, files, reset."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from rollbox import Pool, StaticPoolPolicy
from rollbox.errors import CommandNotFoundError, ExecTimeoutError, SandboxFileNotFoundError
from rollbox.spec import Network, SandboxSpec
from rollbox_kubernetes import KubernetesBackend
from rollbox_kubernetes.testing import ApiServerEmulator

BackendFactory = Callable[..., KubernetesBackend]


async def test_exec_separates_streams_and_exit_code(make_backend: BackendFactory,
                                                    spec: SandboxSpec) -> None:
    async with await make_backend().create(spec) as sandbox:
        result = await sandbox.exec("echo out; echo err >&2; exit 7")
        assert (result.exit_code, result.stdout, result.stderr) == (7, b"out\n", b"err\n")
        result = await sandbox.exec(["pwd"], cwd="/tmp", env={"X": "y"})
        assert result.stdout == b"/tmp\n"
        assert (await sandbox.exec("echo $X", env={"X": "y"})).stdout == b"y\n"
        assert (await sandbox.exec(["cat"], stdin=b"piped")).stdout == b"piped"


async def test_output_cap_and_errors(make_backend: BackendFactory, spec: SandboxSpec) -> None:
    async with await make_backend().create(spec) as sandbox:
        result = await sandbox.exec("head -c 5000 /dev/zero", output_limit=100)
        assert len(result.stdout) == 100 and result.stdout_truncated
        with pytest.raises(CommandNotFoundError):
            await sandbox.exec(["no-such-program-xyz"])
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(ExecTimeoutError) as info:
            await sandbox.exec("echo early; sleep 30", timeout=0.5)
        assert loop.time() - started < 5
        assert info.value.stdout == b"early\n"


async def test_files_round_trip_binary(make_backend: BackendFactory, spec: SandboxSpec) -> None:
    blob = bytes(range(256)) * 1000
    async with await make_backend().create(spec) as sandbox:
        await sandbox.write_file("deep/dir/blob.bin", blob, mode=0o600)
        assert await sandbox.read_file("/work/deep/dir/blob.bin") == blob
        assert (await sandbox.exec("stat -c %a deep/dir/blob.bin")).stdout == b"600\n"
        with pytest.raises(SandboxFileNotFoundError):
            await sandbox.read_file("missing.txt")


async def test_reset_returns_to_the_base_commit(make_backend: BackendFactory,
                                               spec: SandboxSpec) -> None:
    async with await make_backend().create(spec) as sandbox:
        await sandbox.exec("echo dirty > tracked.txt; echo new > untracked.txt; "
                           "git -c user.email=a@b -c user.name=a commit -qam moved")
        await sandbox.reset()
        assert (await sandbox.read_file("tracked.txt")) == b"base\n"
        assert not (await sandbox.exec("test -e untracked.txt")).ok
        assert (await sandbox.exec("git log --oneline | wc -l")).stdout.strip() == b"1"


async def test_reset_command_from_spec(make_backend: BackendFactory, spec: SandboxSpec) -> None:
    custom = spec.replace(reset_command="rm -f marker")
    async with await make_backend().create(custom) as sandbox:
        await sandbox.write_file("marker", b"x")
        await sandbox.reset()
        assert not (await sandbox.exec("test -e marker")).ok


async def test_close_deletes_the_sandbox_and_its_pod(make_backend: BackendFactory,
                                                     emulator: ApiServerEmulator,
                                                     spec: SandboxSpec) -> None:
    backend = make_backend()
    sandbox = await backend.create(spec)
    store = emulator.store
    assert store.get("sandboxes", "default", sandbox.id) is not None  # no pool: direct
    await sandbox.close()
    await asyncio.sleep(0.05)
    assert store.list("sandboxclaims", "default") == []
    assert store.list("sandboxes", "default") == []
    assert store.list("pods", "default") == []
    assert emulator.cluster.sandboxes == {}


async def test_warm_pool_claim_adopts_a_warm_sandbox(make_backend: BackendFactory,
                                                    emulator: ApiServerEmulator,
                                                    spec: SandboxSpec) -> None:
    backend = make_backend()
    assert backend.keep_warm(spec, 2)  # the policy wants 2 warm: a pool of 2
    first = await backend.create(spec)
    await asyncio.sleep(0.2)  # let the pool refill
    second = await backend.create(spec)
    assert emulator.store.get("sandboxclaims", "default", second.id) is not None
    launch = [emulator.store.get("sandboxes", "default", s.pod)["metadata"]["labels"][
        "agents.x-k8s.io/launch-type"] for s in (first, second)]
    assert launch[1] == "warm"
    await backend.aclose()
    await asyncio.sleep(0.05)
    assert emulator.store.objects == {}  # pools, templates, claims, pods: all gone


async def test_pool_reuses_one_sandbox_for_a_tasks_rollouts(make_backend: BackendFactory,
                                                            spec: SandboxSpec) -> None:
    backend = make_backend()
    async with Pool(backend, policy=StaticPoolPolicy(size=0)) as pool:
        for _ in range(4):
            async with pool.lease(spec) as sandbox:
                await sandbox.exec("echo hi > scratch.txt")
    # one Sandbox for four rollouts (plus the run's deny-all NetworkPolicy, once)
    creates = {r: n for (v, r), n in backend.stats.by_resource.items() if v == "create"}
    assert creates == {"sandboxes": 1, "networkpolicies": 1}


async def test_raw_pod_mode(make_backend: BackendFactory, emulator: ApiServerEmulator,
                            spec: SandboxSpec) -> None:
    backend = make_backend(mode="pod")
    async with await backend.create(spec) as sandbox:
        assert (await sandbox.exec("echo pod")).stdout == b"pod\n"
        assert emulator.store.get("pods", "default", sandbox.id) is not None
        # network=none: the run's deny-all policy selects the bare pod too (the real
        # cluster's node agent found raw pods with full network before this)
        assert emulator.cluster.networks[("default", sandbox.pod)] is Network.NONE
    await asyncio.sleep(0.05)
    assert emulator.store.list("pods", "default") == []
    creates = {r: n for (v, r), n in backend.stats.by_resource.items() if v == "create"}
    assert creates == {"pods": 1, "networkpolicies": 1}
    async with await backend.create(spec.replace(network=Network.HOST)) as sandbox:
        assert ("default", sandbox.pod) not in emulator.cluster.networks
