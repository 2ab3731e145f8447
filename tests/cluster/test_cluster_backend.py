"""The backend against the real control plane where the emulator could only encode our
reading of it: real CRD schemas (server-side apply of `rollbox k8s render`), RBAC
(preflight, and a run as the rendered ServiceAccount), ownership labels and garbage
collection (reap), the real controller's warm pools and claim adoption, the API server's
own 429s (API Priority and Fairness), and components restarting or pods vanishing while
the backend works."""

from __future__ import annotations

import asyncio
import json
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster_support import IMAGE, BackendFactory, kubectl, rollbox_objects
from rollbox import Pool, Sandbox, StaticPoolPolicy
from rollbox.errors import RollboxError, SandboxLostError
from rollbox.spec import Network, SandboxSpec, Timeouts
from rollbox_kubernetes import render
from rollbox_kubernetes.resources import LABEL_RUN
from rollbox_kubernetes.sandbox import KubeSandbox
from rollbox_kubernetes.testing.conformance import ClaimingBackend
from rollbox_kubernetes.testing.fixtures import ClusterAccess

pytestmark = pytest.mark.slow
SPEC = SandboxSpec(image=IMAGE, workdir="/work", timeouts=Timeouts(create_s=60))


def rollbox_cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rollbox", *argv], capture_output=True,
                          text=True, timeout=120)


def get(cluster: ClusterAccess, what: str, name: str = "") -> Any:
    out = kubectl(cluster, "get", what, *([name] if name else []), "-o", "json")
    return json.loads(out.stdout)


async def until(check: Callable[[], bool], timeout: float = 60.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(check):
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout}s: {what}")
        await asyncio.sleep(0.3)


def token_kubeconfig(cluster: ClusterAccess, account: str, path: Any) -> str:
    """A kubeconfig for ServiceAccount ``account`` (a TokenRequest), beside the admin's."""
    token = kubectl(cluster, "create", "token", account).stdout.decode().strip()
    config = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    config["users"] = [{"name": account, "user": {"token": token}}]
    config["contexts"][0]["context"]["user"] = account
    path.write_text(json.dumps(config))
    return str(path)


async def test_render_applies_server_side_and_reap_takes_only_its_run(
        k8s_cluster: ClusterAccess) -> None:
    ns = k8s_cluster.namespace
    for run in ("render-a", "render-b"):
        rendered = rollbox_cli("k8s", "render", "--image", k8s_cluster.image, "--workdir",
                               "/work", "--network", "host", "--replicas", "1", "--run-id",
                               run, "--namespace", ns)
        assert rendered.returncode == 0, rendered.stderr
        kubectl(k8s_cluster, "apply", "--server-side", "-f", "-",
                input=rendered.stdout.encode())
    # the real CRD schemas took every field; the real controller fills each pool
    for run in ("render-a", "render-b"):
        await until(lambda run=run: any(
            (p.get("status") or {}).get("readyReplicas") == 1
            for p in get(k8s_cluster, "sandboxwarmpools")["items"]
            if p["metadata"]["labels"].get(LABEL_RUN) == run), what=f"{run}'s pool ready")
    reaped = rollbox_cli("k8s", "reap", "--run-id", "render-a", "--namespace", ns,
                         "--kubeconfig", k8s_cluster.kubeconfig)
    assert reaped.returncode == 0, reaped.stderr
    assert "deleted 1 SandboxWarmPool(s)" in reaped.stdout
    await until(lambda: rollbox_objects(k8s_cluster, f"{LABEL_RUN}=render-a") == [],
                what="render-a's objects gone (the pool's Sandbox and pod by GC)")
    assert rollbox_objects(k8s_cluster, f"{LABEL_RUN}=render-b")  # the other run's stay
    assert rollbox_cli("k8s", "reap", "--run-id", "render-b", "--namespace", ns,
                       "--kubeconfig", k8s_cluster.kubeconfig).returncode == 0
    await until(lambda: rollbox_objects(k8s_cluster, f"{LABEL_RUN}=render-b") == [],
                what="render-b's objects gone")


