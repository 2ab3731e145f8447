"""Which specs get a SandboxTemplate + SandboxWarmPool, and how many replicas each keeps.

Core's pool tells the backend each spec's warm target (``Backend.keep_warm``). Here:

- a target of at least ``min_replicas`` for a spec without a pool: this backend creates a
  template and a warm pool for it (``replicas`` = the target, never below ``floor``) and
  takes the spec's warming over; every create of it is then a SandboxClaim;
- a pool this backend created follows later targets: changes are coalesced, one merge
  patch of ``spec.replicas`` per ``scale_delay_s`` at most, so a burst of targets is one
  patch, not a storm;
- a pool that already exists under this run's name (applied with ``rollbox k8s render``,
  or left by another process of the run) is found by one LIST of the run's pools, then
  used for the spec's claims, never scaled and never deleted (it is not this backend's);
- a spec with neither (a small target, e.g. core's lookahead warming one sandbox per
  task) has no pool: its creates are direct Sandboxes and core warms it.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from rollbox.spec import SandboxSpec

from rollbox_kubernetes import render
from rollbox_kubernetes.client import ApiError
from rollbox_kubernetes.resources import TEMPLATES, WARM_POOLS, Resource, owned_by

if TYPE_CHECKING:
    from rollbox_kubernetes.backend import KubernetesBackend


class WarmPools:
    """The backend's warm pools, by spec key (``render.spec_key``)."""

    def __init__(self, backend: KubernetesBackend, *, min_replicas: int, floor: int,
                 scale_delay_s: float) -> None:
        self.backend = backend
        self.min_replicas = min_replicas
        self.floor = floor
        self.scale_delay_s = scale_delay_s
        self.owned: list[tuple[Resource, str]] = []  # created by this backend: deleted at close
        self.applied: dict[str, int] = {}  # replicas last written, pools this backend made
        self._made: dict[str, asyncio.Task[str]] = {}  # pools this backend makes or made
        self._found: set[str] = set()  # keys whose pool existed before this backend
        self._existing: asyncio.Task[frozenset[str]] | None = None
        self._desired: dict[str, int] = {}
        self._scalers: dict[str, asyncio.Task[None]] = {}

    # -- from core's pool (synchronous) --------------------------------------------------

    def keep_warm(self, spec: SandboxSpec, count: int) -> bool:
        key = render.spec_key(spec, self.backend.options)
        self._desired[key] = max(0, count)
        if key in self._found:
            return True
        task = self._made.get(key)
        if task is not None and not (task.done() and task.exception() is not None):
            self._schedule_scale(key)
            return True
        if count < max(1, self.min_replicas):
            return False
        self._made[key] = asyncio.ensure_future(self._make(spec, key))
        return True

    def replicas(self, key: str) -> int:
        return max(self.floor, self._desired.get(key, 0))

    # -- from the backend's create (async) -----------------------------------------------

    async def pool_for(self, spec: SandboxSpec, key: str) -> str | None:
        """The warm pool a create of ``spec`` claims from, or None for a direct Sandbox."""
        task = self._made.get(key)
        if task is not None:
            if not (task.done() and task.exception() is not None):
                return await asyncio.shield(task)
            del self._made[key]  # making it failed earlier: the next big target retries
        name = render.template_name(key, self.backend.options)
        if name in await self._existing_pools():
            self._found.add(key)
            return name
        return None

    async def _existing_pools(self) -> frozenset[str]:
        """The run's warm pools that were in the cluster when first asked (one LIST)."""
        if self._existing is None or (self._existing.done()
                                      and self._existing.exception() is not None):
            self._existing = asyncio.ensure_future(self._list())
        return await asyncio.shield(self._existing)

    async def _list(self) -> frozenset[str]:
        backend = self.backend
        await backend.connect()
        try:
            listing = await backend.client.list_objects(
                WARM_POOLS, backend.options.namespace,
                label_selector=owned_by(backend.options.run_id))
        except ApiError as err:
            if err.status == 404 and "namespace" not in err.message:
                return frozenset()  # no extensions CRDs: direct Sandboxes only
            raise backend.map_error("list SandboxWarmPools", err) from None
        return frozenset(item["metadata"]["name"] for item in listing.get("items") or [])

    # -- making and scaling --------------------------------------------------------------

    async def _make(self, spec: SandboxSpec, key: str) -> str:
        """Template, then warm pool; one that exists already (in the run's LIST, or a
        409 on create) is used, not owned."""
        from rollbox_kubernetes.backend import ApiConflict

        backend = self.backend
        ns, options = backend.options.namespace, backend.options
        pool_name = render.template_name(key, options)
        if pool_name in await self._existing_pools():
            self._found.add(key)  # applied before this backend: use it as it is
            return pool_name
        replicas = self.replicas(key)
        pool = render.warm_pool(spec, options, replicas)
        for res, body in ((TEMPLATES, render.template(spec, options)), (WARM_POOLS, pool)):
            name = body["metadata"]["name"]
            try:
                await backend.api(f"create {res.kind}", backend.client.create(res, ns, body))
            except ApiConflict:
                if res is WARM_POOLS:
                    self._found.add(key)  # someone else's: use it as it is
                continue
            self.owned.append((res, name))
            if res is WARM_POOLS:
                self.applied[key] = replicas
                self._schedule_scale(key)  # targets that changed while it was made
        return str(pool["metadata"]["name"])

    def _schedule_scale(self, key: str) -> None:
        task = self._scalers.get(key)
        if task is None or task.done():
            self._scalers[key] = asyncio.ensure_future(self._scale(key))

    async def _scale(self, key: str) -> None:
        """Bring the pool's replicas to the latest target, at most one patch per
        ``scale_delay_s``; returns once they agree (a later change starts it again)."""
        made = self._made.get(key)
        if made is None:
            return
        try:
            name = await asyncio.shield(made)
        except Exception:
            return  # making it failed: the create that awaits it reports why
        if key not in self.applied:
            return  # not ours (found, or making it failed): never scaled
        backend = self.backend
        while True:
            want = self.replicas(key)
            if want == self.applied[key]:
                return
            await asyncio.sleep(self.scale_delay_s)
            want = self.replicas(key)
            if want == self.applied[key]:
                return
            try:
                await backend.client.patch(WARM_POOLS, backend.options.namespace, name,
                                           {"spec": {"replicas": want}})
            except ApiError:
                return  # advisory: claims still work, the next change tries again
            self.applied[key] = want

    async def aclose(self) -> None:
        """Stop scaling; let pools being made finish (so they are in ``owned``, which the
        backend deletes afterwards, rather than half made and forgotten)."""
        scalers = list(self._scalers.values())
        for task in scalers:
            task.cancel()
        await asyncio.gather(*scalers, *self._made.values(), return_exceptions=True)
        self._scalers.clear()
        self._made.clear()
