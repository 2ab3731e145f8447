"""Image pulls on the test cluster's nodes, as a kubelet does them (used by nodeagent.py).

The node agent backs every pod with a local sandbox, which has its files at once: no
test had ever seen a pull. With an image manifest, each node gets an image filesystem
(``rollbox.imagedisk.ImageDisk``: a capacity, a pull bandwidth shared by its pullers,
garbage collection at the kubelet's thresholds that never removes an image in use, the
same model the simulator runs), and a pod of a manifest's image waits for its pull:

* its container is ``waiting`` in ``ContainerCreating`` meanwhile, with the events
  ``Pulling`` and then ``Pulled`` ("in N s", modelled seconds) on the pod, as a
  kubelet writes them; a pod whose image is already there gets ``Pulled`` with
  "already present on machine";
* an image no node's disk can hold is ``ErrImagePull`` at once, with a ``Failed``
  event saying so (no pod waits forever);
* ``Node.status.images`` lists what each node holds (largest first, at most 50, as
  ``--node-status-max-images``): what the scheduler's ImageLocality and rollbox's
  planner read.

The manifest is JSON, ``{"IMAGE": BYTES}`` or ``{"IMAGE": {"bytes": N, "runs_as":
"host"}}`` (``runs_as``: the backing image the pod's sandbox is made from; default the
image itself). It is read again whenever it changes, so a benchmark can write its
corpus's sizes into a running cluster. Images it does not name are not modelled: there
at once, as before. ``time_scale`` shortens every wait (printed with every result;
results are in modelled seconds).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rollbox.errors import ImageError
from rollbox.imagedisk import ImageDisk

from rollbox_kubernetes.client import ApiError, KubeClient

Obj = dict[str, Any]
log = logging.getLogger("rollbox.nodeagent.pulls")

GB = 1_000_000_000
MB = 1_000_000
MAX_IMAGES_REPORTED = 50
REPORT_DELAY_S = 0.05
"""Node status is written this long after its images change (one write for a burst)."""


@dataclass(frozen=True)
class ImageModel:
    """The nodes' image filesystems: see the module docstring."""

    manifest: Path
    capacity: int = 100 * GB
    pull_bytes_per_s: float = 200 * MB
    parallel_pulls: int = 1
    time_scale: float = 1.0


@dataclass(frozen=True)
class Sized:
    bytes: int
    runs_as: str


@dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str
    uid: str
    node: str


Waiting = Callable[[str, str], Awaitable[None]]
"""Writes the pod's container as waiting, with (reason, message)."""


