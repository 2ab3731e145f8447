"""Image planning's pure parts (hydration.py): how nodes are read, how a sandbox is
placed and counted, how image names and quantities are understood, what a prepull pod
and a preferred node look like. The prepulls themselves run on the real control plane
(tests/cluster/test_cluster_hydration.py)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from rollbox.errors import ImageError
from rollbox_kubernetes import render
from rollbox_kubernetes.hydration import (
    GB,
    Hydration,
    NodeView,
    PlanningOptions,
    normal,
    pulled,
    quantity_bytes,
)

OPTIONS = render.KubeOptions(namespace="ns", run_id="r1")


def node(name: str, *, ready: bool = True, unschedulable: bool = False,
         storage: str = "100Gi", images: list[tuple[list[str], int]] = ()) -> dict[str, Any]:
    return {"metadata": {"name": name},
            "spec": {"unschedulable": True} if unschedulable else {},
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                       "capacity": {"ephemeral-storage": storage},
                       "images": [{"names": n, "sizeBytes": s} for n, s in images]}}


def hydration(**options: Any) -> Hydration:
    backend = SimpleNamespace(options=OPTIONS)
    return Hydration(backend, PlanningOptions(**options))  # type: ignore[arg-type]


def test_nodes_are_read_as_the_planner_needs_them() -> None:
    h = hydration()
    assert h._view_of(node("down", ready=False)) is None
    assert h._view_of(node("cordoned", unschedulable=True)) is None
    view = h._view_of(node("n0", storage="20G", images=[
        (["docker.io/library/python@sha256:ab", "docker.io/library/python:3.11"], 3 * GB)]))
    assert view is not None and view.capacity == 20 * GB
    assert view.present["docker.io/library/python:3.11"] == 3 * GB
    assert h.size_of("python:3.11") == 3 * GB  # learned from the node
    assert hydration(image_disk_bytes=GB)._view_of(node("n1")).capacity == GB  # type: ignore[union-attr]


async def test_a_sandbox_goes_where_its_image_is_and_is_counted_until_released() -> None:
    h = hydration()
    h.nodes = {"a": NodeView("a", 100 * GB), "b": NodeView("b", 100 * GB,
                                                           present={normal("img"): GB})}
    h._refreshed_at = asyncio.get_running_loop().time()  # no node list needed
    assert await h.place("s1", "img") == "b"
    assert await h.place("s2", "img") == "b"  # the only holder, however many it runs
    assert h.counts["placed"] == 2 and h.nodes["b"].placed == 2
    h.released("s1")
    h.released("s1")  # once only
    assert h.nodes["b"].placed == 1
    await h.aclose()


async def test_an_image_known_to_be_too_large_for_every_node_is_refused() -> None:
    h = hydration(image_sizes={"huge": 30 * GB})
    h.nodes = {"a": NodeView("a", 20 * GB)}
    h._refreshed_at = asyncio.get_running_loop().time()
    with pytest.raises(ImageError, match="larger than any node's image disk"):
        await h.place("s1", "huge")


@pytest.mark.parametrize(("given", "expected"), [
    ("python", "docker.io/library/python:latest"),
    ("python:3.11", "docker.io/library/python:3.11"),
    ("org/app:1", "docker.io/org/app:1"),
    ("ghcr.io/org/app", "ghcr.io/org/app:latest"),
    ("localhost:5000/app", "localhost:5000/app:latest"),
    ("app@sha256:ab", "docker.io/library/app@sha256:ab"),
])
def test_image_names_are_compared_as_nodes_report_them(given: str, expected: str) -> None:
    assert normal(given) == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("100Gi", 100 * 2**30), ("20G", 20 * GB), ("1e9", GB), ("123", 123), ("", 0),
    ("lots", 0)])
def test_quantities(text: str, expected: int) -> None:
    assert quantity_bytes(text) == expected


def test_a_prepull_is_done_once_its_container_started_ended_or_could_not_pull() -> None:
    def pod(state: dict[str, Any], phase: str = "Pending") -> dict[str, Any]:
        return {"status": {"phase": phase, "containerStatuses": [{"state": state}]}}
    assert pulled(pod({"waiting": {"reason": "ContainerCreating"}})) is None
    assert pulled({"status": {"phase": "Pending"}}) is None
    assert pulled(pod({"running": {}}, "Running")) == ""
    assert pulled(pod({"terminated": {"exitCode": 127}}, "Failed")) == ""
    assert pulled(pod({"waiting": {"reason": "ErrImagePull", "message": "no room"}})) == (
        "ErrImagePull: no room")


def test_a_prepull_pod_is_bound_small_and_the_runs() -> None:
    body = render.prepull_pod("r1-pp-1", "img:1", "n3", OPTIONS)
    assert body["spec"]["nodeName"] == "n3" and body["spec"]["restartPolicy"] == "Never"
    assert body["metadata"]["labels"]["rollbox.dev/run"] == "r1"
    assert body["metadata"]["labels"]["rollbox.dev/prepull"] == "true"
    preferred = render.prefer_nodes({"containers": []}, ["n2", "n1"])
    term = preferred["affinity"]["nodeAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert term["weight"] == 100 and term["preference"]["matchFields"][0]["values"] == [
        "n1", "n2"]
    assert render.prefer_nodes({"containers": []}, []) == {"containers": []}


def test_planning_options_are_checked() -> None:
    with pytest.raises(ValueError, match="image planning"):
        PlanningOptions(pulls_per_node=0)


async def test_without_leave_to_read_nodes_planning_stops_and_creates_go_on(
        make_backend: Any, spec: Any, caplog: pytest.LogCaptureFixture) -> None:
    backend = make_backend(mode="pod", image_planning=True)  # the emulator serves no nodes
    backend.hint_upcoming([spec.image])
    async with await backend.create(spec) as box:
        assert (await box.exec(["echo", "ok"])).stdout == b"ok\n"
    assert backend.hydration.stopped_by.startswith("cannot list nodes")
    assert "image planning is off" in caplog.text
    assert backend.hydration.counts["prepulls"] == 0


async def test_a_warm_create_does_not_wait_for_an_image_no_pull_could_bring() -> None:
    h = hydration(image_sizes={"big": 3 * GB})
    h.nodes = {"a": NodeView("a", 2 * GB, present={normal("other"): GB})}
    h._in_use[normal("other")] = 1  # held: GC cannot make room
    h._refreshed_at = asyncio.get_running_loop().time()
    async with asyncio.timeout(1):
        await h.hydrated("big")  # no room, nothing in flight: the pod will pull it itself
    assert h.counts["prepulls"] == 0 and not h._awaited
