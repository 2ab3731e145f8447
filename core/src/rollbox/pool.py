"""Warm pools keyed by spec: acquire a lease, release it, and the sandbox is reset in
place for the next caller instead of being deleted and recreated.

Data flow::

    acquire(spec) ─► idle sandbox of that spec? ─ ping ok ─► Lease (reuses += 1)
          │                         └─ ping fails ─► quarantine, try the next
          └─ none idle ─► room under max_sandboxes? (else evict an idle one of another
                           spec, else wait) ─► token bucket ─► backend.create
    release(lease, ok)  ─► policy.reuse? ─► reset ─ ok ─► idle (or closed if over
                                              │           the policy's max_idle)
                                              └─ fails ─► quarantine (closed, counted)
    release(lease, broken) ─► closed, counted

A background filler keeps ``policy.warm_target(spec)`` sandboxes idle per spec, unless
the backend takes a spec's warming over: each time a spec's target changes the pool
calls ``backend.keep_warm(spec, target)``, and a backend that answers True (one with
warm capacity of its own, such as a cluster's warm pool) keeps them ready on its side
while the pool only reuses what is released. Time comes only from the running loop, so
the pool runs unchanged in virtual time.
"""

from __future__ import annotations

import asyncio
import contextlib
import warnings
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rollbox.backend import Backend, creating_ahead_of_need
from rollbox.errors import (
    AcquireTimeoutError,
    PoolClosedError,
    ResetFailedError,
    RollboxError,
    SandboxError,
)
from rollbox.lease import Lease, LeaseContext, MeteredSandbox, Outcome
from rollbox.metrics import Metrics
from rollbox.plugins import notify
from rollbox.policies import NoPoolPolicy, PoolPolicy, StaticPoolPolicy
from rollbox.ratelimit import TokenBucket
from rollbox.sandbox import Sandbox
from rollbox.spec import SandboxSpec

if TYPE_CHECKING:
    import pluggy

__all__ = ["Lease", "MeteredSandbox", "NoPoolPolicy", "Outcome", "Pool", "PoolPolicy",
           "Quarantined", "StaticPoolPolicy"]

FailureObserver = Callable[[SandboxError, SandboxSpec], None]


@dataclass
class Quarantined:
    sandbox_id: str
    spec: SandboxSpec
    reason: str


class _SpecState:
    def __init__(self) -> None:
        self.idle: deque[Sandbox] = deque()
        self.leased = 0
        self.creating = 0
        self.filling = 0  # of ``creating``: warm creates by the filler
        self.expecting = 0  # acquirers waiting for one of those instead of creating
        self.filler: asyncio.Task[None] | None = None
        self.reported = 0  # the warm target last told to ``backend.keep_warm``
        self.delegated = False  # the backend keeps this spec warm, not the filler


