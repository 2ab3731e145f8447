"""Warmth at the right layer: direct Sandboxes for specs core warms itself, a warm pool
sized by the pool policy for specs the backend takes over, pools found in the cluster
used as they are, and nothing left behind on either path."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from polling import until
from rollbox import Pool, StaticPoolPolicy
from rollbox.errors import ImageNotFoundError
from rollbox.policies import LookaheadPolicy
from rollbox.spec import Network, SandboxSpec, Timeouts
from rollbox_kubernetes import KubernetesBackend, render
from rollbox_kubernetes.ops import leftovers, reap
from rollbox_kubernetes.resources import TEMPLATES, WARM_POOLS
from rollbox_kubernetes.status import sandbox_state
from rollbox_kubernetes.testing import ApiServerEmulator

BackendFactory = Callable[..., KubernetesBackend]
NS = "default"


def creates(backend: KubernetesBackend) -> dict[str, int]:
    return {r: n for (v, r), n in backend.stats.by_resource.items() if v == "create"}


def warm(emulator: ApiServerEmulator, pool: str, *, ready: bool = False) -> list[str]:
    """Names of the pool's unclaimed Sandboxes (only ready ones if ``ready``)."""
    return [s["metadata"]["name"] for s in emulator.store.list("sandboxes", NS)
            if (s["metadata"].get("labels") or {}).get("agents.x-k8s.io/warm-pool") == pool
            and (not ready or sandbox_state(s).ready)]


async def test_a_direct_sandbox_end_to_end(make_backend: BackendFactory,
                                          emulator: ApiServerEmulator,
                                          spec: SandboxSpec) -> None:
    backend = make_backend()
    sandbox = await backend.create(spec)
    store = emulator.store
    obj = store.get("sandboxes", NS, sandbox.id)
    assert obj is not None and not obj["metadata"].get("ownerReferences")
    assert sandbox.pod == sandbox.id  # the pod is named after its Sandbox
    assert creates(backend) == {"sandboxes": 1, "networkpolicies": 1}
    assert emulator.cluster.networks[(NS, sandbox.pod)] is Network.NONE  # deny-all applied
    assert await backend.leftovers() == [f"open sandbox {sandbox.id}",
                                         f"Sandbox/{sandbox.id}"]

    await sandbox.exec("echo dirty > tracked.txt; echo new > untracked.txt")
    await sandbox.write_file("notes/a.txt", b"x")
    await sandbox.reset()
    assert await sandbox.read_file("tracked.txt") == b"base\n"
    assert not (await sandbox.exec("test -e untracked.txt || test -e notes")).ok

    await sandbox.close()
    assert await backend.leftovers() == []
    assert store.list("sandboxes", NS) == [] and store.list("pods", NS) == []
    await backend.aclose()
    await asyncio.sleep(0.05)
    assert store.objects == {}  # the run's NetworkPolicy went with it
    assert emulator.cluster.sandboxes == {}


async def test_a_host_network_sandbox_is_not_denied(make_backend: BackendFactory,
                                                   emulator: ApiServerEmulator,
                                                   spec: SandboxSpec) -> None:
    backend = make_backend()
    async with await backend.create(spec.replace(network=Network.HOST)) as sandbox:
        assert (NS, sandbox.pod) not in emulator.cluster.networks
    assert "networkpolicies" not in creates(backend)


async def test_leftovers_and_reap_see_direct_sandboxes(make_backend: BackendFactory,
                                                      emulator: ApiServerEmulator,
                                                      spec: SandboxSpec) -> None:
    backend = make_backend(run_id="crashed")
    sandbox = await backend.create(spec)
    client = await backend.connect()
    assert await leftovers(client, NS, "crashed") == [f"Sandbox/{sandbox.id}"]
    reaped = {r.kind: r.names for r in await reap(client, NS, "crashed")}
    assert reaped["Sandbox"] == [sandbox.id]
    assert reaped["NetworkPolicy"] == [render.deny_all_name(backend.options)]
    await asyncio.sleep(0.05)
    assert emulator.store.objects == {}
    assert await leftovers(client, NS, "crashed", settle_s=0) == []
    backend.live.clear()  # what a crashed process would have lost


