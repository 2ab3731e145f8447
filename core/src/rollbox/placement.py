"""Where a cluster's images go: prepulls ahead of need, and a node per sandbox.

Pure planning, no I/O: a backend (or the simulator) describes its nodes as
``NodeImages`` and its upcoming images, soonest first; the planner answers which images
to pull onto which nodes now, and where to run a sandbox of an image.

The rules (docs/simulate.md tells their effect):

* **never past a node's disk**: a prepull goes where the image fits under the GC high
  threshold, counting what is pulling and not counting what GC may delete (images not
  in use and not planned);
* **spread**: an image goes to the node with the fewest bytes still to pull, then the
  most room for what is still to come (free disk, then free sandbox slots), so that no
  node's bandwidth becomes the tail;
* **one step of lead**: only the first ``window`` upcoming images are planned, at most
  ``max_in_flight`` pulls per node at once;
* **placement follows the image**: a sandbox runs on a node that holds (or is pulling)
  its image and has a free slot, the one with the most free slots; only when none has
  room, where a pull is soonest done (the fewest bytes still to pull).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class NodeImages:
    """What a node says of itself: disk ``capacity`` (bytes), present images and their
    sizes, images pulling, images in use by a running sandbox, free sandbox slots."""

    name: str
    capacity: int
    present: dict[str, int] = field(default_factory=dict)
    pulling: dict[str, int] = field(default_factory=dict)
    in_use: set[str] = field(default_factory=set)
    free_slots: int = 1

    def has(self, image: str) -> bool:
        return image in self.present or image in self.pulling


@dataclass(frozen=True)
class Prepull:
    node: str
    image: str
    size: int


class PlacementPlanner:
    """Plans prepulls and placement over a set of nodes (see the module docstring)."""

    def __init__(self, *, window: int = 64, max_in_flight: int = 2,
                 gc_high: float = 0.85) -> None:
        if window < 0 or max_in_flight < 1 or not 0 < gc_high <= 1:
            raise ValueError("PlacementPlanner needs window >= 0, max_in_flight >= 1 "
                             "and 0 < gc_high <= 1")
        self.window = window
        self.max_in_flight = max_in_flight
        self.gc_high = gc_high

    def prepulls(self, upcoming: Sequence[tuple[str, int]],
                 nodes: Sequence[NodeImages]) -> list[Prepull]:
        """The pulls to start now for ``upcoming`` (image, size), soonest first: images
        no node has yet, each onto one node with room."""
        wanted = dict.fromkeys(image for image, _ in upcoming[:self.window])
        room = {n.name: self._room(n, wanted) for n in nodes}
        busy = {n.name: len(n.pulling) for n in nodes}
        queued = {n.name: sum(n.pulling.values()) for n in nodes}
        slots = {n.name: n.free_slots for n in nodes}
        held = {image for n in nodes for image in (*n.present, *n.pulling)}
        planned: list[Prepull] = []
        for image, size in upcoming[:self.window]:
            if image in held:
                continue
            fits = [n for n in nodes if room[n.name] >= size
                    and busy[n.name] < self.max_in_flight]
            if not fits:
                continue
            node = min(fits, key=lambda n: (queued[n.name], -room[n.name], -slots[n.name]))
            planned.append(Prepull(node.name, image, size))
            held.add(image)
            room[node.name] -= size
            busy[node.name] += 1
            queued[node.name] += size
            slots[node.name] -= 1
        return planned

    def place(self, image: str, nodes: Sequence[NodeImages]) -> str | None:
        """The node to run a sandbox of ``image`` on, or None when no node has a free
        slot."""
        free = [n for n in nodes if n.free_slots > 0]
        if not free:
            return None
        holding = [n for n in free if n.has(image)]
        if holding:
            return max(holding, key=lambda n: (image in n.present, n.free_slots)).name
        return min(free, key=lambda n: (sum(n.pulling.values()), -n.free_slots)).name

    def _room(self, node: NodeImages, wanted: dict[str, None]) -> int:
        """Bytes a prepull may still take on ``node``: below the GC high threshold, once
        GC has deleted what is neither in use nor wanted soon."""
        kept = sum(size for image, size in node.present.items()
                   if image in node.in_use or image in wanted)
        return int(node.capacity * self.gc_high) - kept - sum(node.pulling.values())