class Manifest:
    """The manifest file, read again when its modification time changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: int | None = None
        self._images: dict[str, Sized] = {}

    def get(self, image: str) -> Sized | None:
        try:
            stamp = os.stat(self.path).st_mtime_ns
        except FileNotFoundError:
            self._stamp, self._images = None, {}
            return None
        if stamp != self._stamp:
            self._images = self._read()
            self._stamp = stamp
        return self._images.get(image)

    def _read(self) -> dict[str, Sized]:
        try:
            raw = json.loads(self.path.read_text())
        except (OSError, ValueError) as exc:
            log.warning("image manifest %s: %s; images are not modelled", self.path, exc)
            return {}
        images: dict[str, Sized] = {}
        for name, entry in (raw.items() if isinstance(raw, dict) else ()):
            if isinstance(entry, int):
                images[name] = Sized(entry, name)
            elif isinstance(entry, dict) and isinstance(entry.get("bytes"), int):
                images[name] = Sized(entry["bytes"], str(entry.get("runs_as") or name))
        return images


class ImagePulls:
    """Each node's image filesystem, its pulls, events and ``status.images``."""

    def __init__(self, client: KubeClient, nodes: Sequence[str], model: ImageModel) -> None:
        self.client = client
        self.model = model
        self.manifest = Manifest(model.manifest)
        self.disks = {node: ImageDisk(node, capacity=model.capacity,
                                      pull_bytes_per_s=model.pull_bytes_per_s,
                                      parallel_pulls=model.parallel_pulls,
                                      time_scale=model.time_scale) for node in nodes}
        self._reports: dict[str, asyncio.Task[None]] = {}
        for node, disk in self.disks.items():
            disk.on_change = functools.partial(self._changed, node)

    def start(self) -> None:
        for disk in self.disks.values():
            disk.start()

    async def aclose(self) -> None:
        for disk in self.disks.values():
            disk.stop()
        for task in self._reports.values():
            task.cancel()
        await asyncio.gather(*self._reports.values(), return_exceptions=True)

    def runs_as(self, image: str) -> str:
        """The backing image a pod of ``image`` is made from."""
        sized = self.manifest.get(image)
        return sized.runs_as if sized is not None else image

    async def pull(self, pod: PodRef, image: str, waiting: Waiting) -> bool:
        """Have ``image`` on the pod's node for it (held until ``release``); False when
        it cannot be had (the pod is then in ``ErrImagePull``)."""
        sized, disk = self.manifest.get(image), self.disks.get(pod.node)
        if sized is None or disk is None:
            return True
        disk.hold(image)  # from now on GC keeps it, once it is there
        if disk.touch(image):
            await self._event(pod, "Pulled", f'Container image "{image}" already present '
                                             "on machine")
            return True
        await waiting("ContainerCreating", "")
        await self._event(pod, "Pulling", f'Pulling image "{image}"')
        loop = asyncio.get_running_loop()
        began = loop.time()
        try:
            await disk.image(image, sized.bytes)
        except ImageError as exc:
            disk.release(image)
            await self._event(pod, "Failed", f'Failed to pull image "{image}": {exc.message}',
                              warning=True)
            await waiting("ErrImagePull", exc.message)
            return False
        took = (loop.time() - began) / self.model.time_scale
        await self._event(pod, "Pulled", f'Successfully pulled image "{image}" in '
                                         f"{took:.3f}s. Image size: {sized.bytes} bytes.")
        return True

    def release(self, node: str, image: str) -> None:
        """A container of ``image`` on ``node`` is gone (after a ``pull`` that held it)."""
        disk = self.disks.get(node)
        if disk is not None and disk.in_use[image]:
            disk.release(image)

    # -- what the node says --------------------------------------------------------------

    def _changed(self, node: str) -> None:
        if node not in self._reports:
            self._reports[node] = asyncio.ensure_future(self._report(node))

    async def _report(self, node: str) -> None:
        """Write ``status.images`` (after REPORT_DELAY_S: one write for a burst)."""
        try:
            await asyncio.sleep(REPORT_DELAY_S)
        finally:
            self._reports.pop(node, None)
        disk = self.disks[node]
        largest = sorted(disk.images.items(), key=lambda kv: -kv[1])[:MAX_IMAGES_REPORTED]
        body = {"status": {"images": [{"names": [name], "sizeBytes": size}
                                      for name, size in largest]}}
        try:
            await self.client.call("patch", "PATCH", f"/api/v1/nodes/{node}/status",
                                   body=body, idempotent=True,
                                   content_type="application/merge-patch+json")
        except ApiError as err:
            log.warning("images of node %s: %s", node, err)

    async def _event(self, pod: PodRef, reason: str, message: str, *,
                     warning: bool = False) -> None:
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {"apiVersion": "v1", "kind": "Event",
                "metadata": {"generateName": f"{pod.name}.", "namespace": pod.namespace},
                "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": pod.name,
                                   "namespace": pod.namespace, "uid": pod.uid},
                "reason": reason, "message": message,
                "type": "Warning" if warning else "Normal",
                "source": {"component": "kubelet", "host": pod.node},
                "reportingComponent": "kubelet", "reportingInstance": pod.node,
                "firstTimestamp": now, "lastTimestamp": now, "count": 1}
        with contextlib.suppress(ApiError):
            await self.client.call("create", "POST",
                                   f"/api/v1/namespaces/{pod.namespace}/events",
                                   body=body, idempotent=False)
