"""A node's image filesystem, modelled as a kubelet manages it.

Shared by the simulator (``rollbox-sim``, in virtual time) and the Kubernetes test
cluster's node agent (real time, scaled), so that both pull, fill and collect the same
way, and by what ``rollbox.placement`` reads of a node (``NodeImages``):

* **pulls** take ``size / share`` seconds, where ``share`` is the node's bandwidth
  divided among ``parallel_pulls`` pullers (1: ``serializeImagePulls``, the kubelet's
  default); queued pulls wait their turn and take no disk yet;
* **garbage collection** past ``gc_high`` of the capacity deletes images no running
  container uses, least recently used first (images a planner reserved last), down to
  ``gc_low``; while in-use images alone fill the disk, a pull waits for a release;
* an image larger than ``gc_high`` of the capacity can never be pulled here: an
  ``ImageError`` at once, never a wait.

``time_scale`` multiplies every wait (0.01: a modelled second lasts 10 ms), so a test
cluster can pull gigabytes in CI time; sizes and rates stay in modelled units.
"""

from __future__ import annotations

import asyncio
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from rollbox.errors import ImageError
from rollbox.placement import NodeImages

DISK_WAIT_S = 1.0
"""How often a pull that finds only in-use images looks again (modelled seconds)."""


@dataclass
class Pull:
    """One image on its way to a node."""

    image: str
    size: int
    done: asyncio.Future[None]
    ahead: bool
    """A prepull: nobody waits for it yet."""
    started: bool = False
    """Its bytes are arriving (queued pulls take no disk yet)."""


@dataclass
class ImageDisk:
    """One node's images: present, pulling, in use (see the module docstring)."""

    name: str
    capacity: int
    pull_bytes_per_s: float
    parallel_pulls: int = 1
    gc_high: float = 0.85
    gc_low: float = 0.80
    time_scale: float = 1.0
    images: OrderedDict[str, int] = field(default_factory=OrderedDict)
    """Present images → size, least recently used first."""
    in_use: Counter[str] = field(default_factory=Counter)
    reserved: set[str] = field(default_factory=set)
    """Prepulled images a planner wants kept until they are used."""
    pulls: dict[str, Pull] = field(default_factory=dict)
    stats: Counter[str] = field(default_factory=Counter)
    """pulls, prepulls, critical_path_pulls, late_prepulls, bytes_pulled, evictions,
    disk_waits."""
    on_change: Callable[[], None] = lambda: None
    """Called when an image arrives or leaves."""
    _queue: asyncio.Queue[Pull] | None = field(default=None, repr=False)
    _workers: list[asyncio.Task[None]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if (self.capacity <= 0 or self.pull_bytes_per_s <= 0 or self.parallel_pulls < 1
                or not 0 < self.gc_low <= self.gc_high <= 1 or self.time_scale <= 0):
            raise ValueError(
                f"image disk {self.name}: needs capacity > 0, pull_bytes_per_s > 0, "
                "parallel_pulls >= 1, 0 < gc_low <= gc_high <= 1 and time_scale > 0")

    @property
    def used(self) -> int:
        """Bytes on the disk: images, and the pulls under way."""
        return sum(self.images.values()) + sum(p.size for p in self.pulls.values() if p.started)

    def fits(self, size: int) -> bool:
        """Whether an image of ``size`` bytes can ever be pulled here."""
        return size <= self.capacity * self.gc_high

    def view(self, free_slots: int = 1) -> NodeImages:
        """What ``Node.status`` and the kubelet say of these images."""
        return NodeImages(self.name, capacity=self.capacity, present=dict(self.images),
                          pulling={p.image: p.size for p in self.pulls.values()},
                          in_use=set(self.in_use), free_slots=free_slots)

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        self._queue = asyncio.Queue()
        self._workers = [asyncio.ensure_future(self._puller())
                         for _ in range(self.parallel_pulls)]

    def stop(self) -> None:
        for worker in self._workers:
            worker.cancel()
        self._workers = []

    # -- images --------------------------------------------------------------------------

    async def image(self, image: str, size: int, *, ahead: bool = False) -> bool:
        """Have ``image`` here; True if it had to be pulled (and, not ``ahead``, someone
        waited for it: a pull on the critical path). Raises ImageError when it can never
        fit this disk."""
        if self.touch(image):
            return False
        await asyncio.shield(self.enqueue(image, size, ahead=ahead).done)
        return True

    def touch(self, image: str) -> bool:
        """Whether ``image`` is here; if it is, it is now the most recently used."""
        if image not in self.images:
            return False
        self.images.move_to_end(image)
        return True

    def enqueue(self, image: str, size: int, *, ahead: bool) -> Pull:
        """The pull of ``image`` here, queued now if it is not already (not waiting)."""
        pull = self.pulls.get(image)
        if pull is None:
            if not self.fits(size):
                raise ImageError(f"image {image} ({size / 1e9:.1f} GB) is larger than "
                                 f"node {self.name}'s image disk can hold "
                                 f"({self.capacity * self.gc_high / 1e9:.1f} GB under its "
                                 "GC threshold)")
            if self._queue is None:
                raise RuntimeError(f"image disk {self.name} is not started")
            pull = Pull(image, size, asyncio.get_running_loop().create_future(), ahead)
            self.pulls[image] = pull
            self._queue.put_nowait(pull)
        elif not ahead and pull.ahead:
            pull.ahead = False
            self.stats["late_prepulls"] += 1  # the prepull had not finished in time
        return pull

    def hold(self, image: str) -> None:
        """A container of ``image`` runs: GC keeps it."""
        self.in_use[image] += 1

    def release(self, image: str) -> None:
        """A container of ``image`` ended; the last one frees it for GC."""
        self.in_use[image] -= 1
        if self.in_use[image] <= 0:
            del self.in_use[image]
            self.reserved.discard(image)

    async def _puller(self) -> None:
        assert self._queue is not None
        share = self.pull_bytes_per_s / self.parallel_pulls
        while True:
            pull = await self._queue.get()
            await self._make_room(pull.size)
            pull.started = True
            await asyncio.sleep(pull.size / share * self.time_scale)
            del self.pulls[pull.image]
            self.images[pull.image] = pull.size
            self.stats["pulls"] += 1
            self.stats["prepulls" if pull.ahead else "critical_path_pulls"] += 1
            self.stats["bytes_pulled"] += pull.size
            if not pull.done.done():
                pull.done.set_result(None)
            self.on_change()

    async def _make_room(self, size: int) -> None:
        """Image GC as the kubelet's (see the module docstring)."""
        high, low = self.capacity * self.gc_high, self.capacity * self.gc_low
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
            await asyncio.sleep(DISK_WAIT_S * self.time_scale)
