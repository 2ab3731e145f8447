"""The simulated cluster: an API server that admits writes at a rate, nodes whose image
filesystem fills, pulls and is garbage-collected like a kubelet's, and a scheduler.

Everything happens in the running loop's (virtual) time; nothing here sleeps for real.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from rollbox.errors import ImageError
from rollbox.placement import NodeImages

from rollbox_sim.model import ClusterModel


class Throttled(Exception):
    """The API server answered 429 Too Many Requests."""

    def __init__(self, retry_after_s: float) -> None:
        super().__init__(f"429, Retry-After {retry_after_s:g}")
        self.retry_after_s = retry_after_s


class ApiServer:
    """Admits ``qps`` writes per second with ``burst`` at once; the rest get 429."""

    def __init__(self, model: ClusterModel) -> None:
        self.model = model
        self._tokens = float(model.api_burst)
        self._stamp = 0.0
        self.writes: Counter[str] = Counter()
        self.throttled = 0

    def write(self, verb: str) -> None:
        """Admit one write of ``verb`` now, or raise Throttled."""
        now = asyncio.get_running_loop().time()
        self._tokens = min(float(self.model.api_burst),
                           self._tokens + (now - self._stamp) * self.model.api_qps)
        self._stamp = now
        if self._tokens < 1:
            self.throttled += 1
            raise Throttled(self.model.retry_after_s)
        self._tokens -= 1
        self.writes[verb] += 1


@dataclass
class _Pull:
    image: str
    size: int
    done: asyncio.Future[None]
    ahead: bool
    """A prepull (nobody waits for it yet)."""
    started: bool = False
    """Its bytes are arriving (queued pulls take no disk yet)."""


@dataclass
class Node:
    """One node: sandbox slots and an image filesystem."""

    name: str
    model: ClusterModel
    running: int = 0
    images: OrderedDict[str, int] = field(default_factory=OrderedDict)
    """Present images → size, least recently used first."""
    in_use: Counter[str] = field(default_factory=Counter)
    reserved: set[str] = field(default_factory=set)
    """Prepulled images the planner wants kept until they are used."""
    pulls: dict[str, _Pull] = field(default_factory=dict)
    queue: asyncio.Queue[_Pull] = field(default_factory=asyncio.Queue)
    workers: list[asyncio.Task[None]] = field(default_factory=list)
    stats: Counter[str] = field(default_factory=Counter)
    on_change: Callable[[], None] = lambda: None
    """Called when an image arrives or leaves (the cluster's version moves on)."""

    @property
    def used(self) -> int:
        """Bytes on the image disk: images, and the pulls under way."""
        return sum(self.images.values()) + sum(p.size for p in self.pulls.values() if p.started)

    @property
    def free_slots(self) -> int:
        return self.model.slots_per_node - self.running

    def view(self) -> NodeImages:
        """What ``Node.status`` and the kubelet say of this node's images."""
        return NodeImages(self.name, capacity=self.model.disk_bytes,
                          present=dict(self.images),
                          pulling={p.image: p.size for p in self.pulls.values()},
                          in_use=set(self.in_use), free_slots=self.free_slots)

    def start(self) -> None:
        for _ in range(self.model.parallel_pulls):
            self.workers.append(asyncio.ensure_future(self._puller()))

    def stop(self) -> None:
        for worker in self.workers:
            worker.cancel()

    async def image(self, image: str, size: int, *, ahead: bool = False) -> bool:
        """Have ``image`` here; True if it had to be pulled (and, not ``ahead``, someone
        waited for it: a pull on the critical path). Raises ImageError when it can never
        fit this node's disk."""
        if image in self.images:
            self.images.move_to_end(image)
            return False
        await asyncio.shield(self.enqueue(image, size, ahead=ahead).done)
        return True

    def enqueue(self, image: str, size: int, *, ahead: bool) -> _Pull:
        """The pull of ``image`` here, queued now if it is not already (not waiting)."""
        pull = self.pulls.get(image)
        if pull is None:
            if size > self.model.disk_bytes * self.model.gc_high:
                raise ImageError(f"image {image} ({size / 1e9:.1f} GB) is larger than "
                                 f"node {self.name}'s image disk can hold")
            pull = _Pull(image, size, asyncio.get_running_loop().create_future(), ahead)
            self.pulls[image] = pull
            self.queue.put_nowait(pull)
        elif not ahead and pull.ahead:
            pull.ahead = False
            self.stats["late_prepulls"] += 1  # the prepull had not finished in time
        return pull

    async def _puller(self) -> None:
        share = self.model.pull_bytes_per_s / self.model.parallel_pulls
        while True:
            pull = await self.queue.get()
            await self._make_room(pull.size)
            pull.started = True
            await asyncio.sleep(pull.size / share)
            del self.pulls[pull.image]
            self.images[pull.image] = pull.size
            self.stats["pulls"] += 1
            self.stats["prepulls" if pull.ahead else "critical_path_pulls"] += 1
            self.stats["bytes_pulled"] += pull.size
            pull.done.set_result(None)
            self.on_change()

    async def _make_room(self, size: int) -> None:
        """Image GC as the kubelet's: past the high threshold, delete unused images
        (least recently used first, reserved ones last) down to the low one; wait while
        in-use images fill the disk."""
        high = self.model.disk_bytes * self.model.gc_high
        low = self.model.disk_bytes * self.model.gc_low
        while self.used + size > high:
            victims = [i for i in self.images if not self.in_use[i]]
            victims.sort(key=lambda i: i in self.reserved)  # stable: LRU within each
            for victim in victims:
                if self.used + size <= low:
                    break
                del self.images[victim]
                self.reserved.discard(victim)
                self.stats["evictions"] += 1
                self.on_change()
            if self.used + size <= high:
                return
            self.stats["disk_waits"] += 1
            await asyncio.sleep(1.0)  # everything left is in use: wait for a release


class Cluster:
    """Nodes, the API server, and the numbers a run reports."""

    def __init__(self, model: ClusterModel, *, seed: int = 0) -> None:
        self.model = model
        self.api = ApiServer(model)
        self.nodes = [Node(f"node-{i}", model) for i in range(model.nodes)]
        self.rng = random.Random(f"rollbox-sim-cluster:{seed}")
        self._room: asyncio.Condition | None = None
        self.on_images_changed: Callable[[], None] = lambda: None
        """Called when an image arrives on a node or leaves one."""
        for node in self.nodes:
            node.on_change = self._changed

    def _changed(self) -> None:
        self.on_images_changed()

    def start(self) -> None:
        for node in self.nodes:
            node.start()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    @property
    def room(self) -> asyncio.Condition:
        if self._room is None:
            self._room = asyncio.Condition()
        return self._room

    def stats(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for node in self.nodes:
            total.update(node.stats)
        return total

    def default_node(self, image: str) -> Node | None:
        """kube-scheduler's choice with its default scores: least allocated first; among
        equals, one holding the image (ImageLocality weighs a 1-3 GB image on one node
        of ten about as much as a few free slots)."""
        fits = [n for n in self.nodes if n.free_slots > 0]
        if not fits:
            return None
        return max(fits, key=lambda n: (n.free_slots + (4 if image in n.images else 0),
                                        -int(n.name.split("-")[1])))
