"""The Prometheus and OpenTelemetry exporters on a real run: local sandboxes created,
a create that fails (an image that does not exist), rollouts that succeed and fail."""

from __future__ import annotations

import pytest
from rollbox import Pool, SandboxSpec
from rollbox.envs import Task
from rollbox.plugins import get_plugin_manager
from rollbox.results import RolloutOutput
from rollbox.runner import RetryPolicy, run_rollouts
from rollbox.sandbox import Sandbox
from rollbox_local import LocalBackend
from rollbox_tools.metrics_export import OtelSpans, PrometheusExporter

pytest.importorskip("prometheus_client")
pytest.importorskip("opentelemetry.sdk")

ROLLOUTS = 2


async def rollout(sandbox: Sandbox, task: Task, index: int) -> RolloutOutput:
    result = await sandbox.exec("echo ok")
    return RolloutOutput(1.0 if result.text == "ok\n" else 0.0)


async def test_exporters_show_creations_failures_and_rollouts(backend: LocalBackend) -> None:
    import prometheus_client as prom
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    registry = prom.CollectorRegistry()
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    pm = get_plugin_manager(load_entrypoints=False)
    pm.register(PrometheusExporter(registry=registry))
    pm.register(OtelSpans(tracer_provider=provider))
    tasks = [Task(id="good-a", spec=SandboxSpec(image="host", env={"T": "a"})),
             Task(id="good-b", spec=SandboxSpec(image="host", env={"T": "b"})),
             Task(id="missing", spec=SandboxSpec(image="/nonexistent/rollbox-image"))]

    async with Pool(backend, plugin_manager=pm) as pool:
        report = await run_rollouts(pool, tasks, ROLLOUTS, rollout, concurrency=2,
                                    retry=RetryPolicy(max_attempts=1))

    assert report.accounted and report.succeeded == 4 and report.failed == 2
    created = int(pool.metrics.counters["creations"])
    assert created >= 2
    value = registry.get_sample_value
    assert value("rollbox_sandbox_creations_total") == created
    assert value("rollbox_sandbox_create_seconds_count") == created
    assert value("rollbox_sandbox_failures_total", {"kind": "image_not_found"}) == ROLLOUTS
    assert value("rollbox_rollouts_total", {"outcome": "succeeded", "kind": ""}) == 4
    assert value("rollbox_rollouts_total",
                 {"outcome": "failed", "kind": "image_not_found"}) == ROLLOUTS

    spans = memory.get_finished_spans()
    names = [s.name for s in spans]
    assert names.count("rollbox.sandbox.create") == created
    assert names.count("rollbox.sandbox.failure") == ROLLOUTS
    assert names.count("rollbox.rollout") == len(tasks) * ROLLOUTS
    failure = next(s for s in spans if s.name == "rollbox.sandbox.failure")
    assert failure.attributes is not None
    assert failure.attributes["rollbox.failure_kind"] == "image_not_found"
