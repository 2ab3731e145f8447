"""pytest fixture ``k8s_cluster``: a kubeconfig of a real Kubernetes cluster with the
agent-sandbox controller, for the tests under tests/cluster.

- ``ROLLBOX_K8S_KUBECONFIG=/path`` (kind, GKE, ...): that cluster, as it is
  (``ROLLBOX_K8S_NAMESPACE``, default ``rollbox-test``, must exist; ``ROLLBOX_K8S_IMAGE``,
  default ``debian:bookworm-slim``; ``ROLLBOX_K8S_RUNTIME_CLASS``;
  ``ROLLBOX_K8S_TRANSPORT``, default ``exec``). Tests that restart control-plane
  components skip there.
- Otherwise the test cluster of tests/cluster: binaries from ``$ROLLBOX_CLUSTER_BIN_DIR``
  or built (once, cached) by tests/cluster/build.sh, started for the session by
  ``ControlPlane`` and stopped at its end. Without Go the tests skip, saying so; under
  ``CI=true`` they fail instead, since CI must run them.

Loaded by tests/conftest.py (``pytest_plugins``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from rollbox_kubernetes.testing.controlplane import ControlPlane

NODE_LABELS = {"pool": "sandbox"}
IMAGE_PULLS = ("--image-disk-gb=20", "--pull-mb-per-s=200", "--time-scale=0.02")
"""The test cluster's node image filesystems: 20 GB each, 200 MB/s, a modelled second
lasting 20 ms (a 4 GB image pulls in 20 modelled seconds, 0.4 s of the test's time);
images are modelled once a test names them in ``ControlPlane.image_manifest``."""


@dataclass(frozen=True)
class ClusterAccess:
    """What a test needs to use a cluster."""

    kubeconfig: str
    namespace: str
    image: str
    """An image the nodes can start: ``host`` on the test cluster (the node agent's
    local backend runs it over the host's system directories)."""
    runtime_class: str | None
    transport: str
    """How commands travel: ``http`` on the test cluster (its node agent serves the
    runtime at every pod IP); ``$ROLLBOX_K8S_TRANSPORT`` (default ``exec``) elsewhere,
    where the image would have to serve it and pod IPs be reachable from here."""
    plane: ControlPlane | None
    """The test cluster's processes (restart, kill), or None for an external cluster."""

    def require_http(self) -> None:
        if self.transport != "http":
            pytest.skip("needs the in-sandbox HTTP runtime (ROLLBOX_K8S_TRANSPORT=http)")

    def require_plane(self) -> ControlPlane:
        if self.plane is None:
            pytest.skip("restarts control-plane processes: only on the test cluster "
                        "(tests/cluster), not on ROLLBOX_K8S_KUBECONFIG's")
        return self.plane


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI must run the real-control-plane tests: {reason}", pytrace=False)
    pytest.skip(reason)


_built: dict[Path, Path] = {}


def cluster_binaries(rootdir: Path) -> Path:
    """The directory tests/cluster/build.sh fills (built now if it is not yet)."""
    given = os.environ.get("ROLLBOX_CLUSTER_BIN_DIR")
    if given:
        return Path(given)
    if rootdir in _built:
        return _built[rootdir]
    if shutil.which("go") is None:
        _unavailable("Go >= 1.26 is not installed: the real control plane (kube-apiserver, "
                     "etcd, kwok, agent-sandbox) is built from Go modules by "
                     "tests/cluster/build.sh; or set ROLLBOX_K8S_KUBECONFIG to a cluster")
    script = rootdir / "tests" / "cluster" / "build.sh"
    result = subprocess.run(["bash", str(script)], stdout=subprocess.PIPE, text=True)
    if result.returncode != 0:
        _unavailable(f"tests/cluster/build.sh failed (exit {result.returncode}); run it "
                     "by hand to see why")
    _built[rootdir] = Path(result.stdout.strip().splitlines()[-1])
    return _built[rootdir]


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    """Build the control plane before the first test that needs it starts its clock: on a
    fresh machine the build takes many minutes, which a per-test timeout (pytest-timeout)
    would count against that test. A build that cannot run is left to the fixture to
    report."""
    if ("k8s_cluster" in getattr(item, "fixturenames", ())
            and not os.environ.get("ROLLBOX_K8S_KUBECONFIG")):
        with contextlib.suppress(pytest.skip.Exception, pytest.fail.Exception):
            cluster_binaries(item.config.rootpath)
    yield


@pytest.fixture(scope="session")
def k8s_cluster(request: pytest.FixtureRequest) -> Iterator[ClusterAccess]:
    external = os.environ.get("ROLLBOX_K8S_KUBECONFIG")
    if external:
        yield ClusterAccess(
            kubeconfig=external,
            namespace=os.environ.get("ROLLBOX_K8S_NAMESPACE", "rollbox-test"),
            image=os.environ.get("ROLLBOX_K8S_IMAGE", "debian:bookworm-slim"),
            runtime_class=os.environ.get("ROLLBOX_K8S_RUNTIME_CLASS") or None,
            transport=os.environ.get("ROLLBOX_K8S_TRANSPORT", "exec"), plane=None)
        return
    bin_dir = cluster_binaries(request.config.rootpath)
    state = Path(tempfile.mkdtemp(prefix="rollbox-cluster-"))
    state.chmod(0o711)  # the node agent's sandboxes live under it
    plane = ControlPlane(bin_dir, state, node_labels=NODE_LABELS, agent_args=IMAGE_PULLS)
    failed = request.session.testsfailed
    plane.start()
    try:
        yield ClusterAccess(kubeconfig=str(plane.kubeconfig), namespace=plane.namespace,
                            image="host", runtime_class=None, transport="http",
                            plane=plane)
    finally:
        plane.stop()
        if request.session.testsfailed == failed and not os.environ.get(
                "ROLLBOX_CLUSTER_KEEP_STATE"):
            shutil.rmtree(state, ignore_errors=True)
        else:
            print(f"\nrollbox test cluster: logs kept in {plane.logs}")
