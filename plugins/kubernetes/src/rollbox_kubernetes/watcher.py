"""One object's watch, consumed with timeouts.

Cancelling ``anext`` on an async generator closes it, so a wait with a timeout cannot
sit directly on ``KubeClient.watch``; a task drains the watch into a queue instead.
"""

from __future__ import annotations

import asyncio
import contextlib

from rollbox_kubernetes.client import ApiError, KubeClient, Obj, WatchExpired
from rollbox_kubernetes.resources import Resource


class Watcher:
    """Events of object ``name`` after ``resource_version``; errors re-raised by ``next``."""

    def __init__(self, client: KubeClient, res: Resource, namespace: str, name: str,
                 resource_version: str) -> None:
        self._queue: asyncio.Queue[tuple[str, Obj] | BaseException] = asyncio.Queue()
        self._task = asyncio.ensure_future(
            self._drain(client, res, namespace, name, resource_version))

    async def _drain(self, client: KubeClient, res: Resource, namespace: str, name: str,
                     resource_version: str) -> None:
        rv = resource_version
        try:
            while True:
                try:
                    async for event in client.watch(res, namespace, resource_version=rv,
                                                    name=name):
                        self._queue.put_nowait(event)
                except WatchExpired:
                    # History compacted past ``rv``: read the object, go on from there.
                    obj = await client.get(res, namespace, name)
                    rv = obj["metadata"]["resourceVersion"]
                    self._queue.put_nowait(("MODIFIED", obj))
        except ApiError as err:
            if err.status == 404:
                self._queue.put_nowait(("DELETED", {"metadata": {"name": name}}))
            else:
                self._queue.put_nowait(err)
        except Exception as exc:
            self._queue.put_nowait(exc)

    async def next(self, wait_s: float | None) -> tuple[str, Obj] | None:
        """The next event, or None if none came within ``wait_s`` seconds."""
        try:
            item = await asyncio.wait_for(self._queue.get(), wait_s)
        except TimeoutError:
            return None
        if isinstance(item, BaseException):
            raise item
        return item

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
