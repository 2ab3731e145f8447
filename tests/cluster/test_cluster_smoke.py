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
