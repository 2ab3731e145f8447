"""Warm-pool policies beyond the basic ones in ``rollbox.pool``.

``none`` and ``static`` live in ``rollbox.pool``; ``lookahead`` lives here. All three are
registered by core through ``rollbox_register_pool_policies``. The interface a policy
implements is ``rollbox.pool.PoolPolicy`` plus, optionally, ``in_flight`` (see
``InFlightAware``); docs/pool-policies.md explains both.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

from rollbox.errors import UsageError
from rollbox.pool import NoPoolPolicy, PoolPolicy, StaticPoolPolicy
from rollbox.spec import SandboxSpec

__all__ = ["InFlightAware", "LookaheadPolicy", "NoPoolPolicy", "StaticPoolPolicy"]


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
        self._want: dict[SandboxSpec, int] = {}

    def in_flight(self, counts: Mapping[SandboxSpec, int]) -> None:
        self._busy = dict(counts)
        self._plan()

    def upcoming(self, specs: Sequence[SandboxSpec]) -> None:
        self._upcoming = Counter(specs)
        self._order = list(dict.fromkeys(specs))
        self._plan()

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
        self._want = want

    def warm_target(self, spec: SandboxSpec) -> int:
        return self._want.get(spec, 0)

    def max_idle(self, spec: SandboxSpec) -> int:
        return self.per_spec if self._upcoming[spec] > 0 else 0

    @property
    def planned(self) -> int:
        """Warm sandboxes the current plan asks for, across specs (≤ ``budget``)."""
        return sum(self._want.values())
