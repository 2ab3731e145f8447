"""Pools shared by every user of a process that asks for the same backend and options.

A user (a Gymnasium env, a server's session, a NeMo Gym provider) attaches when it is
made and detaches when it closes; the last to detach closes the pool (and the backend,
when rollbox opened it) — at once, or ``keep_warm_s`` later if it asks, so that users
that come and go one after another (NeMo Gym makes a provider per sandbox) still find
the pool warm. Every method runs on the bridge's loop thread (``rollbox.envs.bridge``),
so the registry needs no lock; ``shutdown()`` there closes every shared pool.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
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

POOL_OPTIONS = frozenset(
    {*list(inspect.signature(Pool).parameters)[1:], "policy_options"})
"""What ``pool_options`` may say: ``rollbox.Pool``'s keyword arguments (``policy`` also
by its registered name, made with ``policy_options``)."""


@dataclass
class SharedPool:
    """A pool and its backend, with the number of envs using it."""

    key: tuple[Any, ...]
    pool: Pool
    backend: Backend
    owns_backend: bool
    refs: int = 0
    closed: bool = field(default=False)
    expiry: asyncio.TimerHandle | None = field(default=None, repr=False)
    """Set while the pool, unused, waits out its ``keep_warm_s``."""


class PoolRegistry:
    """The shared pools of one loop thread, by (backend, options) key."""

    def __init__(self) -> None:
        self._pools: dict[tuple[Any, ...], SharedPool] = {}
        self._closing: set[asyncio.Task[None]] = set()

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
            try:
                pool = Pool(instance, **pool_kwargs(pool_options))
            except BaseException:
                if owns:
                    await instance.aclose()
                raise
            shared = self._pools[key] = SharedPool(key, pool, instance, owns)
        if shared.expiry is not None:
            shared.expiry.cancel()
            shared.expiry = None
        shared.refs += 1
        return shared

    async def detach(self, shared: SharedPool, keep_warm_s: float = 0.0) -> None:
        """One user fewer. The last one closes the pool, or leaves it warm for
        ``keep_warm_s`` seconds (a user attaching meanwhile keeps it)."""
        shared.refs -= 1
        if shared.refs > 0 or shared.closed:
            return
        if keep_warm_s > 0:
            shared.expiry = asyncio.get_running_loop().call_later(
                keep_warm_s, self._expire, shared)
            return
        self._forget(shared)
        await _close(shared)

    def _forget(self, shared: SharedPool) -> None:
        if self._pools.get(shared.key) is shared:
            del self._pools[shared.key]

    def _expire(self, shared: SharedPool) -> None:
        shared.expiry = None
        if shared.refs <= 0 and not shared.closed:
            self._forget(shared)
            task = asyncio.ensure_future(_close(shared))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def close_all(self) -> None:
        pools, self._pools = list(self._pools.values()), {}
        for shared in pools:
            await _close(shared)
        await asyncio.gather(*self._closing, return_exceptions=True)

    def open(self) -> list[SharedPool]:
        """The pools open now (their ``pool.metrics`` say how they ran)."""
        return list(self._pools.values())

    def __len__(self) -> int:
        return len(self._pools)


async def _close(shared: SharedPool) -> None:
    if shared.closed:
        return
    shared.closed = True
    if shared.expiry is not None:
        shared.expiry.cancel()
        shared.expiry = None
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


def _freeze(value: Any) -> str:
    """Options as a string equal for equal options (mappings in any order)."""
    def canonical(item: Any) -> Any:
        if isinstance(item, Mapping):
            return sorted((str(k), canonical(v)) for k, v in item.items())
        if isinstance(item, list | tuple):
            return [canonical(v) for v in item]
        return item

    return repr(canonical(value))


def pool_kwargs(options: Mapping[str, Any]) -> dict[str, Any]:
    """``Pool`` keyword arguments from ``pool_options`` (see ``POOL_OPTIONS``); a
    UsageError names what is wrong."""
    kwargs = dict(options)
    unknown = set(kwargs) - POOL_OPTIONS
    if unknown:
        raise UsageError(f"unknown pool_options {', '.join(sorted(unknown))}; known: "
                         f"{', '.join(sorted(POOL_OPTIONS))}")
    policy = kwargs.get("policy")
    policy_options = kwargs.pop("policy_options", None) or {}
    if not isinstance(policy_options, Mapping):
        raise UsageError("pool_options['policy_options'] must be a mapping")
    if isinstance(policy, str):
        known = _pool_policies()
        if policy not in known:
            raise UsageError(
                f"no pool policy named {policy!r}; installed: {', '.join(sorted(known))}"
            )
        try:
            made = known[policy](**policy_options)
        except TypeError as exc:
            raise UsageError(f"pool policy {policy!r} does not take {dict(policy_options)}: "
                             f"{exc}") from None
        kwargs["policy"] = made
    elif policy_options:
        raise UsageError("pool_options['policy_options'] apply to a policy given by name")
    if policy is not None and not isinstance(kwargs["policy"], PoolPolicy):
        raise UsageError("pool_options['policy'] must be a policy name or a PoolPolicy")
    return kwargs


@functools.cache
def _pool_policies() -> dict[str, type[object]]:
    """The registered pool policies, looked up once per process: loading every plugin's
    entry points costs milliseconds, and some users attach per sandbox."""
    return dict(pool_policies(get_plugin_manager()))


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
