"""Throttling, server errors, dropped watches, claims that never become ready, bad input:
each ends in a clear error or a success, and nothing is left behind."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from rollbox.errors import (
    BackendUnavailableError,
    CreateFailedError,
    ImageNotFoundError,
    SandboxError,
    WorkloadError,
)
from rollbox.spec import SandboxSpec, Timeouts
from rollbox_kubernetes import ApiError, KubernetesBackend
from rollbox_kubernetes.sandbox import KubeSandbox
from rollbox_kubernetes.testing import ApiServerEmulator

BackendFactory = Callable[..., KubernetesBackend]


def assert_nothing_left(emulator: ApiServerEmulator, *plurals: str) -> None:
    for plural in plurals or ("sandboxclaims", "pods", "sandboxes"):
        assert emulator.store.list(plural, "default") == [], plural


async def test_429_storm_pauses_every_caller_for_retry_after(
        make_backend: BackendFactory, emulator: ApiServerEmulator, spec: SandboxSpec) -> None:
    backend = make_backend()
    await backend.create(spec)  # template and pool exist now
    # On creates only: the backend's pod watch (a list, then a watch) runs beside them,
    # and a list told 429 while creates were already on their way would see those land.
    emulator.inject(429, 6, retry_after=0.3, verbs=("create",))
    emulator.stamps.clear()
    loop = asyncio.get_running_loop()
    started = loop.time()
    sandboxes = await asyncio.gather(*(backend.create(spec) for _ in range(3)))
    assert len(sandboxes) == 3
    assert loop.time() - started >= 0.3 * 2  # at least two Retry-After pauses were waited
    assert backend.stats.retries["429"] == 6
    # after the last 429 the server saw nothing for the Retry-After pause
    last = max(emulator.fault_stamps)
    assert min(t for _, t in emulator.stamps if t > last) - last >= 0.29


async def test_callers_told_429_come_back_spread_not_together(
        make_backend: BackendFactory, emulator: ApiServerEmulator, spec: SandboxSpec) -> None:
    """Released together after Retry-After, a burst meets a server with few seats again
    (every caller using up an attempt each time); told callers spread over the next one."""
    backend = make_backend()
    await backend.create(spec)
    emulator.inject(429, 12, retry_after=0.3, verbs={"create"})
    emulator.stamps.clear()
    sandboxes = await asyncio.gather(*(backend.create(spec) for _ in range(12)))
    assert len(sandboxes) == 12 and backend.stats.retries["429"] == 12
    last = max(emulator.fault_stamps)
    retries = [t for verb, t in emulator.stamps if verb == "create" and t > last]
    assert len(retries) == 12
    assert min(retries) - last >= 0.29  # none before Retry-After
    # uniform over the next 0.3 s: twelve within 0.075 s of each other is a 1-in-10^5 event
    assert max(retries) - min(retries) >= 0.075, retries


async def test_500s_are_retried_for_idempotent_calls(
        make_backend: BackendFactory, emulator: ApiServerEmulator, spec: SandboxSpec) -> None:
    backend = make_backend()
    emulator.inject(500, 2, verbs={"create"})
    emulator.inject(503, 2, verbs={"delete"})
    sandbox = await backend.create(spec)
    assert (await sandbox.exec("echo ok")).stdout == b"ok\n"
    await sandbox.close()
    assert backend.stats.retries["500"] == 2 and backend.stats.retries["503"] == 2
    await asyncio.sleep(0.05)
    assert_nothing_left(emulator)


async def test_retried_create_that_had_succeeded_is_not_duplicated(
        make_backend: BackendFactory, emulator: ApiServerEmulator) -> None:
    backend = make_backend()
    client = await backend.connect()
    from rollbox_kubernetes.resources import PODS

    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p1"},
            "spec": {"containers": [{"name": "sandbox", "image": "x"}]}}
    emulator.inject(500, 1, verbs={"create"}, after=True)  # created, but the answer is lost
    created = await client.create(PODS, "default", body)
    assert created["metadata"]["name"] == "p1"
    assert len(emulator.store.list("pods", "default")) == 1
    assert backend.stats.by_verb["create"] == 2 and backend.stats.by_verb["get"] == 1
    with pytest.raises(ApiError) as info:  # a 409 on the first try is a real conflict
        await client.create(PODS, "default", body)
    assert info.value.status == 409
    await client.delete(PODS, "default", "p1")


async def test_dropped_watches_resume_from_last_resource_version(
        make_backend: BackendFactory, emulator: ApiServerEmulator, spec: SandboxSpec) -> None:
    backend = make_backend()
    emulator.cluster.stall_images.add(spec.image)
    task = asyncio.ensure_future(backend.create(spec))
    for _ in range(3):
        await asyncio.sleep(0.2)
        emulator.drop_watches()
    emulator.cluster.stall_images.clear()
    # let the stalled pod start now: recreate it through the kubelet path
    (pod,) = emulator.store.list("pods", "default")
    await emulator.cluster._start_pod("default", pod["metadata"]["name"])
    sandbox = await asyncio.wait_for(task, 10)
    assert (await sandbox.exec("echo back")).stdout == b"back\n"
    assert backend.stats.by_verb["watch"] >= 3


async def test_a_watch_outlasts_an_api_server_away_past_the_retry_budget(
        make_backend: BackendFactory, emulator: ApiServerEmulator, spec: SandboxSpec) -> None:
    """As when the API server restarts: the watch of a starting sandbox is cut and its
    reconnects fail for longer than other calls would retry; the create still ends well
    (found against a real kube-apiserver restarted under creates, tests/cluster)."""
    backend = make_backend()
    client = await backend.connect()
    client.backoff_s, client.max_backoff_s = 0.01, 0.05
    emulator.cluster.stall_images.add(spec.image)
    task = asyncio.ensure_future(backend.create(spec))
    await asyncio.sleep(0.3)
    emulator.inject(503, client.max_retries * 2, verbs={"watch"})
    emulator.drop_watches()
    await asyncio.sleep(0.5)
    emulator.cluster.stall_images.clear()
    (pod,) = emulator.store.list("pods", "default")
    await emulator.cluster._start_pod("default", pod["metadata"]["name"])
    sandbox = await asyncio.wait_for(task, 10)
    assert (await sandbox.exec("echo back")).stdout == b"back\n"
    assert backend.stats.retries["503"] >= client.max_retries * 2


async def test_claim_that_never_becomes_ready_times_out_cleanly(
        make_backend: BackendFactory, emulator: ApiServerEmulator, spec: SandboxSpec) -> None:
    backend = make_backend()
    emulator.cluster.stall_images.add(spec.image)
    slow = spec.replace(timeouts=Timeouts(create_s=1.0))
    with pytest.raises(CreateFailedError, match=r"ready within 1.0s"):
        await backend.create(slow)
    await asyncio.sleep(0.05)
    assert_nothing_left(emulator)


async def test_image_pull_failure_is_reported_within_seconds(
        make_backend: BackendFactory, emulator: ApiServerEmulator) -> None:
    backend = make_backend(probe_after_s=0.2)
    bad = SandboxSpec(image="registry.invalid/nope:1", timeouts=Timeouts(create_s=30))
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(ImageNotFoundError, match="ImagePullBackOff"):
        await backend.create(bad)
    assert loop.time() - started < 5
    await asyncio.sleep(0.05)
    assert_nothing_left(emulator)


async def test_image_pull_failure_in_pod_mode(make_backend: BackendFactory,
                                              emulator: ApiServerEmulator) -> None:
    backend = make_backend(mode="pod")
    with pytest.raises(ImageNotFoundError):
        await backend.create(SandboxSpec(image="registry.invalid/nope:1"))
    await asyncio.sleep(0.05)
    assert_nothing_left(emulator, "pods")


async def test_unschedulable_template(make_backend: BackendFactory,
                                      emulator: ApiServerEmulator, spec: SandboxSpec) -> None:
    backend = make_backend(node_selector={"pool": "gpu"},
                           unschedulable_grace_s=0.3, probe_after_s=0.2)
    with pytest.raises(CreateFailedError, match=r"cannot be scheduled.*nodeSelector"):
        await backend.create(spec)
    await asyncio.sleep(0.05)
    assert_nothing_left(emulator)


async def test_missing_namespace(make_backend: BackendFactory, spec: SandboxSpec) -> None:
    with pytest.raises(BackendUnavailableError, match="kubectl create namespace nowhere"):
        await make_backend(namespace="nowhere").create(spec)


async def test_missing_crds(make_backend: BackendFactory, emulator: ApiServerEmulator,
                            spec: SandboxSpec) -> None:
    emulator.crds = False
    with pytest.raises(BackendUnavailableError, match="agent-sandbox CRDs"):
        await make_backend().create(spec)


async def test_rbac_forbidden(make_backend: BackendFactory, emulator: ApiServerEmulator,
                              spec: SandboxSpec) -> None:
    backend = make_backend()
    await backend.create(spec)
    emulator.forbidden.add(("create", "sandboxes"))
    with pytest.raises(BackendUnavailableError, match=r"forbidden.*rollbox k8s render"):
        await backend.create(spec)


async def test_no_kubeconfig(tmp_path: object, monkeypatch: pytest.MonkeyPatch,
                             spec: SandboxSpec) -> None:
    monkeypatch.setenv("KUBECONFIG", "/nonexistent/kubeconfig")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    backend = KubernetesBackend(run_id="t")
    with pytest.raises(BackendUnavailableError, match="KUBECONFIG"):
        await backend.create(spec)


async def test_a_template_the_controller_has_not_seen_yet_does_not_fail_the_claim(
        make_backend: BackendFactory, emulator: ApiServerEmulator, spec: SandboxSpec) -> None:
    """The real controller answered a claim made right after its template with
    TemplateNotFound (its cache lagged; it retries a minute later): the backend sees the
    template exists and updates the claim, which makes the controller look again."""
    backend = make_backend()
    assert backend.keep_warm(spec, 2)  # creates go through claims on a warm pool
    emulator.cluster.unseen_templates = 2
    async with await backend.create(spec) as sandbox:
        assert (await sandbox.exec("echo bound")).stdout == b"bound\n"
    assert emulator.cluster.unseen_templates == 0
    assert backend.stats.retries["TemplateNotFound"] >= 1


async def test_a_claim_whose_pool_was_deleted_fails_with_what_is_gone(
        make_backend: BackendFactory, emulator: ApiServerEmulator, spec: SandboxSpec) -> None:
    backend = make_backend()
    assert backend.keep_warm(spec, 2)
    await (await backend.create(spec)).close()  # a claim on the pool worked
    from rollbox_kubernetes import render
    from rollbox_kubernetes.resources import WARM_POOLS

    client = await backend.connect()
    pool = render.template_name(render.spec_key(spec, backend.options), backend.options)
    await client.delete(WARM_POOLS, "default", pool)
    with pytest.raises(CreateFailedError, match=f"SandboxWarmPool {pool} is gone"):
        await backend.create(spec)


async def test_claim_on_missing_pool_fails_fast(make_backend: BackendFactory,
                                                emulator: ApiServerEmulator,
                                                spec: SandboxSpec) -> None:
    backend = make_backend()
    from rollbox_kubernetes import render
    from rollbox_kubernetes.resources import CLAIMS
    from rollbox_kubernetes.status import claim_state

    client = await backend.connect()
    key = render.spec_key(spec, backend.options)
    created = await client.create(CLAIMS, "default",
                                  render.claim("c-missing", "no-such-pool", key, backend.options))
    with pytest.raises(CreateFailedError, match="WarmPoolNotFound"):
        await backend._await_ready(CLAIMS, "c-missing", created, spec, claim_state)
    await client.delete(CLAIMS, "default", "c-missing")


async def test_a_delete_the_api_server_refused_is_made_again_at_aclose(
        make_backend: BackendFactory, emulator: ApiServerEmulator, spec: SandboxSpec) -> None:
    """A close whose delete the API server would not take (overloaded past the client's
    retries: 14 Sandboxes of a 1,000 x 4 burst on a loaded machine) left the object
    behind, silently. The backend keeps it and deletes it again at ``aclose``."""
    backend = make_backend()
    sandbox = await backend.create(spec)
    backend.client.max_retries = 0  # give up at the first refusal
    emulator.inject(503, 1, verbs={"delete"})
    await sandbox.close()
    assert emulator.store.get("sandboxes", "default", sandbox.id) is not None
    await backend.aclose()
    await asyncio.sleep(0.05)
    assert_nothing_left(emulator)


async def test_a_delete_refused_to_the_end_is_named_with_the_command_that_removes_it(
        make_backend: BackendFactory, emulator: ApiServerEmulator, spec: SandboxSpec,
        caplog: pytest.LogCaptureFixture) -> None:
    backend = make_backend()
    sandbox = await backend.create(spec)
    backend.client.max_retries = 0
    emulator.inject(503, 100, verbs={"delete"})  # every delete, to the end
    await sandbox.close()
    await backend.aclose()
    assert emulator.store.get("sandboxes", "default", sandbox.id) is not None
    assert f"Sandbox {sandbox.id}" in caplog.text  # its network policy is named too
    assert "rollbox k8s reap --run-id test" in caplog.text
    emulator.faults.clear()
    cleaner = make_backend()  # what the log says to do, by hand: the next test starts clean
    await cleaner.connect()
    from rollbox_kubernetes.ops import reap

    await reap(cleaner.client, "default", "test")


@pytest.mark.parametrize(("status", "workload"), [
    ({"phase": "Failed", "reason": "Evicted", "message": "Pod ephemeral local storage usage "
      "exceeds the total limit of containers 64Mi."}, True),
    ({"phase": "Failed", "reason": "Evicted",
      "message": "The node was low on resource: ephemeral-storage."}, False),
])
async def test_a_pod_evicted_past_its_own_limit_is_the_workloads_failure(
        make_backend: BackendFactory, emulator: ApiServerEmulator, spec: SandboxSpec,
        status: dict[str, str], workload: bool) -> None:
    """A kubelet evicts a pod past its ephemeral-storage limit (where the test cluster's
    nodes stop it with ENOSPC): the rollout filled its own disk, so the error says so and
    is not retryable; a node short of disk evicting it is the infrastructure's."""
    backend = make_backend(mode="pod")
    sandbox = await backend.create(spec)
    assert isinstance(sandbox, KubeSandbox)
    emulator.store.patch("pods", "default", sandbox.pod, {"status": status})
    await emulator.cluster.backing_sandbox("default", sandbox.pod).close()
    with pytest.raises(SandboxError) as caught:
        await sandbox.exec("true", timeout=10)
    assert isinstance(caught.value, WorkloadError) is workload
    assert caught.value.retryable is not workload
    with pytest.raises(type(caught.value)):  # and so it stays
        await sandbox.exec("true", timeout=10)
    await sandbox.close()