async def test_small_lookahead_targets_stay_with_core_as_direct_sandboxes(
        make_backend: BackendFactory, spec: SandboxSpec) -> None:
    backend = make_backend()
    other = spec.replace(env={"TASK": "2"})
    async with Pool(backend, policy=LookaheadPolicy(budget=4)) as pool:
        pool.upcoming([spec, spec, other])  # one warm sandbox per task: target 1 each
        await until(lambda: pool.idle_count() == 2)
        assert not pool.delegated(spec) and not pool.delegated(other)
        pool.upcoming([])  # nothing more to warm: the lease takes the warm one
        async with pool.lease(spec) as sandbox:
            assert (await sandbox.exec("echo hi")).stdout == b"hi\n"
    assert creates(backend) == {"sandboxes": 2, "networkpolicies": 1}


async def test_the_pool_follows_the_policy_up_and_down(make_backend: BackendFactory,
                                                      emulator: ApiServerEmulator,
                                                      spec: SandboxSpec) -> None:
    backend = make_backend()
    policy = StaticPoolPolicy(size=3)
    name = render.template_name(render.spec_key(spec, backend.options), backend.options)
    pool = Pool(backend, policy=policy)
    pool.upcoming([spec])
    assert pool.delegated(spec)
    await until(lambda: len(warm(emulator, name, ready=True)) == 3)
    assert emulator.store.get("sandboxwarmpools", NS, name)["spec"]["replicas"] == 3

    async with pool.lease(spec) as sandbox:  # a claim on a warm one, not a new pod
        claim = emulator.store.get("sandboxclaims", NS, sandbox.id)
        bound = claim["metadata"]["annotations"]["agents.x-k8s.io/sandbox-name"]
        labels = emulator.store.get("sandboxes", NS, bound)["metadata"]["labels"]
        assert labels["agents.x-k8s.io/launch-type"] == "warm"
    assert "sandboxes" not in creates(backend) and pool.idle_count(spec) == 1

    for size in (6, 5, 1):  # a burst of target changes: one patch
        policy.size = size
        pool.upcoming([spec])
    await until(lambda: len(warm(emulator, name)) == 1)
    assert emulator.store.get("sandboxwarmpools", NS, name)["spec"]["replicas"] == 1
    assert backend.stats.by_resource[("patch", "sandboxwarmpools")] == 1

    await pool.close()  # the pool wants none now: scaled to 0, the pool itself stays
    await until(lambda: warm(emulator, name) == [])
    assert emulator.store.get("sandboxwarmpools", NS, name)["spec"]["replicas"] == 0
    await backend.aclose()
    await asyncio.sleep(0.05)
    assert emulator.store.objects == {}


async def test_a_pool_applied_beforehand_is_used_never_scaled_nor_deleted(
        make_backend: BackendFactory, emulator: ApiServerEmulator,
        spec: SandboxSpec) -> None:
    backend = make_backend()
    options = render.KubeOptions(run_id="test", warm_replicas=1)  # `rollbox k8s render`
    client = await backend.connect()
    for res, body in ((TEMPLATES, render.template(spec, options)),
                      (WARM_POOLS, render.warm_pool(spec, options))):
        await client.create(res, NS, body)
    name = render.template_name(render.spec_key(spec, options), options)
    await until(lambda: len(warm(emulator, name, ready=True)) == 1)
    backend.stats.by_resource.clear()  # count the backend's requests only

    async with await backend.create(spec) as sandbox:  # no keep_warm yet: found by LIST
        assert emulator.store.get("sandboxclaims", NS, sandbox.id) is not None
    assert backend.keep_warm(spec, 9)  # the cluster keeps it warm; its size is not ours
    async with await backend.create(spec):
        pass
    await backend.aclose()
    assert creates(backend) == {"sandboxclaims": 2}
    assert ("patch", "sandboxwarmpools") not in backend.stats.by_resource
    assert emulator.store.get("sandboxwarmpools", NS, name)["spec"]["replicas"] == 1
    assert emulator.store.get("sandboxtemplates", NS, name) is not None
    for plural in ("sandboxwarmpools", "sandboxtemplates"):
        emulator.store.delete(plural, NS, name)


