"""Latency samples and counters, summarised as text or JSON.

Names used by core: latencies ``ttfc`` (acquire requested → first command's result),
``queue_wait`` (acquire requested → sandbox handed out), ``create``, ``reset``,
``exec``, ``hydration``; counters ``creations``, ``reuses``, ``resets``,
``quarantined``, ``closed``, ``mutations`` and ``failures.<kind>``.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from rollbox.errors import RollboxError


@dataclass(frozen=True)
class Summary:
    count: int
    mean: float
    p50: float
    p90: float
    p99: float
    max: float

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100) of an already sorted list."""
    if not sorted_values:
        return math.nan
    pos = (len(sorted_values) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def summarize(values: list[float]) -> Summary:
    ordered = sorted(values)
    if not ordered:
        return Summary(0, math.nan, math.nan, math.nan, math.nan, math.nan)
    return Summary(
        count=len(ordered),
        mean=sum(ordered) / len(ordered),
        p50=percentile(ordered, 50),
        p90=percentile(ordered, 90),
        p99=percentile(ordered, 99),
        max=ordered[-1],
    )


class Metrics:
    """Collects samples (seconds) and counters. Not thread-safe; one per event loop."""

    def __init__(self) -> None:
        self.samples: dict[str, list[float]] = {}
        self.counters: Counter[str] = Counter()

    def observe(self, name: str, seconds: float) -> None:
        self.samples.setdefault(name, []).append(seconds)

    def count(self, name: str, n: int = 1) -> None:
        self.counters[name] += n

    def failure(self, error: RollboxError) -> None:
        self.counters[f"failures.{error.kind}"] += 1

    def failures_by_kind(self) -> dict[str, int]:
        prefix = "failures."
        return {k[len(prefix):]: v for k, v in self.counters.items() if k.startswith(prefix)}

    def summary(self, name: str) -> Summary:
        return summarize(self.samples.get(name, []))

    def as_dict(self) -> dict[str, Any]:
        return {
            "latency_s": {name: self.summary(name).as_dict() for name in sorted(self.samples)},
            "counters": dict(sorted(self.counters.items())),
        }

    def report(self) -> str:
        lines = [f"{'latency':<12}{'count':>8}{'mean ms':>10}{'p50 ms':>10}{'p99 ms':>10}"
                 f"{'max ms':>10}"]
        for name in sorted(self.samples):
            s = self.summary(name)
            lines.append(f"{name:<12}{s.count:>8}{s.mean*1e3:>10.2f}{s.p50*1e3:>10.2f}"
                         f"{s.p99*1e3:>10.2f}{s.max*1e3:>10.2f}")
        for name, value in sorted(self.counters.items()):
            lines.append(f"{name:<30}{value:>8}")
        return "\n".join(lines)
