"""One rollbox event loop per process, and the warm pools every provider in it shares.

NeMo Gym makes a provider per sandbox: ``AsyncSandbox(config)`` builds one from its
YAML mapping and closes it (``aclose``) when the sandbox stops. If each provider owned a
pool, nothing would ever be warm. So providers of equal configuration share one backend
and one ``rollbox.Pool``, attached by reference count; a pool whose last provider is gone
stays warm for ``keep_warm_s`` seconds, then closes (at once when it is 0).

Those pools live on one event loop on a daemon thread, not on the caller's loop: NeMo
Gym's synchronous ``Sandbox`` facade runs every sandbox on a loop of its own that it
closes on ``stop``, and a pool (its sandboxes, their pipes, its timers) belongs to the
loop that made it. A provider method hands its coroutine to this loop and awaits the
result; cancelling the caller cancels the work. At interpreter exit (or ``shutdown()``)
every pool and backend is closed. Safe across ``fork``: a child starts its own loop.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import concurrent.futures.thread  # its exit hook first: see the end
import contextlib
import functools
import os
import threading
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import rollbox
from rollbox.backend import Backend
from rollbox.errors import UsageError
from rollbox.plugins import get_plugin_manager, pool_policies
from rollbox.pool import Pool, PoolPolicy

T = TypeVar("T")

POOL_KWARGS = frozenset(
    {"max_sandboxes", "create_rate", "create_burst", "health_check", "prepare"}
)
"""``rollbox.Pool`` keyword arguments a provider configuration may set."""


class LoopThread:
    """An event loop running forever on a daemon thread."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.pools = SharedPools()
        self._thread = threading.Thread(target=self._main, name="rollbox-nemo-gym", daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self.loop.is_closed()

    async def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on this loop and await its result from any loop."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            return await coro
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return await asyncio.wrap_future(future)

    def stop(self) -> None:
        """Close every pool and backend, then stop the loop. Idempotent."""
        if not self.alive or os.getpid() != self.pid:
            return
        future = asyncio.run_coroutine_threadsafe(self.pools.close_all(), self.loop)
        # best effort: the process is going away
        with contextlib.suppress(Exception, concurrent.futures.CancelledError):
            future.result(timeout=60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self.loop.close()


@dataclass(frozen=True)
class PoolConfig:
    """What decides which pool a provider shares: its backend and pool settings.

    Equal when the settings are (nested mappings compared by value)."""

    backend: str
    backend_options: Mapping[str, Any] = field(compare=False)
    pool_options: Mapping[str, Any] = field(compare=False)
    key: tuple[Any, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", (_freeze(self.backend_options),
                                         _freeze(self.pool_options)))


class SharedPool:
    """A backend and its pool, with the number of providers using them."""

    def __init__(self, config: PoolConfig, backend: Backend, pool: Pool) -> None:
        self.config = config
        self.backend = backend
        self.pool = pool
        self.refs = 0
        self.closed = False
        self.expiry: asyncio.TimerHandle | None = None


class SharedPools:
    """The shared pools of one loop, by configuration. Used only on that loop."""

    def __init__(self) -> None:
        self._pools: dict[PoolConfig, SharedPool] = {}
        self._closing: set[asyncio.Task[None]] = set()

    async def attach(self, config: PoolConfig) -> SharedPool:
        shared = self._pools.get(config)
        if shared is None:
            backend = rollbox.open_backend(config.backend, **config.backend_options)
            try:
                pool = Pool(backend, **pool_kwargs(config.pool_options))
            except BaseException:
                await backend.aclose()
                raise
            shared = self._pools[config] = SharedPool(config, backend, pool)
        if shared.expiry is not None:
            shared.expiry.cancel()
            shared.expiry = None
        shared.refs += 1
        return shared

    async def detach(self, shared: SharedPool, keep_warm_s: float) -> None:
        """One provider fewer; the last one closes the pool now or after ``keep_warm_s``."""
        shared.refs -= 1
        if shared.refs > 0 or shared.closed:
            return
        if keep_warm_s <= 0:
            await self._close(shared)
            return
        loop = asyncio.get_running_loop()
        shared.expiry = loop.call_later(keep_warm_s, self._expire, shared)

    def _expire(self, shared: SharedPool) -> None:
        shared.expiry = None
        if shared.refs <= 0 and not shared.closed:
            task = asyncio.ensure_future(self._close(shared))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def close_all(self) -> None:
        for shared in list(self._pools.values()):
            await self._close(shared)
        await asyncio.gather(*self._closing, return_exceptions=True)

    def __len__(self) -> int:
        return len(self._pools)

    def open(self) -> list[SharedPool]:
        """The pools open now (their ``pool.metrics`` say how warm they ran)."""
        return list(self._pools.values())

    async def _close(self, shared: SharedPool) -> None:
        if shared.closed:
            return
        shared.closed = True
        if shared.expiry is not None:
            shared.expiry.cancel()
        if self._pools.get(shared.config) is shared:
            del self._pools[shared.config]
        try:
            await shared.pool.close()
        finally:
            await shared.backend.aclose()


def pool_kwargs(options: Mapping[str, Any]) -> dict[str, Any]:
    """``rollbox.Pool`` keyword arguments from a provider's ``pool_options``.

    ``policy`` is a registered policy name (``none``, ``static``, ``lookahead``, or a
    plugin's), made with ``policy_options``.
    """
    kwargs = dict(options)
    name = kwargs.pop("policy", None)
    policy_options = kwargs.pop("policy_options", None) or {}
    unknown = set(kwargs) - POOL_KWARGS
    if unknown:
        raise UsageError(
            f"unknown pool_options {', '.join(sorted(unknown))}; known: policy, "
            f"policy_options, {', '.join(sorted(POOL_KWARGS))}"
        )
    if not isinstance(policy_options, Mapping):
        raise UsageError("pool_options.policy_options must be a mapping")
    if name is not None:
        known = _pool_policies()
        if name not in known:
            raise UsageError(
                f"no pool policy named {name!r}; installed: {', '.join(sorted(known))}"
            )
        try:
            policy = known[name](**policy_options)
        except TypeError as exc:
            raise UsageError(f"pool policy {name!r} does not take {dict(policy_options)}: "
                             f"{exc}") from None
        if not isinstance(policy, PoolPolicy):
            raise UsageError(f"pool policy {name!r} did not make a PoolPolicy")
        kwargs["policy"] = policy
    elif policy_options:
        raise UsageError("pool_options.policy_options needs pool_options.policy")
    return kwargs


@functools.cache
def _pool_policies() -> dict[str, type[object]]:
    """The registered pool policies, looked up once: NeMo Gym makes a provider per
    sandbox, and loading every plugin's entry points costs tens of milliseconds."""
    return dict(pool_policies(get_plugin_manager()))


def _freeze(value: Any) -> Any:
    """``value`` as something hashable that compares like it."""
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _freeze(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    return value


_lock = threading.Lock()
_current: LoopThread | None = None


def loop_thread() -> LoopThread:
    """This process's rollbox loop, started on first use (and again after a fork)."""
    global _current
    with _lock:
        if _current is None or _current.pid != os.getpid() or not _current.alive:
            _current = LoopThread()
        return _current


def shutdown() -> None:
    """Close every shared pool and backend and stop the loop (also run at exit).

    Providers still open afterwards start a fresh loop on their next call."""
    global _current
    with _lock:
        current, _current = _current, None
    if current is not None:
        current.stop()


# At interpreter exit, concurrent.futures' thread pools stop taking work before atexit
# handlers run, and closing a local backend still deletes layers through one. threading's
# own exit hooks (the one concurrent.futures.thread registers on import) run earlier, in
# reverse order of registration: registered after it, this one runs before it.
_at_exit = getattr(threading, "_register_atexit", atexit.register)
_at_exit(shutdown)