async def test_a_pool_made_by_an_earlier_backend_of_the_run_is_reused(
        make_backend: BackendFactory, emulator: ApiServerEmulator,
        spec: SandboxSpec) -> None:
    first = make_backend()
    assert first.keep_warm(spec, 2)
    async with await first.create(spec):
        pass
    second = make_backend()  # the next step of the same run, while the first lives on
    assert second.keep_warm(spec, 4)
    async with await second.create(spec):
        pass
    await second.aclose()
    assert creates(second) == {"sandboxclaims": 1}  # template and pool: 409, used as is
    assert emulator.store.list("sandboxwarmpools", NS) != []  # not second's to delete
    await first.aclose()
    await asyncio.sleep(0.05)
    assert emulator.store.objects == {}


@pytest.mark.parametrize("pooled", [False, True], ids=["direct", "claim"])
async def test_a_failed_create_deletes_what_it_made(make_backend: BackendFactory,
                                                   emulator: ApiServerEmulator,
                                                   pooled: bool) -> None:
    backend = make_backend(probe_after_s=0.1)
    bad = SandboxSpec(image="registry.invalid/nope:1", timeouts=Timeouts(create_s=30))
    if pooled:
        assert backend.keep_warm(bad, 2)
    with pytest.raises(ImageNotFoundError, match="ImagePullBackOff"):
        await backend.create(bad)
    await asyncio.sleep(0.05)
    store = emulator.store
    assert store.list("sandboxclaims", NS) == []
    owned = [s["metadata"]["ownerReferences"][0]["kind"] for s in store.list("sandboxes", NS)]
    assert owned == (["SandboxWarmPool"] * 2 if pooled else [])  # only the pool's own
    assert await backend.leftovers() == []
    await backend.aclose()
    await asyncio.sleep(0.05)
    assert store.objects == {}


def test_terminal_sandbox_conditions() -> None:
    def box(*conds: dict[str, str]) -> dict[str, object]:
        return {"metadata": {"name": "s1"}, "status": {"conditions": list(conds)}}

    finished = sandbox_state(box({"type": "Ready", "status": "False", "reason": "x"},
                                 {"type": "Finished", "status": "True",
                                  "reason": "PodFailed", "message": "OOMKilled"}))
    assert finished.terminal and finished.reason == "PodFailed" and not finished.ready
    expired = sandbox_state(box({"type": "Ready", "status": "False",
                                 "reason": "SandboxExpired"}))
    assert expired.terminal
    starting = sandbox_state(box({"type": "Ready", "status": "False",
                                  "reason": "DependenciesNotReady"}))
    assert not starting.terminal and starting.sandbox == "s1"
    ready = sandbox_state({"metadata": {"name": "s1", "annotations": {
        "agents.x-k8s.io/pod-name": "p1"}}, "status": {"conditions": [
            {"type": "Ready", "status": "True", "reason": "DependenciesReady"}]}})
    assert ready.ready and ready.sandbox == "p1"


async def test_specs_differing_only_in_network_get_their_own_pools(
        make_backend: BackendFactory, emulator: ApiServerEmulator, spec: SandboxSpec) -> None:
    """A warm pool's template carries the network policy, so a ``host`` spec must not
    claim from a ``none`` spec's pool, nor the other way round (found on the real
    cluster: the template key left the network out)."""
    backend = make_backend()
    for network in (Network.HOST, Network.NONE):
        assert backend.keep_warm(spec.replace(network=network), 2)
    async with await backend.create(spec.replace(network=Network.NONE)) as closed, \
            await backend.create(spec.replace(network=Network.HOST)) as open_:
        assert emulator.cluster.networks.get((NS, closed.pod)) is Network.NONE
        assert (NS, open_.pod) not in emulator.cluster.networks
    assert creates(backend)["sandboxtemplates"] == 2
