"""The server's metrics: a pool ``Metrics`` that stays small however long the server
runs, and its Prometheus text (``GET /metrics``), written without prometheus-client."""

from __future__ import annotations

import asyncio
import math
import time
from typing import TYPE_CHECKING

from rollbox.metrics import Metrics, percentile

if TYPE_CHECKING:
    from rollbox_serve.server import Server

WINDOW = 10_000


class WindowMetrics(Metrics):
    """Latency quantiles over the last ``window`` samples of each name; counts and sums
    over the server's whole life."""

    def __init__(self, window: int = WINDOW) -> None:
        super().__init__()
        self.window = window
        self.totals: dict[str, tuple[int, float]] = {}

    def observe(self, name: str, seconds: float) -> None:
        samples = self.samples.setdefault(name, [])
        samples.append(seconds)
        if len(samples) > 2 * self.window:
            del samples[: len(samples) - self.window]
        count, total = self.totals.get(name, (0, 0.0))
        self.totals[name] = (count + 1, total + seconds)


def render_metrics(server: Server) -> str:
    lines: list[str] = []

    def metric(name: str, kind: str, help_text: str,
               values: list[tuple[dict[str, str], float]]) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, value in values:
            text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
            lines.append(f"{name}{{{text}}} {_number(value)}" if text
                         else f"{name} {_number(value)}")

    now = asyncio.get_running_loop().time()
    held = list(server.registry.held.values())
    metric("rollbox_serve_sandboxes_held", "gauge", "Sandboxes clients hold",
           [({}, len(held))])
    metric("rollbox_serve_sandboxes_busy", "gauge", "Held sandboxes with a request running",
           [({}, sum(1 for h in held if h.busy))])
    metric("rollbox_serve_sandboxes_idle", "gauge", "Warm sandboxes in the pool, ready",
           [({}, server.pool.idle_count())])
    metric("rollbox_serve_clients", "gauge", "Clients with warm targets or hints",
           [({}, len(server.policy.clients))])
    metric("rollbox_serve_oldest_idle_seconds", "gauge", "Longest a held sandbox sat idle",
           [({}, max((now - h.last_used for h in held if not h.busy), default=0.0))])
    metric("rollbox_serve_uptime_seconds", "gauge", "Seconds since the server started",
           [({}, time.time() - server.started_at)])
    metric("rollbox_serve_requests_total", "counter", "Requests answered, by route and status",
           [({"route": r, "status": str(s)}, n) for (r, s), n in sorted(server.requests.items())])
    metrics = server.metrics
    failures = metrics.failures_by_kind()
    metric("rollbox_pool_events_total", "counter",
           "Pool events: creations, reuses, resets, quarantined, closed, reaped, ...",
           [({"event": k}, v) for k, v in sorted(metrics.counters.items())
            if not k.startswith("failures.")])
    metric("rollbox_pool_failures_total", "counter", "Sandbox failures, by kind",
           [({"kind": k}, v) for k, v in sorted(failures.items())])
    lines.append("# HELP rollbox_pool_latency_seconds Pool latencies (ttfc, queue_wait, "
                 "create, reset, exec); quantiles over the latest samples")
    lines.append("# TYPE rollbox_pool_latency_seconds summary")
    totals = metrics.totals if isinstance(metrics, WindowMetrics) else {}
    for name in sorted(metrics.samples):
        ordered = sorted(metrics.samples[name])
        for q in (0.5, 0.9, 0.99):
            lines.append(f'rollbox_pool_latency_seconds{{name="{name}",quantile="{q}"}} '
                         f"{_number(percentile(ordered, q * 100))}")
        count, total = totals.get(name, (len(ordered), sum(ordered)))
        lines.append(f'rollbox_pool_latency_seconds_count{{name="{name}"}} {count}')
        lines.append(f'rollbox_pool_latency_seconds_sum{{name="{name}"}} {_number(total)}')
    return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    return repr(value) if isinstance(value, float) else str(value)
