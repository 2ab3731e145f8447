"""Warm-pool policies: how many sandboxes a pool keeps warm and whether it reuses them.

``PoolPolicy`` is the interface (docs/pool-policies.md); ``none``, ``static`` and
``lookahead`` are registered by core through ``rollbox_register_pool_policies``. A policy
may also implement ``in_flight`` (see ``InFlightAware``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import ClassVar, Protocol, runtime_checkable

from rollbox.errors import UsageError
from rollbox.spec import SandboxSpec

__all__ = ["InFlightAware", "LookaheadPolicy", "NoPoolPolicy", "PoolPolicy", "StaticPoolPolicy"]


class PoolPolicy:
    """Decides how many sandboxes a pool keeps warm and whether it reuses them.

    Subclass and register through ``rollbox_register_pool_policies``. Methods are
    synchronous and cheap; the pool calls them often.
    """

    name: ClassVar[str] = "base"
    reuse: ClassVar[bool] = True
    counts_leased: ClassVar[bool] = False
    """True: ``warm_target`` counts leased sandboxes too (a pool of fixed size whose
    members come back by reset); False: it counts idle ones only (ready on demand)."""

    def warm_target(self, spec: SandboxSpec) -> int:
        """How many idle sandboxes of ``spec`` the filler should keep ready."""
        return 0

    def max_idle(self, spec: SandboxSpec) -> int:
        """How many idle sandboxes of ``spec`` a release may keep (more are closed)."""
        return 1_000_000

    def upcoming(self, specs: Sequence[SandboxSpec]) -> None:
        """Hint: specs that will be acquired next, soonest first (lookahead policies)."""

    def warm_specs(self, specs: Iterable[SandboxSpec]) -> Iterable[SandboxSpec]:
        """Those of ``specs`` whose ``warm_target`` may be above 0 (the pool looks only
        at these after a hint). The default is all of them; a policy that knows which
        it warms says so, and a hint over thousands of specs stays cheap."""
        return specs


class NoPoolPolicy(PoolPolicy):
    """The baseline: create per acquire, close on release, keep nothing warm."""

    name = "none"
    reuse = False

    def max_idle(self, spec: SandboxSpec) -> int:
        return 0


class StaticPoolPolicy(PoolPolicy):
    """``size`` sandboxes per spec that has been asked for, reused by reset: leased ones
    count, so handing one out does not start a create that its return would make
    surplus."""

    name = "static"
    counts_leased = True

    def __init__(self, size: int = 4, specs: Iterable[SandboxSpec] = ()) -> None:
        self.size = size
        self.specs = set(specs)

    def warm_target(self, spec: SandboxSpec) -> int:
        return self.size

    def max_idle(self, spec: SandboxSpec) -> int:
        return max(self.size, 1)


@runtime_checkable
class InFlightAware(Protocol):
    """Optional policy method the runner calls before each ``pool.upcoming``.

    ``counts`` maps a spec to the rollouts of it in flight right now (leased, or being
    released). A policy uses it so it does not warm a sandbox for an acquisition that a
    sandbox in flight will serve by reset.
    """

    def in_flight(self, counts: Mapping[SandboxSpec, int]) -> None: ...


class LookaheadPolicy(PoolPolicy):
    """Warm what the runner's queue says comes next; keep what will be reused.

    * ``upcoming(specs)``: the pending acquisitions, soonest first (one entry per
      rollout). The pool forwards the images to ``backend.hint_upcoming`` so the image
      store hydrates them ahead of need.
    * warm target of a spec: how many of its upcoming acquisitions (at most
      ``per_spec``) no in-flight sandbox will serve, for the first specs of the queue,
      until ``budget`` warm sandboxes are planned. Nothing else is warmed.
    * ``max_idle``: a released sandbox is reset and kept only if its spec is still
      upcoming (the task's next rollout); otherwise it is closed, which also unpins its
      image in the store.
    """

    name = "lookahead"
    reuse = True

    def __init__(self, budget: int = 8, per_spec: int = 1) -> None:
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
            raise UsageError(f"lookahead budget must be an int >= 0, got {budget!r}")
        if isinstance(per_spec, bool) or not isinstance(per_spec, int) or per_spec < 1:
            raise UsageError(f"lookahead per_spec must be an int >= 1, got {per_spec!r}")
        self.budget = budget
        self.per_spec = per_spec
        self._upcoming: Counter[SandboxSpec] = Counter()
        self._order: list[SandboxSpec] = []
        self._busy: dict[SandboxSpec, int] = {}
        self._wanted: dict[SandboxSpec, int] = {}
        self._stale = False  # the plan waits for its next reader (in_flight, then upcoming)

    def in_flight(self, counts: Mapping[SandboxSpec, int]) -> None:
        self._busy = dict(counts)
        self._stale = True

    def upcoming(self, specs: Sequence[SandboxSpec]) -> None:
        self._upcoming = Counter(specs)
        self._order = list(self._upcoming)  # first appearance order: soonest first
        self._stale = True

    def warm_specs(self, specs: Iterable[SandboxSpec]) -> Iterable[SandboxSpec]:
        return self._want.keys()

    @property
    def _want(self) -> dict[SandboxSpec, int]:
        if self._stale:
            self._stale = False
            self._plan()
        return self._wanted

    def _plan(self) -> None:
        want: dict[SandboxSpec, int] = {}
        planned = 0
        for spec in self._order:
            if planned >= self.budget:
                break
            need = min(self.per_spec, self._upcoming[spec]) - self._busy.get(spec, 0)
            if need > 0:
                want[spec] = min(need, self.budget - planned)
                planned += want[spec]
        self._wanted = want

    def warm_target(self, spec: SandboxSpec) -> int:
        return self._want.get(spec, 0)

    def max_idle(self, spec: SandboxSpec) -> int:
        return self.per_spec if self._upcoming[spec] > 0 else 0

    @property
    def planned(self) -> int:
        """Warm sandboxes the current plan asks for, across specs (≤ ``budget``)."""
        return sum(self._want.values())
