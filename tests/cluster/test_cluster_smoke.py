"""The test cluster itself: real components up, nodes from kwok, pods backed by real
sandboxes, pod exec through the real API server, nothing but loopback addresses."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

import pytest
from cluster_support import IMAGE, BackendFactory, kubectl
from rollbox.spec import SandboxSpec
from rollbox_kubernetes.resources import PODS
from rollbox_kubernetes.testing.fixtures import ClusterAccess

pytestmark = pytest.mark.slow
SPEC = SandboxSpec(image=IMAGE, workdir="/work")


def test_nodes_are_kwoks_and_declare_websocket_exec(k8s_cluster: ClusterAccess) -> None:
    plane = k8s_cluster.require_plane()
    nodes = json.loads(kubectl(k8s_cluster, "get", "nodes", "-o", "json").stdout)["items"]
    assert [n["metadata"]["name"] for n in nodes] == list(plane.nodes)
    for node in nodes:
        assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
        assert "ExtendWebSocketsToKubelet" in node["status"]["declaredFeatures"]
        for address in node["status"]["addresses"]:
            if address["type"] == "InternalIP":
                assert ipaddress.ip_address(address["address"]).is_loopback
    version = json.loads(kubectl(k8s_cluster, "version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"].startswith("v1.36.")


@pytest.mark.parametrize("transport", ["exec", "http"])
async def test_a_sandbox_runs_commands(make_backend: BackendFactory, k8s_cluster: ClusterAccess,
                                       transport: str, tmp_path: Path) -> None:
    if transport == "http":
        k8s_cluster.require_http()
    backend = make_backend(transport=transport)
    async with await backend.create(SPEC) as sandbox:
        result = await sandbox.exec("echo hi; echo err >&2; exit 3")
        assert (result.stdout, result.stderr, result.exit_code) == (b"hi\n", b"err\n", 3)
        # the command ran in a sandbox, not on the host: a host file is not there
        secret = tmp_path / "host-only.txt"
        secret.write_text("host")
        assert not (await sandbox.exec(["test", "-e", str(secret)])).ok
        pod = await backend.client.get(PODS, backend.options.namespace, sandbox.pod)
        assert ipaddress.ip_address(pod["status"]["podIP"]).is_loopback
        assert pod["spec"]["nodeName"] in k8s_cluster.require_plane().nodes
    assert backend.transports.stats["execute"] > 0 if transport == "http" else True


@pytest.mark.parametrize("how", [{"warm_replicas": 1}, {}, {"mode": "pod"}],
                         ids=["claim", "sandbox", "pod"])
async def test_a_ready_sandbox_brings_its_pod_ip(make_backend: BackendFactory,
                                                 k8s_cluster: ClusterAccess,
                                                 how: dict[str, object]) -> None:
    """The real controller copies the pod IP into the claim's and the Sandbox's status
    (``podIPs``): the backend reaches the runtime without a GET of the pod."""
    k8s_cluster.require_http()
    # (no look at a slow pod for image errors either: those are GETs of the pod too)
    backend = make_backend(transport="http", probe_after_s=600, **how)
    async with await backend.create(SPEC) as sandbox:
        assert backend.stats.by_resource[("get", "pods")] == 0
        pod = await backend.client.get(PODS, backend.options.namespace, sandbox.pod)
        assert sandbox.pod_ip == pod["status"]["podIP"]
        assert (await sandbox.exec("echo hi")).stdout == b"hi\n"


def test_no_api_version_conversion_fails(k8s_cluster: ClusterAccess) -> None:
    """The controller runs without its conversion webhook, so the CRDs convert with
    ``strategy: None`` (as its startup message asks): a ``Webhook`` strategy pointing at
    no service kept the API server's v1alpha1 watch caches failing, and stalled bursts of
    watches for minutes (docs/benchmarks.md)."""
    plane = k8s_cluster.require_plane()
    for crd in json.loads(kubectl(k8s_cluster, "get", "crd", "-o", "json").stdout)["items"]:
        if crd["spec"]["group"].endswith("agents.x-k8s.io"):
            assert crd["spec"]["conversion"]["strategy"] == "None", crd["metadata"]["name"]
    log = (plane.logs / "kube-apiserver.log").read_text(errors="replace")
    assert "conversion webhook" not in log
