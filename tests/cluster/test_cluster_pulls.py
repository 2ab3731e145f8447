"""The test cluster's nodes pull images as a kubelet does (testing/imagepulls.py): a pod
of an image the manifest sizes waits in ContainerCreating for its pull, with the
kubelet's events; the node reports what it holds; GC makes room without touching an
image in use; an image no node's disk holds fails the create at once.

The session cluster's nodes have 20 GB image disks, 200 MB/s, and a modelled second of
20 ms (fixtures.IMAGE_PULLS); each test names its own images, so none is there before."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from cluster_support import BackendFactory, kubectl
from rollbox.errors import ImageNotFoundError
from rollbox.spec import SandboxSpec
from rollbox_kubernetes.testing.fixtures import ClusterAccess

pytestmark = pytest.mark.slow
GB = 1_000_000_000


def model(cluster: ClusterAccess, sizes: dict[str, int]) -> list[str]:
    """Add images of ``sizes`` (names made unique) to the node agent's manifest."""
    plane = cluster.require_plane()
    tag = uuid.uuid4().hex[:8]
    named = {f"pulls.test/{name}-{tag}": size for name, size in sizes.items()}
    path = plane.image_manifest
    known = json.loads(path.read_text()) if path.exists() else {}
    known.update({image: {"bytes": size, "runs_as": "host"} for image, size in named.items()})
    path.write_text(json.dumps(known))
    return list(named)


def events(cluster: ClusterAccess, pod: str) -> list[tuple[str, str]]:
    """The kubelet's events on ``pod``, oldest first (by etcd revision: timestamps have
    seconds only)."""
    out = kubectl(cluster, "get", "events", "--field-selector",
                  f"involvedObject.name={pod},source=kubelet", "-o", "json")
    items: list[dict[str, Any]] = json.loads(out.stdout)["items"]
    items.sort(key=lambda e: int(e["metadata"]["resourceVersion"]))
    return [(e["reason"], e["message"]) for e in items]


def node_images(cluster: ClusterAccess, until: Callable[[dict[str, int]], bool]
                ) -> dict[str, int]:
    """What the nodes' status says they hold, once ``until`` holds of it (the node
    agent writes it a moment after a change; 10 s at most)."""
    deadline = time.monotonic() + 10
    while True:
        nodes = json.loads(kubectl(cluster, "get", "nodes", "-o", "json").stdout)["items"]
        held = {i["names"][0]: i["sizeBytes"] for n in nodes
                for i in (n["status"].get("images") or [])}
        if until(held) or time.monotonic() > deadline:
            return held
        time.sleep(0.1)


async def test_a_pod_waits_for_its_pull_once_per_node(make_backend: BackendFactory,
                                                      k8s_cluster: ClusterAccess) -> None:
    (image,) = model(k8s_cluster, {"swe": 4 * GB})
    backend = make_backend(mode="pod", transport=k8s_cluster.transport)
    spec = SandboxSpec(image=image, workdir="/work")
    async with await backend.create(spec) as first:
        assert (await first.exec("echo pulled")).stdout == b"pulled\n"
        said = events(k8s_cluster, first.pod)
        assert [r for r, _ in said] == ["Pulling", "Pulled"], said
        took = re.search(r"in ([0-9.]+)s\. Image size: (\d+) bytes", said[1][1])
        assert took is not None, said  # 4 GB at 200 MB/s: 20 modelled seconds
        assert 20.0 <= float(took[1]) < 40.0 and int(took[2]) == 4 * GB, said
        async with await backend.create(spec) as second:
            again = events(k8s_cluster, second.pod)
            assert [r for r, _ in again] == ["Pulled"], again
            assert "already present" in again[0][1]
    assert node_images(k8s_cluster, lambda held: image in held).get(image) == 4 * GB


async def test_gc_makes_room_but_keeps_what_runs(make_backend: BackendFactory,
                                                 k8s_cluster: ClusterAccess) -> None:
    """20 GB disks, GC past 17 GB down to 16: a 6 GB image in use stays while three
    more of 6 GB come and go."""
    busy, *others = model(k8s_cluster, {"busy": 6 * GB, "a": 6 * GB, "b": 6 * GB,
                                        "c": 6 * GB})
    backend = make_backend(mode="pod", transport=k8s_cluster.transport)
    async with await backend.create(SandboxSpec(image=busy, workdir="/work")):
        for image in others:
            async with await backend.create(SandboxSpec(image=image, workdir="/work")):
                held = node_images(k8s_cluster, lambda held, i=image: i in held)  # type: ignore[misc]
                assert busy in held and image in held, held
                assert sum(held.values()) <= 17 * GB, held
    held = node_images(k8s_cluster, lambda held: others[0] not in held)
    assert busy in held and others[0] not in held, held


async def test_an_image_no_node_holds_fails_the_create_at_once(
        make_backend: BackendFactory, k8s_cluster: ClusterAccess) -> None:
    (huge,) = model(k8s_cluster, {"huge": 30 * GB})
    backend = make_backend(mode="pod", transport=k8s_cluster.transport)
    with pytest.raises(ImageNotFoundError, match="does not fit the node's image filesystem"):
        await backend.create(SandboxSpec(image=huge, workdir="/work"))
