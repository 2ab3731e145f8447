"""Images across a cluster: pulled onto chosen nodes ahead of need, and each sandbox
placed where its image is (``image_planning=True``; docs/kubernetes.md).

A task's image is often larger than a gigabyte and there are thousands of them, more
than a node's disk holds. Left to the scheduler, a sandbox lands on any node and waits
there for its pull, on the critical path; a hundred tasks of one step pull at once on
the same few nodes. Here the backend plans instead, with core's ``PlacementPlanner``
(its rules are in rollbox/placement.py):

* **what the cluster says**: the nodes (those the backend's ``node_selector`` selects,
  Ready and schedulable), each one's image disk (``image_disk_bytes``, else its
  ``ephemeral-storage`` capacity) and the images it holds (``status.images``, which
  also tells image sizes not given in ``image_sizes``). Read with one ``list`` every
  ``refresh_s`` at most; nodes are cluster-scoped, so this needs a ClusterRole
  (``rollbox k8s render --image-planning``);
* **ahead of need**: the images ``hint_upcoming`` names (the runner's queue, then what
  ``Pool.expect`` says of the next step), soonest first, are pulled by *prepull pods*:
  bound to the planner's node by ``nodeName``, a container of the image that exits at
  once, kept (holding the image against GC) until a sandbox of the image runs or the
  image is no longer wanted, then deleted. They are the run's
  (the reaper removes one a crash left behind), paced by the client's limiter like any
  write, at most ``pulls_per_node`` at once on a node, never past its disk;
* **placement**: a sandbox's pod (pod mode, or a direct ``Sandbox``) prefers the node
  the planner names (a preferred node affinity by node name): one that holds or is
  pulling its image and has the fewest of this run's sandboxes; when none has it, the
  node with the fewest bytes still to pull, whose bandwidth that pod's own pull then
  counts against (no prepull pod: the pod pulls it itself). A warm pool's pods are
  made by the controller from a shared template, so they are left to the scheduler
  (whose ImageLocality score still helps).

Planning never fails a create: a node list the API server refuses stops planning with
one warning (``stopped_by``), and the cluster works as without it. An image known to be
larger than every node's disk is an ``ImageError`` at create, not a pod that waits.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import math
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rollbox.errors import ImageError
from rollbox.placement import NodeImages, PlacementPlanner, Prepull

from rollbox_kubernetes import render
from rollbox_kubernetes.client import ApiError, Obj
from rollbox_kubernetes.quantities import quantity
from rollbox_kubernetes.resources import NODES, PODS
from rollbox_kubernetes.status import IMAGE_REASONS
from rollbox_kubernetes.watcher import Watcher

if TYPE_CHECKING:
    from rollbox_kubernetes.backend import KubernetesBackend

log = logging.getLogger(__name__)

GB = 1_000_000_000


@dataclass(frozen=True)
class PlanningOptions:
    """How the backend plans images (the ``image_*`` and ``prepull*`` backend options)."""

    image_sizes: Mapping[str, int] = field(default_factory=dict)
    """Bytes per image; others are learned from ``status.images`` once a node holds
    them, else ``default_image_bytes``."""
    default_image_bytes: int = 2 * GB
    image_disk_bytes: int | None = None
    """Each node's image disk; None: its ``status.capacity["ephemeral-storage"]``."""
    window: int = 64
    """Upcoming images planned at once (the planner's lead)."""
    pulls_per_node: int = 2
    refresh_s: float = 5.0
    prepull_timeout_s: float = 900.0

    def __post_init__(self) -> None:
        if (self.default_image_bytes <= 0 or self.window < 1 or self.pulls_per_node < 1
                or self.refresh_s < 0 or self.prepull_timeout_s <= 0
                or (self.image_disk_bytes is not None and self.image_disk_bytes <= 0)
                or any(size <= 0 for size in self.image_sizes.values())):
            raise ValueError("image planning needs positive image sizes, disk, timeout, a "
                             "window and pulls_per_node >= 1, refresh_s >= 0")


