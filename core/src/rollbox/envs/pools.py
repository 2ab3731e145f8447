"""Pools shared by every user of a process that asks for the same backend and options.

A user (a Gymnasium env, a server's session) attaches when it is made and detaches when
it closes; the last to detach closes the pool (and the backend, when rollbox opened it).
Every method runs on the bridge's loop thread (``rollbox.envs.bridge``), so the registry
needs no lock; ``shutdown()`` there closes every shared pool.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rollbox.backend import Backend
from rollbox.envs.bridge import LoopThread, loop_thread
from rollbox.errors import UsageError
from rollbox.plugins import get_plugin_manager, pool_policies
from rollbox.pool import Pool, PoolPolicy

BackendArg = str | Backend | None


@dataclass
class SharedPool:
    """A pool and its backend, with the number of envs using it."""

    key: tuple[Any, ...]
    pool: Pool
    backend: Backend
    owns_backend: bool
    refs: int = 0
    closed: bool = field(default=False)


class PoolRegistry:
    """The shared pools of one loop thread, by (backend, options) key."""

    def __init__(self) -> None:
        self._pools: dict[tuple[Any, ...], SharedPool] = {}

    async def attach(
        self,
        backend: BackendArg,
        backend_options: Mapping[str, Any],
        pool_options: Mapping[str, Any],
    ) -> SharedPool:
        key = _key(backend, backend_options, pool_options)
        shared = self._pools.get(key)
        if shared is None:
            if isinstance(backend, Backend):
                if backend_options:
                    raise UsageError("backend_options apply only when backend is given by name")
                instance, owns = backend, False
            else:
                from rollbox import open_backend

                instance, owns = open_backend(backend, **backend_options), True
            pool = Pool(instance, **_pool_kwargs(pool_options))
            shared = self._pools[key] = SharedPool(key, pool, instance, owns)
        shared.refs += 1
        return shared

    async def detach(self, shared: SharedPool) -> None:
        shared.refs -= 1
        if shared.refs <= 0 and not shared.closed:
            self._pools.pop(shared.key, None)
            await _close(shared)

    async def close_all(self) -> None:
        pools, self._pools = list(self._pools.values()), {}
        for shared in pools:
            await _close(shared)

    def __len__(self) -> int:
        return len(self._pools)


async def _close(shared: SharedPool) -> None:
    shared.closed = True
    try:
        await shared.pool.close()
    finally:
        if shared.owns_backend:
            await shared.backend.aclose()


def _key(
    backend: BackendArg, backend_options: Mapping[str, Any], pool_options: Mapping[str, Any]
) -> tuple[Any, ...]:
    which: object = ("instance", id(backend)) if isinstance(backend, Backend) else backend
    return (which, _freeze(backend_options), _freeze(pool_options))


def _freeze(options: Mapping[str, Any]) -> str:
    return repr(sorted(options.items()))


def _pool_kwargs(options: Mapping[str, Any]) -> dict[str, Any]:
    """``Pool`` keyword arguments; ``policy`` may be a registered policy name."""
    kwargs = dict(options)
    policy = kwargs.get("policy")
    if isinstance(policy, str):
        known = pool_policies(get_plugin_manager())
        if policy not in known:
            raise UsageError(
                f"no pool policy named {policy!r}; installed: {', '.join(sorted(known))}"
            )
        kwargs["policy"] = known[policy]()
    elif policy is not None and not isinstance(policy, PoolPolicy):
        raise UsageError("pool_options['policy'] must be a policy name or a PoolPolicy")
    return kwargs


_lock = threading.Lock()
_registries: weakref.WeakKeyDictionary[LoopThread, PoolRegistry] = weakref.WeakKeyDictionary()


def registry() -> tuple[LoopThread, PoolRegistry]:
    """The current loop thread and its pool registry (created with it)."""
    thread = loop_thread()
    with _lock:
        found = _registries.get(thread)
        if found is None:
            found = _registries[thread] = PoolRegistry()
            thread.on_shutdown(found.close_all)
    return thread, found
