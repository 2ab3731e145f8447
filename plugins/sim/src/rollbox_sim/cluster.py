"""The simulated cluster: an API server that admits writes at a rate, nodes whose image
filesystem fills, pulls and is garbage-collected like a kubelet's (``rollbox.imagedisk``),
and a scheduler.

Everything happens in the running loop's (virtual) time; nothing here sleeps for real.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from rollbox.imagedisk import ImageDisk
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
class Node(ImageDisk):
    """One node: sandbox slots and an image filesystem (``rollbox.imagedisk``, shared
    with the Kubernetes test cluster's node agent)."""

    slots: int = 1
    running: int = 0

    @classmethod
    def of(cls, name: str, model: ClusterModel) -> Node:
        return cls(name, capacity=model.disk_bytes, pull_bytes_per_s=model.pull_bytes_per_s,
                   parallel_pulls=model.parallel_pulls, gc_high=model.gc_high,
                   gc_low=model.gc_low, slots=model.slots_per_node)

    @property
    def free_slots(self) -> int:
        return self.slots - self.running

    def view(self, free_slots: int | None = None) -> NodeImages:
        return super().view(self.free_slots if free_slots is None else free_slots)


class Cluster:
    """Nodes, the API server, and the numbers a run reports."""

    def __init__(self, model: ClusterModel, *, seed: int = 0) -> None:
        self.model = model
        self.api = ApiServer(model)
        self.nodes = [Node.of(f"node-{i}", model) for i in range(model.nodes)]
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
