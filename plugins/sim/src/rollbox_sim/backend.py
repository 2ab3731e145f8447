"""The ``sim`` backend: sandboxes that are pods of a simulated cluster (cluster.py).

A create is a paced, throttle-honouring API write (``client_qps``, ``Retry-After``), a
node chosen by the scheduler (or by the placement planner when it plans), the image
pulled there if it is not (the pull a rollout then waits for is *on the critical
path*), and the pod's start; a close is another write. A command ``sleep N`` takes N
seconds, any other only the exec round trip; reset is in place. Only in virtual time
(``rollbox_sim.clock``): a simulated hour would otherwise take an hour.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any

from rollbox.backend import Backend, ahead_of_need
from rollbox.errors import CreateFailedError, SandboxLostError
from rollbox.placement import PlacementPlanner
from rollbox.ratelimit import TokenBucket
from rollbox.sandbox import Capabilities, ExecRequest, ExecResult, Sandbox
from rollbox.spec import SandboxSpec

from rollbox_sim.cluster import Cluster, Node, Throttled
from rollbox_sim.model import ClusterModel

DEFAULT_IMAGE_BYTES = 2 * 10**9


class SimBackend(Backend):
    """Sandboxes on a ``Cluster``. ``image_sizes`` gives each image's size (others are
    2 GB); ``planner`` set, ``hint_upcoming`` prepulls and creates follow the images
    (the rollbox arm), else the default scheduler places pods and hints are ignored."""

    name = "sim"
    capabilities = Capabilities(reset_in_place=True, seal=True, network_none=True,
                                isolation=True)

    def __init__(self, model: ClusterModel | None = None, *,
                 image_sizes: Mapping[str, int] | None = None,
                 planner: PlacementPlanner | None = None, seed: int = 0) -> None:
        self.cluster = Cluster(model or ClusterModel(), seed=seed)
        self.model = self.cluster.model
        self.image_sizes = dict(image_sizes or {})
        self.planner = planner
        self.limiter = TokenBucket(self.model.client_qps, self.model.client_burst)
        self.rng = random.Random(f"rollbox-sim-backend:{seed}")
        self.live: dict[str, SimSandbox] = {}
        self._ids = itertools.count()
        self._background: set[asyncio.Task[None]] = set()
        self._started = False
        self._last_hint: tuple[str, ...] = ()
        self._awaited: dict[str, asyncio.Event] = {}  # images warm creates wait for
        self._replan: asyncio.Handle | None = None
        self.cluster.on_images_changed = self._images_changed
        self.placement_misses = 0
        self.slot_waits = 0
        """Creates that found no node with a free slot and waited for one."""
        """Creates the planner placed on a node that did not hold their image."""

    def size_of(self, image: str) -> int:
        return self.image_sizes.get(image, DEFAULT_IMAGE_BYTES)

    async def write(self, verb: str) -> None:
        """One API write, paced by the client's limiter; a 429 pauses every caller for
        its Retry-After and this one retries (as ``KubeClient`` does)."""
        while True:
            await self.limiter.acquire()
            try:
                self.cluster.api.write(verb)
                return
            except Throttled as throttled:
                self.limiter.throttled(throttled.retry_after_s)
                await asyncio.sleep(throttled.retry_after_s * (1 + self.rng.random()))

    async def create(self, spec: SandboxSpec) -> SimSandbox:
        self.check_spec(spec)
        self._start()
        if self.planner is not None and ahead_of_need():
            await self._hydrated(spec.image)  # pre-warm only where the image already is
        await self.write("create")
        node = await self._schedule(spec.image)
        node.running += 1
        node.hold(spec.image)
        sandbox = SimSandbox(self, f"sim-{next(self._ids)}", spec, node)
        try:
            await node.image(spec.image, self.size_of(spec.image), ahead=ahead_of_need())
            if self.rng.random() < self.model.create_fail_rate:
                raise CreateFailedError(f"pod of {sandbox.id} failed to start on {node.name}")
            await asyncio.sleep(self.model.start.draw(self.rng))
        except BaseException:
            await sandbox.release_node()
            raise
        self.live[sandbox.id] = sandbox
        return sandbox

    async def _schedule(self, image: str) -> Node:
        """A node with a free slot for a pod of ``image`` (waits while none has one)."""
        room = self.cluster.room
        while True:
            node = self._choose(image)
            if node is not None:
                return node
            self.slot_waits += 1
            async with room:
                await room.wait()

    def _choose(self, image: str) -> Node | None:
        if self.planner is None:
            return self.cluster.default_node(image)
        name = self.planner.place(image, [n.view() for n in self.cluster.nodes])
        node = next((n for n in self.cluster.nodes if n.name == name), None)
        if node is not None and image not in node.images and image not in node.pulls:
            self.placement_misses += 1
        return node

    def hint_upcoming(self, images: Sequence[str]) -> None:
        """Prepull what the planner says, each by a prepull pod (its create and delete
        are paced API writes)."""
        if self.planner is None or not images:
            return
        self._start()
        wanted = tuple(dict.fromkeys(images))
        if wanted == self._last_hint:
            return  # the same window again (the runner hints at every dispatch)
        self._last_hint = wanted
        self._plan()

    def _plan(self) -> None:
        """Start the prepulls the planner wants for the hinted images and those warm
        creates wait for; again whenever an image arrives or leaves a node."""
        assert self.planner is not None
        self._replan = None
        wanted = dict.fromkeys([*self._last_hint, *self._awaited])
        upcoming = [(image, self.size_of(image)) for image in wanted]
        nodes = {n.name: n for n in self.cluster.nodes}
        for plan in self.planner.prepulls(upcoming, [n.view() for n in nodes.values()]):
            node = nodes[plan.node]
            node.reserved.add(plan.image)
            node.enqueue(plan.image, plan.size, ahead=True)
            waiting = self._awaited.get(plan.image)
            if waiting is not None:
                waiting.set()
            for verb in ("prepull", "prepull-delete"):
                self._in_background(self.write(verb))

    def _images_changed(self) -> None:
        """An image arrived on a node or left one: plan again, once per loop turn."""
        if self.planner is not None and self._replan is None:
            self._replan = asyncio.get_running_loop().call_soon(self._plan)

    async def _hydrated(self, image: str) -> None:
        """Wait until some node holds ``image``, having it prepulled if no node is
        pulling it (a warm sandbox is started only where its image already is)."""
        while True:
            nodes = self.cluster.nodes
            if any(image in n.images for n in nodes):
                return
            pulling = [n.pulls[image].done for n in nodes if image in n.pulls]
            if not pulling:
                started = self._awaited.setdefault(image, asyncio.Event())
                self._plan()
                try:
                    await started.wait()  # the planner found it a node with room
                finally:
                    if self._awaited.get(image) is started:
                        del self._awaited[image]
                continue
            await asyncio.shield(pulling[0])

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _start(self) -> None:
        if not self._started:
            self._started = True
            self.cluster.start()

    async def aclose(self) -> None:
        for sandbox in list(self.live.values()):
            await sandbox.close()
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        self.cluster.stop()


class SimSandbox(Sandbox):
    """One pod of the simulated cluster."""

    def __init__(self, backend: SimBackend, sandbox_id: str, spec: SandboxSpec,
                 node: Node) -> None:
        super().__init__(sandbox_id, spec)
        self.backend = backend
        self.node = node
        self.lost = False
        self.closed = False
        self._released = False

    def _check(self) -> None:
        if self.closed or self.lost:
            raise SandboxLostError(f"sandbox {self.id} is {'closed' if self.closed else 'lost'}",
                                   sandbox_id=self.id)

    async def run(self, request: ExecRequest) -> ExecResult:
        self._check()
        backend, model = self.backend, self.backend.model
        seconds = model.exec_latency.draw(backend.rng)
        if len(request.argv) == 2 and request.argv[0] == "sleep":
            seconds += float(request.argv[1])
        if backend.rng.random() < model.loss_rate:
            await asyncio.sleep(seconds * backend.rng.random())
            self.lost = True
            raise SandboxLostError(f"pod of {self.id} on {self.node.name} was lost",
                                   sandbox_id=self.id)
        await asyncio.sleep(seconds)
        return ExecResult(0, duration_s=seconds)

    async def read_file(self, path: str) -> bytes:
        self._check()
        await asyncio.sleep(self.backend.model.exec_latency.draw(self.backend.rng))
        return b""

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        self._check()
        await asyncio.sleep(self.backend.model.exec_latency.draw(self.backend.rng))

    async def reset(self) -> None:
        self._check()
        await asyncio.sleep(self.backend.model.reset.draw(self.backend.rng))

    async def seal(self) -> None:
        self._check()
        await asyncio.sleep(self.backend.model.exec_latency.draw(self.backend.rng))

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.backend.live.pop(self.id, None)
        await self.release_node()
        await self.backend.write("delete")

    async def release_node(self) -> None:
        """Give the node its slot back and unpin the image (once)."""
        if self._released:
            return
        self._released = True
        self.node.running -= 1
        self.node.release(self.spec.image)
        room = self.backend.cluster.room
        async with room:
            room.notify_all()
