"""Prometheus and OpenTelemetry exporters behind optional extras."""

from __future__ import annotations

import subprocess
import sys

import pytest
from rollbox.envs import Task
from rollbox.errors import MissingExtraError
from rollbox.plugins import get_plugin_manager
from rollbox.pool import Pool
from rollbox.results import RolloutOutput
from rollbox.runner import run_rollouts
from rollbox.sandbox import Sandbox
from rollbox.spec import SandboxSpec
from rollbox.testing.fake import FakeBackend
from rollbox_tools.metrics_export import OtelSpans, PrometheusExporter


async def half_fail(sandbox: Sandbox, task: Task, index: int) -> RolloutOutput:
    if index % 2:
        raise ValueError("nope")
    await sandbox.exec("true")
    return RolloutOutput(1.0)


TASKS = [Task(id=f"t{i}", spec=SandboxSpec()) for i in range(2)]


def test_no_import_cost_without_use() -> None:
    code = ("import sys, rollbox_tools.metrics_export, rollbox.runner, rollbox_bench.cli;"
            "print(any(m in sys.modules for m in "
            "('prometheus_client', 'opentelemetry', 'matplotlib')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(("cls", "module", "extra"), [
    (PrometheusExporter, "prometheus_client", "prometheus"),
    (OtelSpans, "opentelemetry", "otel"),
])
def test_missing_package_names_the_extra(monkeypatch: pytest.MonkeyPatch, cls: type,
                                         module: str, extra: str) -> None:
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(MissingExtraError, match=rf'pip install "rollbox\[{extra}\]"') as missing:
        cls()
    assert f"uv sync --inexact --extra {extra}" in missing.value.message  # in a checkout


async def test_prometheus_counts_rollouts() -> None:
    prom = pytest.importorskip("prometheus_client")
    registry = prom.CollectorRegistry()
    exporter = PrometheusExporter(registry=registry)
    pm = get_plugin_manager(load_entrypoints=False)
    pm.register(exporter)
    async with Pool(FakeBackend()) as pool:
        await run_rollouts(pool, TASKS, 4, half_fail, plugin_manager=pm)
        exporter.export(pool.metrics)
    value = registry.get_sample_value
    assert value("rollbox_rollouts_total", {"outcome": "succeeded", "kind": ""}) == 4
    assert value("rollbox_rollouts_total", {"outcome": "failed", "kind": "rollout_error"}) == 4
    assert value("rollbox_rollout_attempts_total") == 8
    assert value("rollbox_pool_counter", {"name": "creations"}) is not None
    assert value("rollbox_latency_seconds", {"name": "ttfc", "stat": "max"}) is not None


async def test_otel_spans_per_rollout() -> None:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import StatusCode

    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    pm = get_plugin_manager(load_entrypoints=False)
    pm.register(OtelSpans(tracer_provider=provider))
    async with Pool(FakeBackend()) as pool:
        await run_rollouts(pool, TASKS, 2, half_fail, plugin_manager=pm)
    spans = memory.get_finished_spans()
    assert len(spans) == 4 and {s.name for s in spans} == {"rollbox.rollout"}
    failed = [s for s in spans if s.status.status_code is StatusCode.ERROR]
    assert len(failed) == 2
    assert failed[0].attributes is not None
    assert failed[0].attributes["rollbox.failure_kind"] == "rollout_error"