@dataclass
class NodeView:
    """What the planner knows of one node."""

    name: str
    capacity: int
    present: dict[str, int] = field(default_factory=dict)
    pulling: dict[str, int] = field(default_factory=dict)
    """This run's pulls in flight: its prepulls, and the pulls of sandboxes placed where
    their image was not (until the sandbox is ready)."""
    pulled: dict[str, int] = field(default_factory=dict)
    """Images this run's prepulls brought that ``status.images`` does not show yet (the
    kubelet writes it a moment later)."""
    placed: int = 0
    """Open sandboxes of this run placed here."""


class Hydration:
    """Prepulls and placement for one ``KubernetesBackend`` (see the module docstring)."""

    def __init__(self, backend: KubernetesBackend, options: PlanningOptions) -> None:
        self.backend = backend
        self.options = options
        self.planner = PlacementPlanner(window=options.window,
                                        max_in_flight=options.pulls_per_node)
        self.nodes: dict[str, NodeView] = {}
        self.sizes = {normal(image): size for image, size in options.image_sizes.items()}
        self.counts: collections.Counter[str] = collections.Counter()
        """prepulls, prepulled, prepull_failures, prepull_bytes, placed (on a node holding
        or pulling the image), placement_misses (on one that was not)."""
        self.stopped_by = ""
        """Why planning stopped (the API server refused the node list), or ''."""
        self._upcoming: list[str] = []
        self._spelled: dict[str, str] = {}  # normal name -> as the run's specs spell it
        self._failed: set[str] = set()  # images a prepull could not have: not again
        self._in_use: collections.Counter[str] = collections.Counter()
        self._placed: dict[str, tuple[str, str]] = {}  # sandbox id -> (node, image)
        self._demand: dict[str, str] = {}  # sandbox id -> image its pod pulls
        self._refreshed_at = -math.inf
        self._refreshing: asyncio.Lock | None = None
        self._planner_task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._prepulls: dict[str, Prepulling] = {}  # image -> its prepull (until unpinned)
        self._awaited: collections.Counter[str] = collections.Counter()
        """Images creates ahead of need wait for: planned before anything else."""
        self._progress: asyncio.Event | None = None  # set when a pull ends
        self._closed = False

    # -- what the backend calls ---------------------------------------------------------

    def hint(self, images: Sequence[str]) -> None:
        """The images wanted next, soonest first: plan their prepulls in the background."""
        upcoming = list(dict.fromkeys(self._normal(image) for image in images))
        if self.stopped_by or upcoming == self._upcoming:
            return
        self._upcoming = upcoming
        wanted = {*upcoming, *self._awaited, *self._in_use}
        self._unpin([image for image in self._prepulls if image not in wanted])
        self._kick()

    async def place(self, sandbox_id: str, image: str) -> str | None:
        """The node a new sandbox of ``image`` should prefer, or None (no plan); the
        sandbox counts on that node until ``released``. Raises ImageError for an image
        known to be larger than every node's disk."""
        if self.stopped_by:
            return None
        try:
            await self._refresh(stale_after_s=self.options.refresh_s)
        except Exception as exc:  # a create goes on without a plan, not down with it
            log.warning("image planning: reading nodes failed: %s", exc)
        if not self.nodes:
            return None
        image = self._normal(image)
        self._too_large(image)
        name = self.planner.place(image, self._views())
        node = self.nodes.get(name or "")
        if node is None:
            return None
        if image in node.present or image in node.pulling:
            self.counts["placed"] += 1
        else:  # its pod pulls: the next placements must see that node's bandwidth taken
            self.counts["placement_misses"] += 1
            node.pulling[image] = self.size_of(image)
            self._demand[sandbox_id] = image
        node.placed += 1
        self._placed[sandbox_id] = (node.name, image)
        self._in_use[image] += 1
        return node.name

    async def hydrated(self, image: str) -> None:
        """For a sandbox made ahead of need (a warm one): wait until a node holds
        ``image``, prepulled there first, so that the sandbox starts where its image
        already is and its own pod pulls nothing. Returns at once when planning is off
        or stopped, and gives up (the pod then pulls it itself) when the image cannot
        be prepulled: it failed before, or no node has room and no pull in flight could
        make any."""
        if self.stopped_by or self._closed:
            return
        with contextlib.suppress(Exception):  # without nodes, a plain create
            await self._refresh(stale_after_s=self.options.refresh_s)
        image = self._normal(image)
        self._awaited[image] += 1
        try:
            while not (self._closed or image in self._failed
                       or any(image in n.present for n in self.nodes.values())):
                if image not in self._prepulls:
                    self._plan_now()
                prepull = self._prepulls.get(image)
                if prepull is not None and not prepull.pulled.done():
                    await asyncio.shield(prepull.pulled)
                elif prepull is None and (
                        any(image in n.pulling for n in self.nodes.values())
                        or any(not p.pulled.done() for p in self._prepulls.values())):
                    await self._next_progress()  # a sandbox's pull, or room to come
                else:
                    return  # nothing in flight could change it (or its node is gone)
        finally:
            self._awaited[image] -= 1
            if self._awaited[image] <= 0:
                del self._awaited[image]

    async def _next_progress(self) -> None:
        if self._progress is None:
            self._progress = asyncio.Event()
        self._progress.clear()
        await self._progress.wait()

    def _progressed(self) -> None:
        """A pull ended (a prepull's, or a sandbox's own): waiters look again, the
        planner plans again."""
        if self._progress is not None:
            self._progress.set()
        self._kick()

    def ready(self, sandbox_id: str) -> None:
        """Sandbox ``sandbox_id`` is running: a pull its pod made is done, and its image
        is held by its own container now."""
        if sandbox_id not in self._placed:
            return  # not placed by the plan (a warm pool's claim)
        name, image = self._placed[sandbox_id]
        self._unpin([image])
        node = self.nodes.get(name)
        if self._demand.pop(sandbox_id, None) is not None and node is not None:
            node.pulling.pop(image, None)
            node.pulled[image] = node.present[image] = self.size_of(image)
            self._progressed()

    def released(self, sandbox_id: str) -> None:
        """Sandbox ``sandbox_id`` (placed by ``place``) is gone, or never came."""
        if sandbox_id not in self._placed:
            return
        name, image = self._placed.pop(sandbox_id)
        node = self.nodes.get(name)
        if node is not None:
            node.placed = max(0, node.placed - 1)
            if self._demand.pop(sandbox_id, None) is not None:
                node.pulling.pop(image, None)  # its pull failed, or it never started
        self._in_use[image] -= 1
        if self._in_use[image] <= 0:
            del self._in_use[image]
        self._progressed()  # its image may now make room for another

    def size_of(self, image: str) -> int:
        return self.sizes.get(normal(image), self.options.default_image_bytes)

    def _normal(self, image: str) -> str:
        """``normal(image)``, remembering how the run spells it (what its pods name)."""
        name = normal(image)
        self._spelled.setdefault(name, image)
        return name

    async def aclose(self) -> None:
        """Stop planning; prepulls in flight are cancelled and their pods deleted."""
        self._closed = True
        if self._progress is not None:
            self._progress.set()  # waiters see it closed
        tasks = [t for t in (self._planner_task, *(p.task for p in self._prepulls.values()))
                 if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._planner_task = None

    # -- planning -----------------------------------------------------------------------

    def _kick(self) -> None:
        if self.stopped_by or self._closed:
            return
        if self._wake is None:
            self._wake = asyncio.Event()
        self._wake.set()
        if self._planner_task is None or self._planner_task.done():
            self._planner_task = asyncio.ensure_future(self._plan_forever())

    async def _plan_forever(self) -> None:
        assert self._wake is not None
        while not self.stopped_by:
            await self._wake.wait()
            self._wake.clear()
            try:
                await self._refresh(stale_after_s=self.options.refresh_s)
            except Exception as exc:  # planning must never take a run down
                log.warning("image planning: reading nodes failed: %s", exc)
                continue
            self._plan_now()

    def _plan_now(self) -> None:
        """Start the prepulls the planner wants now: for the images creates wait for,
        then the upcoming ones."""
        wanted = [image for image in dict.fromkeys([*self._awaited, *self._upcoming])
                  if image not in self._failed]
        self._start(self.planner.prepulls([(i, self.size_of(i)) for i in wanted],
                                          self._views()))

    def _views(self) -> list[NodeImages]:
        slots = max((n.placed for n in self.nodes.values()), default=0) + 1
        return [NodeImages(n.name, n.capacity, present=dict(n.present),
                           pulling=dict(n.pulling), in_use=set(self._in_use),
                           free_slots=slots - n.placed) for n in self.nodes.values()]

    def _too_large(self, image: str) -> None:
        if image not in self.sizes:
            return  # not known yet: a first pull that cannot fit fails at the kubelet
        size = self.sizes[image]
        room = max(n.capacity for n in self.nodes.values()) * self.planner.gc_high
        if size > room:
            raise ImageError(
                f"image {image!r} ({size / GB:.1f} GB) is larger than any node's image "
                f"disk can hold ({room / GB:.1f} GB under the kubelet's GC threshold); use "
                "nodes with larger disks (or set image_disk_bytes if that is wrong) or a "
                "smaller image")

    # -- nodes --------------------------------------------------------------------------

    async def _refresh(self, *, stale_after_s: float) -> None:
        """Read the nodes again if the last read is older than ``stale_after_s``."""
        if self._refreshing is None:
            self._refreshing = asyncio.Lock()
        async with self._refreshing:
            loop = asyncio.get_running_loop()
            if loop.time() - self._refreshed_at < stale_after_s or self.stopped_by:
                return
            selector = ",".join(f"{k}={v}" for k, v in
                                self.backend.options.node_selector.items())
            try:
                client = await self.backend.connect()
                listed = await client.list_objects(NODES, None, label_selector=selector)
            except ApiError as err:
                if err.status in (401, 403, 404):
                    self.stopped_by = f"cannot list nodes: {err.message}"
                    log.warning("image planning is off: %s; apply the ClusterRole from "
                                "`rollbox k8s render --image-planning`", self.stopped_by)
                    return
                raise
            self._refreshed_at = loop.time()
            seen: dict[str, NodeView] = {}
            for obj in listed.get("items") or []:
                view = self._view_of(obj)
                if view is not None:
                    seen[view.name] = view
            self.nodes = seen

    def _view_of(self, node: Obj) -> NodeView | None:
        """``node`` as the planner sees it, or None if no sandbox should go there."""
        name = node["metadata"]["name"]
        spec, status = node.get("spec") or {}, node.get("status") or {}
        ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                    for c in status.get("conditions") or [])
        if not ready or spec.get("unschedulable"):
            return None
        capacity = self.options.image_disk_bytes or quantity_bytes(
            str((status.get("capacity") or {}).get("ephemeral-storage", "0")))
        if capacity <= 0:
            return None
        view = NodeView(name, capacity)
        old = self.nodes.get(name)
        if old is not None:  # the same dicts the prepulls in flight update
            view.placed, view.pulling, view.pulled = old.placed, old.pulling, old.pulled
        for entry in status.get("images") or []:
            size = int(entry.get("sizeBytes") or 0)
            for image in {normal(n) for n in entry.get("names") or []}:
                view.present[image] = size
                if size > 0:
                    self.sizes.setdefault(image, size)
        for image in [i for i in view.pulled if i in view.present]:
            del view.pulled[image]
        view.present.update(view.pulled)
        return view

    # -- prepulls -----------------------------------------------------------------------

    def _start(self, plans: Sequence[Prepull]) -> None:
        for plan in plans:
            image, size = plan.image, plan.size
            view = self.nodes.get(plan.node)
            if view is None:
                continue
            view.pulling[image] = size
            self.counts["prepulls"] += 1
            self.counts["prepull_bytes"] += size
            prepull = Prepulling(asyncio.get_running_loop().create_future(), asyncio.Event())
            prepull.task = asyncio.ensure_future(self._prepull(view, image, size, prepull))
            prepull.task.add_done_callback(functools.partial(self._forget, image))
            self._prepulls[image] = prepull

    def _forget(self, image: str, _: object) -> None:
        self._prepulls.pop(image, None)

    def _unpin(self, images: Sequence[str]) -> None:
        """Let the prepull pods of ``images`` go (their image is used by a sandbox now,
        or no longer wanted)."""
        for image in images:
            prepull = self._prepulls.get(image)
            if prepull is not None:
                prepull.unpin.set()

    async def _prepull(self, node: NodeView, image: str, size: int,
                       state: Prepulling) -> None:
        """One prepull pod: made, watched until its image is on the node (or cannot
        be), then kept until ``state.unpin``, deleted. Kept, its container holds the
        image in use: the kubelet's GC, which takes the least recently used image
        first, would otherwise take an image pulled ahead of need before its sandbox
        came (it is older than the images of tasks that just ran)."""
        backend = self.backend
        ns = backend.options.namespace
        name = f"{backend.options.run_id}-pp-{secrets.token_hex(4)}"
        try:
            async with asyncio.timeout(self.options.prepull_timeout_s):
                body = render.prepull_pod(name, self._spelled.get(image, image), node.name,
                                          backend.options)
                created = await backend.client.create(PODS, ns, body)
                problem = await self._until_pulled(name, created)
            if problem:
                raise PrepullFailed(problem)
            node.pulled[image] = size
            current = self.nodes.get(node.name, node)
            current.present[image] = size
            self.counts["prepulled"] += 1
            node.pulling.pop(image, None)
            state.pulled.set_result(None)
            self._progressed()
            await state.unpin.wait()
        except Exception as exc:  # one failed prepull is counted, never the run's end
            self.counts["prepull_failures"] += 1
            self._failed.add(image)
            log.warning("prepull of %s on node %s failed: %s", image, node.name, exc)
        finally:
            node.pulling.pop(image, None)
            if not state.pulled.done():
                state.pulled.set_result(None)
            # Even when the create's answer never came (cancelled): it may have been made.
            with contextlib.suppress(Exception):
                await asyncio.shield(backend.client.delete(PODS, ns, name))
            self._progressed()

    async def _until_pulled(self, name: str, pod: Obj) -> str:
        """Watch prepull pod ``name`` until its image is on its node (''), or why not."""
        watcher = Watcher(self.backend.client, PODS, self.backend.options.namespace, name,
                          pod["metadata"]["resourceVersion"])
        try:
            while True:
                verdict = pulled(pod)
                if verdict is not None:
                    return verdict
                event = await watcher.next(None)
                if event is None:
                    continue
                kind, pod = event
                if kind == "DELETED":
                    return "its pod was deleted (node lost?)"
        finally:
            await watcher.close()