async def test_preflight_and_a_run_with_only_the_rendered_role(
        k8s_cluster: ClusterAccess, make_backend: BackendFactory, tmp_path: Any) -> None:
    ns = k8s_cluster.namespace
    rbac = render.dump(render.rbac(render.KubeOptions(namespace=ns)))
    kubectl(k8s_cluster, "apply", "--server-side", "-f", "-", input=rbac.encode())
    try:
        kubeconfig = token_kubeconfig(k8s_cluster, "rollbox", tmp_path / "rollbox.json")
        checked = rollbox_cli("k8s", "preflight", "--namespace", ns, "--kubeconfig",
                              kubeconfig)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert "[FAIL]" not in checked.stdout and "ready for rollbox" in checked.stdout
        # the Role is enough for every path: direct Sandbox (with its deny-all policy),
        # a warm pool and its claims, pod exec and the HTTP runtime
        for backend in (make_backend(kubeconfig=kubeconfig, transport=k8s_cluster.transport),
                        make_backend(ClaimingBackend, kubeconfig=kubeconfig,
                                     warm_pool_min=1, transport="exec")):
            async with await backend.create(SPEC) as sandbox:
                assert (await sandbox.exec("echo ok")).stdout == b"ok\n"
            await backend.aclose()
        kubectl(k8s_cluster, "create", "serviceaccount", "nobody")
        nobody = token_kubeconfig(k8s_cluster, "nobody", tmp_path / "nobody.json")
        denied = rollbox_cli("k8s", "preflight", "--namespace", ns, "--kubeconfig", nobody)
        assert denied.returncode == 1
        assert "[FAIL] can create sandboxclaims: denied" in denied.stdout
    finally:
        kubectl(k8s_cluster, "delete", "serviceaccount,role,rolebinding", "rollbox",
                "--ignore-not-found")
        kubectl(k8s_cluster, "delete", "serviceaccount", "nobody", "--ignore-not-found")


async def test_the_controllers_warm_pool_follows_the_policy(
        k8s_cluster: ClusterAccess, make_backend: BackendFactory) -> None:
    backend = make_backend(scale_delay_s=0.1)
    name = render.template_name(render.spec_key(SPEC, backend.options), backend.options)
    policy = StaticPoolPolicy(size=3)
    pool = Pool(backend, policy=policy)
    pool.upcoming([SPEC])
    assert pool.delegated(SPEC)

    def warm_pool() -> dict[str, Any]:
        return dict(get(k8s_cluster, "sandboxwarmpool", name))

    await until(lambda: (warm_pool().get("status") or {}).get("readyReplicas") == 3,
                what="3 ready in the warm pool")
    async with pool.lease(SPEC) as sandbox:  # a claim adopts a warm sandbox: no new pod
        claim = get(k8s_cluster, "sandboxclaim", sandbox.id)
        bound = claim["status"]["sandbox"]["name"]
        labels = get(k8s_cluster, "sandbox", bound)["metadata"]["labels"]
        assert labels.get("agents.x-k8s.io/launch-type") == "warm", labels
        assert (await sandbox.exec("echo warm")).stdout == b"warm\n"
    for size in (6, 5, 1):  # a burst of target changes: one patch
        policy.size = size
        pool.upcoming([SPEC])
    await until(lambda: warm_pool()["spec"]["replicas"] == 1, what="scaled to 1")
    await until(lambda: (warm_pool().get("status") or {}).get("replicas") == 1,
                what="the controller deleted the surplus")
    assert backend.stats.by_resource[("patch", "sandboxwarmpools")] == 1
    await pool.close()
    await backend.aclose()


