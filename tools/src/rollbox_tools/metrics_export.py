"""Prometheus metrics and OpenTelemetry spans, each behind an optional extra.

Importing this module imports neither package; constructing an exporter does, and
raises ``MissingExtraError`` naming the install command when the package is absent.
Both exporters are pluggy plugins: ``pm.register(PrometheusExporter())`` and pass ``pm``
to the pool (``Pool(backend, plugin_manager=pm)``: its creations and failures, and the
rollouts run over it) or to a run (``run_rollouts(..., plugin_manager=pm)``); they observe
through the hook specification.

    uv sync --inexact --extra prometheus   # PrometheusExporter, in a checkout
    uv sync --inexact --extra otel         # OtelSpans
    (once published: pip install "rollbox[prometheus]", "rollbox[otel]")
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from rollbox.errors import MissingExtraError, SandboxError
from rollbox.hookspecs import hookimpl
from rollbox.metrics import Metrics
from rollbox.results import RolloutResult
from rollbox.spec import SandboxSpec

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
            120.0, 300.0, 600.0)


class PrometheusExporter:
    """Rollout outcomes, attempts and durations, sandbox creations and failures, and
    snapshots of a pool's ``Metrics`` (``export(metrics)``), as Prometheus metrics."""

    def __init__(self, registry: CollectorRegistry | None = None,
                 namespace: str = "rollbox") -> None:
        try:
            import prometheus_client as prom
        except ImportError:
            raise MissingExtraError("Prometheus metrics", "prometheus") from None
        self.registry = registry if registry is not None else prom.REGISTRY
        kw: dict[str, Any] = {"namespace": namespace, "registry": self.registry}
        self.rollouts = prom.Counter("rollouts", "Rollouts that ended, by outcome and kind",
                                     ["outcome", "kind"], **kw)
        self.attempts = prom.Counter("rollout_attempts", "Attempts spent on rollouts", **kw)
        self.rollout_seconds = prom.Histogram("rollout_duration_seconds",
                                              "Rollout duration, all attempts included",
                                              buckets=_BUCKETS, **kw)
        self.creations = prom.Counter("sandbox_creations", "Sandboxes created by pools", **kw)
        self.create_seconds = prom.Histogram("sandbox_create_seconds", "Sandbox create time",
                                             buckets=_BUCKETS, **kw)
        self.failures = prom.Counter("sandbox_failures", "Sandbox failures counted by pools",
                                     ["kind"], **kw)
        self.latency = prom.Gauge("latency_seconds", "Latency summaries of a pool's Metrics",
                                  ["name", "stat"], **kw)
        self.counters = prom.Gauge("pool_counter", "Counters of a pool's Metrics",
                                   ["name"], **kw)

    @hookimpl
    def rollbox_rollout_finished(self, result: RolloutResult) -> None:
        failure = result.failure
        self.rollouts.labels("succeeded" if failure is None else "failed",
                             "" if failure is None else failure.kind).inc()
        self.attempts.inc(result.attempts)
        self.rollout_seconds.observe(result.duration_s)

    @hookimpl
    def rollbox_sandbox_created(self, sandbox_id: str, spec: SandboxSpec, seconds: float) -> None:
        self.creations.inc()
        self.create_seconds.observe(seconds)

    @hookimpl
    def rollbox_sandbox_failed(self, error: SandboxError, spec: SandboxSpec) -> None:
        self.failures.labels(error.kind).inc()

    def export(self, metrics: Metrics) -> None:
        """Publish the current summaries (mean/p50/p99/max) and counters of ``metrics``."""
        for name in metrics.samples:
            summary = metrics.summary(name)
            for stat in ("mean", "p50", "p99", "max"):
                self.latency.labels(name, stat).set(getattr(summary, stat))
        for name, value in metrics.counters.items():
            self.counters.labels(name).set(value)


class OtelSpans:
    """Spans of a run: one per finished rollout (``rollbox.rollout``, its outcome as
    attributes, an error status on failure), one per sandbox a pool created
    (``rollbox.sandbox.create``, as long as the create took) and one per sandbox failure
    a pool counted (``rollbox.sandbox.failure``, an error status, the error's kind)."""

    def __init__(self, tracer_provider: Any = None) -> None:
        try:
            from opentelemetry import trace
        except ImportError:
            raise MissingExtraError("OpenTelemetry spans", "otel") from None
        self._trace = trace
        self.tracer = trace.get_tracer("rollbox", tracer_provider=tracer_provider)

    @hookimpl
    def rollbox_rollout_finished(self, result: RolloutResult) -> None:
        end = time.time_ns()
        start = end - int(result.duration_s * 1e9)
        attributes: dict[str, str | int | float | bool] = {
            "rollbox.task_id": result.task_id,
            "rollbox.rollout_index": result.index,
            "rollbox.attempts": result.attempts,
            "rollbox.ok": result.ok,
        }
        if result.reward is not None:
            attributes["rollbox.reward"] = result.reward
        if result.failure is not None:
            attributes["rollbox.failure_kind"] = result.failure.kind
            attributes["rollbox.retryable"] = result.failure.retryable
        span = self.tracer.start_span("rollbox.rollout", start_time=start, attributes=attributes)
        if result.failure is not None:
            span.set_status(self._error(result.failure.message))
        span.end(end_time=end)

    @hookimpl
    def rollbox_sandbox_created(self, sandbox_id: str, spec: SandboxSpec, seconds: float) -> None:
        end = time.time_ns()
        span = self.tracer.start_span(
            "rollbox.sandbox.create", start_time=end - int(seconds * 1e9),
            attributes={"rollbox.sandbox_id": sandbox_id, "rollbox.image": spec.image},
        )
        span.end(end_time=end)

    @hookimpl
    def rollbox_sandbox_failed(self, error: SandboxError, spec: SandboxSpec) -> None:
        attributes: dict[str, str | bool] = {
            "rollbox.failure_kind": error.kind, "rollbox.retryable": error.retryable,
            "rollbox.image": spec.image,
        }
        if error.sandbox_id is not None:
            attributes["rollbox.sandbox_id"] = error.sandbox_id
        span = self.tracer.start_span("rollbox.sandbox.failure", attributes=attributes)
        span.set_status(self._error(error.message))
        span.end()

    def _error(self, message: str) -> Any:
        return self._trace.Status(self._trace.StatusCode.ERROR, message)