@dataclass
class Prepulling:
    """One prepull: ``pulled`` resolves once its image is on the node (or cannot be);
    ``unpin`` lets its pod go."""

    pulled: asyncio.Future[None]
    unpin: asyncio.Event
    task: asyncio.Task[None] | None = None


class PrepullFailed(Exception):
    """A prepull pod says its image cannot be had on its node."""


def pulled(pod: Obj) -> str | None:
    """'' once ``pod``'s image is on its node (its container started, ended or failed to
    start), the reason it cannot be, or None while it is still pulling."""
    status = pod.get("status") or {}
    for cs in status.get("containerStatuses") or []:
        state = cs.get("state") or {}
        if "running" in state or "terminated" in state:
            return ""
        waiting = state.get("waiting") or {}
        if waiting.get("reason") in IMAGE_REASONS:
            return f"{waiting['reason']}: {waiting.get('message', '')}".strip(": ")
    if status.get("phase") in ("Running", "Succeeded", "Failed"):
        return ""
    return None


def normal(image: str) -> str:
    """An image reference as a node's ``status.images`` names it: Docker Hub's implied
    registry and ``library/`` spelled out, ``:latest`` when no tag or digest is given."""
    name = image
    last = name.rsplit("/", 1)[-1]
    if "@" not in name and ":" not in last:
        name += ":latest"
    first = name.split("/", 1)[0]
    if "/" not in name or not ("." in first or ":" in first or first == "localhost"):
        name = f"docker.io/{name}"
    parts = name.split("/")
    if parts[0] == "docker.io" and len(parts) == 2:
        name = f"docker.io/library/{parts[1]}"
    return name


def quantity_bytes(text: str) -> int:
    """A node's quantity (``100Gi``, ``20G``, ``1e9``) in whole bytes; 0 if it is none."""
    try:
        return int(quantity(text))
    except ValueError:
        return 0