async def test_the_api_servers_own_429s_are_waited_out(
        k8s_cluster: ClusterAccess, make_backend: BackendFactory, tmp_path: Any) -> None:
    """API Priority and Fairness with two seats for one user and no queue: a burst is
    answered 429 with Retry-After by the real API server; every create still succeeds."""
    plane = k8s_cluster.require_plane()
    user = plane.users["workload"]
    apf = [{"apiVersion": "flowcontrol.apiserver.k8s.io/v1",
            "kind": "PriorityLevelConfiguration", "metadata": {"name": "rollbox-tiny"},
            "spec": {"type": "Limited", "limited": {
                "nominalConcurrencyShares": 1, "lendablePercent": 0,
                "limitResponse": {"type": "Reject"}}}},
           {"apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema",
            "metadata": {"name": "rollbox-tiny"},
            "spec": {"priorityLevelConfiguration": {"name": "rollbox-tiny"},
                     "matchingPrecedence": 200,
                     "rules": [{"subjects": [{"kind": "User", "user": {"name": user.name}}],
                                "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"],
                                                   "resources": ["*"], "namespaces": ["*"],
                                                   "clusterScope": True}]}]}}]
    body = json.dumps({"apiVersion": "v1", "kind": "List", "items": apf}).encode()
    kubectl(k8s_cluster, "apply", "--server-side", "-f", "-", input=body)
    try:
        _wait_until_classified(k8s_cluster, user, "rollbox-tiny")
        kubeconfig = plane.write_kubeconfig(tmp_path / "workload.json", user.name,
                                            user.token)
        backend = make_backend(kubeconfig=str(kubeconfig), transport="exec", qps=1000,
                               burst=1000)
        first = await backend.create(SPEC)  # the backend's client is open from here
        # On a quiet machine a dozen creates alone can pass two seats without ever
        # overlapping (CI saw no 429 once), and a fixed amount of load beside them can
        # take every 429 itself. So: listings of the same user, each sent once and never
        # retried, from threads that keep sending until the backend has been told 429
        # (then stop, so its retries find free seats); rounds of creates until then.
        def pressure() -> None:
            while not done.is_set() and not backend.stats.retries["429"]:
                _list_once(k8s_cluster, user)

        done = threading.Event()
        load = [asyncio.ensure_future(asyncio.to_thread(pressure)) for _ in range(4)]
        burst: list[Sandbox | BaseException] = []
        try:
            for _ in range(5):
                burst += await asyncio.gather(*(backend.create(SPEC) for _ in range(11)),
                                              return_exceptions=True)
                if backend.stats.retries["429"]:
                    break
        finally:
            done.set()
            await asyncio.gather(*load)
        sandboxes = [first, *(s for s in burst if isinstance(s, Sandbox))]
        try:
            assert [b for b in burst if not isinstance(b, Sandbox)] == []
            outputs = await asyncio.gather(*(s.exec("echo $HOSTNAME") for s in sandboxes))
            assert all(o.ok for o in outputs)
            assert backend.stats.retries["429"] > 0, backend.stats.retries
        finally:
            await asyncio.gather(*(s.close() for s in sandboxes), return_exceptions=True)
    finally:
        kubectl(k8s_cluster, "delete", "flowschema,prioritylevelconfiguration",
                "rollbox-tiny", "--ignore-not-found")


def _list_once(cluster: ClusterAccess, user: Any) -> str | None:
    """One listing of pods as ``user``; the flow schema that filed it (a 429 included)."""
    plane = cluster.require_plane()
    context = ssl.create_default_context(cafile=str(plane.pki.ca))
    request = urllib.request.Request(f"{plane.url}/api/v1/namespaces/{plane.namespace}"
                                     "/pods?limit=1",
                                     headers={"Authorization": f"Bearer {user.token}"})
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as answer:
            return answer.headers.get("X-Kubernetes-PF-FlowSchema-UID")
    except urllib.error.HTTPError as error:  # a 429 of the new level counts too
        return error.headers.get("X-Kubernetes-PF-FlowSchema-UID")


def _wait_until_classified(cluster: ClusterAccess, user: Any, flow_schema: str) -> None:
    """Until the API server files ``user``'s requests under ``flow_schema``: it takes
    new APF configuration up asynchronously (seconds under load), and a burst sent
    before that meets the default limits and no 429."""
    uid = json.loads(kubectl(cluster, "get", "flowschema", flow_schema, "-o", "json").stdout
                     )["metadata"]["uid"]
    deadline = time.monotonic() + 120
    while True:
        if _list_once(cluster, user) == uid:
            return
        assert time.monotonic() < deadline, f"the API server never used {flow_schema}"
        time.sleep(0.2)


async def test_client_pacing_holds_against_the_real_server(
        k8s_cluster: ClusterAccess, make_backend: BackendFactory) -> None:
    backend = make_backend(transport="exec", qps=8, burst=4)
    sandboxes = await asyncio.gather(*(backend.create(SPEC) for _ in range(6)))
    await asyncio.gather(*(s.close() for s in sandboxes))
    assert backend.stats.max_in_window(1.0) <= 4 + 8 + 1


async def test_a_controller_restart_mid_burst_loses_no_claim(
        k8s_cluster: ClusterAccess, make_backend: BackendFactory) -> None:
    plane = k8s_cluster.require_plane()
    backend = make_backend(ClaimingBackend, warm_pool_min=1, transport="http")
    creates = [asyncio.ensure_future(backend.create(SPEC)) for _ in range(8)]
    await asyncio.sleep(0.5)
    await asyncio.to_thread(plane.restart, "agent-sandbox-controller")
    sandboxes = await asyncio.gather(*creates)
    assert len({s.pod for s in sandboxes}) == 8  # eight sandboxes, no pod shared
    outputs = await asyncio.gather(*(s.exec("echo ok") for s in sandboxes))
    assert all(o.stdout == b"ok\n" for o in outputs)
    await asyncio.gather(*(s.close() for s in sandboxes))