class Pool:
    """Warm sandboxes for many specs over one backend. Use as an async context manager."""

    def __init__(
        self,
        backend: Backend,
        *,
        policy: PoolPolicy | None = None,
        max_sandboxes: int | None = None,
        create_rate: float | None = None,
        create_burst: int = 8,
        health_check: bool = True,
        prepare: bool = True,
        metrics: Metrics | None = None,
        on_failure: FailureObserver | None = None,
        plugin_manager: pluggy.PluginManager | None = None,
    ) -> None:
        self.backend = backend
        self.policy = policy or StaticPoolPolicy(size=0)
        self.max_sandboxes = max_sandboxes
        self.limiter = TokenBucket(create_rate, create_burst) if create_rate else None
        self.health_check = health_check
        self.prepare = prepare
        """Call ``Sandbox.prepare()`` on every sandbox created, so a warm one answers its
        first command at full speed. False keeps idle sandboxes as small as the backend
        can (e.g. thousands held in reserve) at the cost of a slower first command."""
        self.metrics = metrics or Metrics()
        self.on_failure = on_failure
        self.plugin_manager = plugin_manager
        """Observers of this pool's creations and failures (``rollbox_sandbox_created``,
        ``rollbox_sandbox_failed``) and, unless a run is given its own, of the rollouts
        run over it (``rollbox_rollout_finished``)."""
        self.quarantined: deque[Quarantined] = deque(maxlen=1000)
        self._specs: dict[SandboxSpec, _SpecState] = {}
        self._lru: OrderedDict[Sandbox, SandboxSpec] = OrderedDict()  # idle, oldest first
        self._leased: set[Sandbox] = set()
        self._in_transit = 0  # neither idle nor leased: being reset or health-checked
        self._urgent_creates = 0  # creates an acquire waits for, in progress
        self._no_urgent_creates = asyncio.Event()
        self._no_urgent_creates.set()
        self._room = asyncio.Condition()
        self._closing: set[asyncio.Task[None]] = set()
        self._closed = False
        self._reported: set[SandboxSpec] = set()  # specs last told a target above 0
        self._queued: list[SandboxSpec] = []  # the runner's window (``upcoming``)
        self._expected: list[SandboxSpec] = []  # what comes after it (``expect``)

    # -- public API ------------------------------------------------------------------

    @property
    def live(self) -> int:
        """Sandboxes in existence or being created: idle, leased, being reset or
        health-checked between the two, and being created. ``max_sandboxes`` caps this
        (a sandbox being closed no longer counts)."""
        return (len(self._lru) + len(self._leased) + self._in_transit
                + sum(s.creating for s in self._specs.values()))

    def idle_count(self, spec: SandboxSpec | None = None) -> int:
        if spec is None:
            return len(self._lru)
        state = self._specs.get(spec)
        return len(state.idle) if state else 0

    async def acquire(self, spec: SandboxSpec, *, timeout: float | None = None) -> Lease:
        """A sandbox for ``spec``: a warm one if ready, else a new one.

        Raises PoolClosedError, AcquireTimeoutError (retryable) or the backend's create
        error (CreateFailedError and ImageStoreFullError are retryable).
        """
        loop = asyncio.get_running_loop()
        requested = loop.time()
        if not self._closed:
            # Before the first create of a spec: a backend that takes its warming over
            # serves this very acquire from its own warm capacity.
            self._report_target(spec, self._state(spec))
        try:
            async with asyncio.timeout(timeout):
                sandbox = await self._obtain(spec)
        except TimeoutError:
            error = AcquireTimeoutError(
                f"no sandbox for image {spec.image!r} within {timeout}s "
                f"({self.live} live, max_sandboxes={self.max_sandboxes}); raise the limit "
                "or release leases sooner"
            )
            self.metrics.failure(error)
            raise error from None
        self._leased.add(sandbox)
        self._state(spec).leased += 1
        self.metrics.observe("queue_wait", loop.time() - requested)
        self._kick(spec)
        return Lease(self, sandbox, spec, requested)

    def lease(self, spec: SandboxSpec, *, timeout: float | None = None) -> LeaseContext:
        """``async with pool.lease(spec) as sandbox:`` — released on exit (broken if a
        SandboxError escaped)."""
        return LeaseContext(self, spec, timeout)

    async def release(self, lease: Lease, outcome: Outcome = Outcome.OK) -> None:
        """Give a lease back. OK sandboxes are reset in place and kept warm."""
        if lease.released:
            return
        lease.released = True
        sandbox = lease.raw
        if sandbox in self._leased:
            self._leased.discard(sandbox)
            self._state(lease.spec).leased -= 1
        try:
            keep = (
                outcome is Outcome.OK
                and self.policy.reuse
                and not self._closed
                and self.idle_count(lease.spec) < self.policy.max_idle(lease.spec)
            )
            if not keep:
                await self._close(sandbox)
                return
            with self._in_transit_while():
                try:
                    clean = await self._reset(sandbox, lease.spec)
                except BaseException:  # cancelled mid-reset: in no known state, so it goes
                    self._close_soon(sandbox)
                    raise
            if clean:
                self._park(sandbox, lease.spec)
        finally:
            await self._notify_room()

    async def prewarm(self, spec: SandboxSpec, count: int) -> None:
        """Create ``count`` idle sandboxes of ``spec`` now (paced like any create)."""
        results = await asyncio.gather(
            *(self._create(spec) for _ in range(count)), return_exceptions=True
        )
        for result in results:
            if isinstance(result, Sandbox):
                self._park(result, spec)
            elif isinstance(result, BaseException) and not isinstance(result, RollboxError):
                raise result

    def upcoming(self, specs: Sequence[SandboxSpec]) -> None:
        """Tell the policy (and the backend's image hydration) what comes next, soonest
        first (the runner's queue; what ``expect`` said follows it)."""
        self._queued = list(specs)
        self._hint()

    def expect(self, specs: Sequence[SandboxSpec]) -> None:
        """What will be acquired after everything ``upcoming`` names, soonest first: a
        training loop's next step, say, known while this one runs. It stays until the
        next ``expect`` (``expect([])`` drops it), behind whatever the runner queues, so
        the pool warms it and the backend hydrates its images with the lead of a whole
        step."""
        self._expected = list(specs)
        self._hint()

    def _hint(self) -> None:
        specs = [*self._queued, *self._expected]
        self.policy.upcoming(specs)
        self.backend.hint_upcoming([s.image for s in specs])
        # Specs that left the window may have a lower target now: tell the backend too.
        for spec in dict.fromkeys([*self.policy.warm_specs(dict.fromkeys(specs)),
                                   *self._reported]):
            self._kick(spec)

    async def shrink(self, spec: SandboxSpec, keep: int = 0) -> int:
        """Close idle sandboxes of ``spec`` beyond ``keep`` (a pool shared by many
        clients trims what nobody asked for any more); returns how many it closed."""
        state = self._specs.get(spec)
        victims = []
        while state is not None and len(state.idle) > keep:
            sandbox = state.idle.popleft()
            self._lru.pop(sandbox, None)
            victims.append(sandbox)
        await asyncio.gather(*(self._close(s) for s in victims))
        self.metrics.count("evictions", len(victims))
        if victims:
            await self._notify_room()
        return len(victims)

    @property
    def idle_specs(self) -> list[SandboxSpec]:
        """The specs that have idle sandboxes now."""
        return [spec for spec, state in self._specs.items() if state.idle]

    def delegated(self, spec: SandboxSpec) -> bool:
        """True while the backend keeps ``spec`` warm (``Backend.keep_warm``)."""
        state = self._specs.get(spec)
        return state is not None and state.delegated

    async def close(self) -> None:
        """Stop filling, close every idle and leased sandbox. Idempotent."""
        self._closed = True
        for spec in list(self._reported):
            self._tell_backend(spec, self._state(spec), 0)
        fillers = [s.filler for s in self._specs.values() if s.filler is not None]
        for task in fillers:
            task.cancel()
        await asyncio.gather(*fillers, return_exceptions=True)
        victims = list(self._lru) + list(self._leased)
        self._lru.clear()
        self._leased.clear()
        for state in self._specs.values():
            state.idle.clear()
            state.leased = 0
        await asyncio.gather(*(self._close(s) for s in victims), *self._closing,
                             return_exceptions=True)
        await self._notify_room()

    async def __aenter__(self) -> Pool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- internals -------------------------------------------------------------------

    def _state(self, spec: SandboxSpec) -> _SpecState:
        state = self._specs.get(spec)
        if state is None:
            state = self._specs[spec] = _SpecState()
        return state

    async def _obtain(self, spec: SandboxSpec) -> Sandbox:
        state = self._state(spec)
        while True:
            if self._closed:
                raise PoolClosedError("the pool is closed; create a new Pool")
            while state.idle:
                sandbox = state.idle.popleft()
                self._lru.pop(sandbox, None)
                with self._in_transit_while():
                    try:
                        healthy = not self.health_check or await sandbox.ping()
                    except BaseException:  # cancelled mid-check (its acquire timed out)
                        self._park(sandbox, spec)
                        raise
                if healthy:
                    self.metrics.count("reuses")
                    return sandbox
                await self._quarantine(sandbox, spec, "failed its health check before hand-out")
            if state.filling > state.expecting:
                # A warm sandbox of this spec is on its way: wait for it rather than
                # create a duplicate (the filler notifies when it parks or fails).
                state.expecting += 1
                try:
                    async with self._room:
                        await self._room.wait()
                finally:
                    state.expecting -= 1
                continue
            if await self._make_room():
                return await self._create(spec, counted=True, urgent=True)
            async with self._room:
                if not state.idle:
                    await self._room.wait()

    @contextlib.contextmanager
    def _in_transit_while(self) -> Iterator[None]:
        """Count a sandbox that is neither idle nor leased (being reset or health-checked)
        toward ``live``: otherwise ``max_sandboxes`` could be passed meanwhile."""
        self._in_transit += 1
        try:
            yield
        finally:
            self._in_transit -= 1

    async def _make_room(self) -> bool:
        """True when one more sandbox may exist, evicting an idle one if needed."""
        if self.max_sandboxes is None or self.live < self.max_sandboxes:
            return True
        if self._lru:
            victim, spec = self._lru.popitem(last=False)
            self._state(spec).idle.remove(victim)
            await self._close(victim)
            self.metrics.count("evictions")
            return self.live < self.max_sandboxes
        return False

    async def _create(self, spec: SandboxSpec, *, counted: bool = True,
                      urgent: bool = False) -> Sandbox:
        """``urgent``: an acquire waits for this sandbox; its create goes before warm-ups
        in the create limiter, and warm-ups wait until it is done (theirs can wait; an
        acquire's wait is its TTFC, and a cluster starts pods in the order they come)."""
        state = self._state(spec)
        state.creating += 1
        if urgent:
            self._urgent_creates += 1
            self._no_urgent_creates.clear()
        try:
            if self.limiter is not None:
                await self.limiter.acquire(urgent=urgent)
            loop = asyncio.get_running_loop()
            started = loop.time()
            try:
                sandbox = await self.backend.create(spec)
            except SandboxError as error:
                self._count_failure(error, spec)
                raise
            if self.prepare:
                try:
                    await sandbox.prepare()
                except BaseException as error:  # cancelled (pool closing) included
                    if isinstance(error, SandboxError):
                        self._count_failure(error, spec)
                    await self._close(sandbox)
                    raise
            seconds = loop.time() - started
            self.metrics.observe("create", seconds)
            self.metrics.count("creations")
            self.metrics.count("mutations")
            notify(self.plugin_manager, "rollbox_sandbox_created", self.metrics,
                   sandbox_id=sandbox.id, spec=spec, seconds=seconds)
            if self._closed:
                await self._close(sandbox)
                raise PoolClosedError("the pool closed while a sandbox was being created")
            return sandbox
        finally:
            state.creating -= 1
            if urgent:
                self._urgent_creates -= 1
                if not self._urgent_creates:
                    self._no_urgent_creates.set()

    async def _reset(self, sandbox: Sandbox, spec: SandboxSpec) -> bool:
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            async with asyncio.timeout(spec.timeouts.reset_s):
                await sandbox.reset()
        except (SandboxError, TimeoutError, OSError) as exc:
            await self._quarantine(sandbox, spec, f"reset failed: {exc!r}")
            return False
        self.metrics.observe("reset", loop.time() - started)
        self.metrics.count("resets")
        return True

    def _park(self, sandbox: Sandbox, spec: SandboxSpec) -> None:
        if self._closed:
            self._close_soon(sandbox)
            return
        self._state(spec).idle.append(sandbox)
        self._lru[sandbox] = spec

    def _close_soon(self, sandbox: Sandbox) -> None:
        """Close ``sandbox`` in a task of its own (``close()`` waits for it): for callers
        that cannot wait, being cancelled or not async."""
        task = asyncio.ensure_future(self._close(sandbox))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _quarantine(self, sandbox: Sandbox, spec: SandboxSpec, reason: str) -> None:
        self.quarantined.append(Quarantined(sandbox.id, spec, reason))
        self.metrics.count("quarantined")
        self._count_failure(ResetFailedError(reason, sandbox_id=sandbox.id), spec)
        await self._close(sandbox)

    def _count_failure(self, error: SandboxError, spec: SandboxSpec) -> None:
        self.metrics.failure(error)
        notify(self.plugin_manager, "rollbox_sandbox_failed", self.metrics,
               error=error, spec=spec)
        if self.on_failure is not None:
            self.on_failure(error, spec)

    async def _close(self, sandbox: Sandbox) -> None:
        with contextlib.suppress(RollboxError, OSError):
            await sandbox.close()
        self.metrics.count("closed")
        self.metrics.count("mutations")

    async def _notify_room(self) -> None:
        async with self._room:
            self._room.notify_all()

    def _short_of_target(self, spec: SandboxSpec, state: _SpecState) -> bool:
        have = len(state.idle) + state.creating
        if self.policy.counts_leased:
            have += state.leased
        return have < self.policy.warm_target(spec)

    def _report_target(self, spec: SandboxSpec, state: _SpecState) -> None:
        """Tell the backend the policy's warm target of ``spec`` if it changed."""
        target = self.policy.warm_target(spec)
        if target != state.reported:
            self._tell_backend(spec, state, target)

    def _tell_backend(self, spec: SandboxSpec, state: _SpecState, target: int) -> None:
        """Report a changed warm target; the backend's answer says who warms ``spec``."""
        state.reported = target
        if target > 0:
            self._reported.add(spec)
        else:
            self._reported.discard(spec)
        try:
            state.delegated = bool(self.backend.keep_warm(spec, target))
        except Exception as exc:  # a hint: a backend bug must not fail an acquire
            state.delegated = False
            self.metrics.count("keep_warm_errors")
            warnings.warn(f"{type(self.backend).__name__}.keep_warm raised {exc!r}; the "
                          "pool warms that spec itself", RuntimeWarning, stacklevel=2)

    def _kick(self, spec: SandboxSpec) -> None:
        state = self._state(spec)
        if self._closed:
            return
        self._report_target(spec, state)
        if state.delegated or (state.filler is not None and not state.filler.done()):
            return
        if self._short_of_target(spec, state):
            state.filler = asyncio.ensure_future(self._fill(spec))

    async def _fill(self, spec: SandboxSpec) -> None:
        state = self._state(spec)
        failures = 0
        while not self._closed and not state.delegated and self._short_of_target(spec, state):
            if self.max_sandboxes is not None and self.live >= self.max_sandboxes:
                return
            if not self._no_urgent_creates.is_set():
                # The sandboxes acquires wait for first (a first wave): a cluster starts
                # pods in the order they come. Then look at the target again.
                await self._no_urgent_creates.wait()
                continue
            state.filling += 1
            try:
                with creating_ahead_of_need():  # nobody waits: backends may run it niced
                    sandbox = await self._create(spec)
            except RollboxError as error:
                # A speculative create failed: count it (``_create`` counted a sandbox
                # error already) and wake an acquire that waited for it, which then
                # creates itself and meets the error, if it lasts, as its own.
                state.filling -= 1
                if not isinstance(error, SandboxError | PoolClosedError):
                    self.metrics.failure(error)
                await self._notify_room()
                failures += 1
                if failures >= 3:
                    return
                await asyncio.sleep(0.1 * 2**failures)
                continue
            except BaseException:
                state.filling -= 1
                raise
            state.filling -= 1
            self._park(sandbox, spec)
            await self._notify_room()


