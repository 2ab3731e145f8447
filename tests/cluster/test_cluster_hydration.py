"""Image planning on the real control plane (``image_planning=True``, hydration.py): the
images a run hints are pulled onto a node by prepull pods before a rollout asks, never
past the disk the planner was given, and held there until used or no longer wanted; a
sandbox goes to the node that holds its image and finds it there; a prepull that cannot
be had is one counted failure; an image larger than every node's disk fails the create
before anything is made.

The session cluster has one node; spreading over many is the scale benchmark's
(``bench_kubernetes_scale.py --pulls``) and the planner's own tests (tests/core)."""

from __future__ import annotations

import json

import pytest
from cluster_support import BackendFactory, kubectl
from polling import until
from rollbox.errors import ImageError
from rollbox.spec import SandboxSpec
from rollbox_kubernetes.resources import LABEL_PREPULL
from rollbox_kubernetes.testing.fixtures import ClusterAccess
from test_cluster_pulls import events, model, node_images

pytestmark = pytest.mark.slow
GB = 1_000_000_000


def prepull_pods(cluster: ClusterAccess) -> list[str]:
    out = kubectl(cluster, "get", "pods", "-l", LABEL_PREPULL, "-o", "json")
    return [p["metadata"]["name"] for p in json.loads(out.stdout)["items"]]


async def test_hinted_images_are_there_before_their_sandboxes(
        make_backend: BackendFactory, k8s_cluster: ClusterAccess) -> None:
    # Images of 1 GB (small, so the node's 20 GB stay free for the other tests), a disk
    # of 4 GB for the planner: 3.4 GB under GC's threshold, room for three.
    images = model(k8s_cluster, {f"hint{i}": GB for i in range(5)})
    backend = make_backend(mode="pod", transport=k8s_cluster.transport, image_planning=True,
                           image_disk_bytes=4 * GB, image_sizes=dict.fromkeys(images, GB))
    hydration = backend.hydration
    assert hydration is not None
    backend.hint_upcoming(images)
    await until(lambda: hydration.counts["prepulled"] >= 3, timeout=60)
    assert not hydration.stopped_by
    held = node_images(k8s_cluster, lambda held: all(i in held for i in images[:3]))
    assert all(i in held for i in images[:3]), held
    assert not any(i in held for i in images[3:]), held  # no room for them yet
    assert hydration.counts["prepulls"] == 3 and hydration.counts["prepull_failures"] == 0
    # Their prepull pods stay until a sandbox uses the image, so that GC keeps it.
    assert len(prepull_pods(k8s_cluster)) == 3

    async with await backend.create(SandboxSpec(image=images[0], workdir="/work")) as box:
        said = events(k8s_cluster, box.pod)
        assert [r for r, _ in said] == ["Pulled"] and "already present" in said[0][1], said
        pod = json.loads(kubectl(k8s_cluster, "get", "pod", box.pod, "-o", "json").stdout)
        preferred = pod["spec"]["affinity"]["nodeAffinity"][
            "preferredDuringSchedulingIgnoredDuringExecution"][0]
        assert preferred["preference"]["matchFields"][0]["values"] == [pod["spec"]["nodeName"]]
        assert hydration.counts["placed"] == 1 and hydration.counts["placement_misses"] == 0

    # The window moves on: the first three are no longer wanted (their pods go, GC may
    # take them) and the last two get their room.
    backend.hint_upcoming(images[3:])
    await until(lambda: hydration.counts["prepulled"] == 5, timeout=60)
    await until(lambda: len(prepull_pods(k8s_cluster)) == 2, timeout=20)
    backend.hint_upcoming([])
    await until(lambda: not prepull_pods(k8s_cluster), timeout=20)


async def test_a_prepull_that_cannot_be_had_is_one_counted_failure(
        make_backend: BackendFactory, k8s_cluster: ClusterAccess) -> None:
    # The planner does not know its size (2 GB by default); the node cannot hold it.
    (huge,) = model(k8s_cluster, {"unplannable": 30 * GB})
    backend = make_backend(mode="pod", transport=k8s_cluster.transport, image_planning=True,
                           image_disk_bytes=20 * GB)
    hydration = backend.hydration
    assert hydration is not None
    backend.hint_upcoming([huge])
    await until(lambda: hydration.counts["prepull_failures"] == 1, timeout=60)
    assert hydration.counts["prepulls"] == 1 and hydration.counts["prepulled"] == 0
    await until(lambda: not prepull_pods(k8s_cluster), timeout=20)


async def test_an_image_larger_than_every_disk_fails_before_anything_is_made(
        make_backend: BackendFactory, k8s_cluster: ClusterAccess) -> None:
    (huge,) = model(k8s_cluster, {"too-large": 30 * GB})
    backend = make_backend(mode="pod", transport=k8s_cluster.transport, image_planning=True,
                           image_disk_bytes=20 * GB, image_sizes={huge: 30 * GB})
    with pytest.raises(ImageError, match="larger than any node's image disk"):
        await backend.create(SandboxSpec(image=huge, workdir="/work"))
    assert backend.stats.mutations == 0