@pytest.mark.parametrize("transport", ["http", "exec"])
async def test_a_pod_deleted_mid_command_is_sandbox_lost(
        k8s_cluster: ClusterAccess, make_backend: BackendFactory, transport: str) -> None:
    if transport == "http":
        k8s_cluster.require_http()
    backend = make_backend(transport=transport)
    sandbox = await backend.create(SPEC)
    running = asyncio.ensure_future(sandbox.exec("sleep 60", timeout=90))
    await asyncio.sleep(1.0)
    started = time.monotonic()
    await asyncio.to_thread(kubectl, k8s_cluster, "delete", "pod", sandbox.pod,
                            "--grace-period=0", "--force", "--wait=false")
    with pytest.raises(SandboxLostError):
        await running
    assert time.monotonic() - started < 30
    await sandbox.close()


@pytest.mark.parametrize("transport", ["http", "exec"])
async def test_a_pod_made_again_under_the_same_name_is_not_the_sandboxs(
        k8s_cluster: ClusterAccess, make_backend: BackendFactory, transport: str) -> None:
    """agent-sandbox's controller makes a Sandbox's deleted pod again under its name: the
    rollout's next command must not run there as if its files were still in it."""
    if transport == "http":
        k8s_cluster.require_http()
    backend = make_backend(transport=transport)
    sandbox = await backend.create(SPEC)
    try:
        await sandbox.write_file("/work/progress.txt", b"half done")
        first = get(k8s_cluster, "pod", sandbox.pod)["metadata"]["uid"]
        await asyncio.to_thread(kubectl, k8s_cluster, "delete", "pod", sandbox.pod,
                                "--grace-period=0", "--force", "--wait=false")

        def made_again() -> bool:
            found = kubectl(k8s_cluster, "get", "pod", sandbox.pod, "-o", "json", check=False)
            return found.returncode == 0 and json.loads(found.stdout)["metadata"]["uid"] != first

        await until(made_again, what=f"the controller to make pod {sandbox.pod} again")
        assert isinstance(sandbox, KubeSandbox)
        await until(lambda: sandbox.lost, timeout=10, what="the pod watch to see it")
        with pytest.raises(SandboxLostError):
            await sandbox.exec(["cat", "/work/progress.txt"])
    finally:
        await sandbox.close()


async def test_the_api_server_restarting_under_creates_and_commands(
        k8s_cluster: ClusterAccess, make_backend: BackendFactory) -> None:
    plane = k8s_cluster.require_plane()
    backend = make_backend(transport="http")
    first = await backend.create(SPEC)
    creates = [asyncio.ensure_future(backend.create(SPEC)) for _ in range(3)]
    await asyncio.sleep(0.2)
    restart = asyncio.ensure_future(asyncio.to_thread(plane.restart, "kube-apiserver"))
    # the HTTP runtime does not go through the API server: commands go on meanwhile
    assert (await first.exec("echo during")).stdout == b"during\n"
    await restart
    # Creates in flight are retried and their watches resumed; one whose pod the restart
    # cost (its node lost the API server meanwhile) fails retryably, and its retry works.
    results = await asyncio.gather(*creates, return_exceptions=True)
    made = [first, *(r for r in results if not isinstance(r, BaseException))]
    try:
        failed = [r for r in results if isinstance(r, BaseException)]
        assert all(isinstance(e, RollboxError) and e.retryable for e in failed), failed
        made += [await backend.create(SPEC) for _ in failed]
        for sandbox in made:
            assert (await sandbox.exec("echo after")).stdout == b"after\n"
    finally:
        await asyncio.gather(*(sandbox.close() for sandbox in made))


@pytest.mark.parametrize("mode", ["claim", "sandbox", "pod"])
async def test_network_none_is_denied_by_policy_in_every_mode(
        k8s_cluster: ClusterAccess, make_backend: BackendFactory, mode: str) -> None:
    """What the pod's NetworkPolicies say, as the node agent (the CNI here) read them:
    ``network=none`` denies egress, ``host`` does not. (Raw pods were not covered by the
    run's deny-all policy before this ran against a real cluster.)"""
    k8s_cluster.require_plane()  # the node agent reports its decision as a condition
    if mode == "claim":
        backend = make_backend(ClaimingBackend, warm_pool_min=1)
    else:
        backend = make_backend(mode="pod" if mode == "pod" else "claim")
    for network, denied in ((Network.NONE, "True"), (Network.HOST, "False")):
        async with await backend.create(SPEC.replace(network=network)) as sandbox:
            pod = get(k8s_cluster, "pod", sandbox.pod)
            conditions = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
            assert conditions["rollbox.dev/EgressDenied"] == denied, (network, conditions)
