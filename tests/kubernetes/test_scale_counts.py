"""How benchmarks/bench_kubernetes_scale.py counts an audit log: a create answered 409
(the controller's second try at a pod its cache had not shown it yet, a client's retry
of a create whose answer was lost) is a write, not a creation."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_kubernetes_scale.py"


def _event(user: str, verb: str, resource: str, code: int) -> dict[str, Any]:
    return {"user": {"username": user}, "verb": verb, "objectRef": {"resource": resource},
            "responseStatus": {"code": code}, "requestReceivedTimestamp": "2026-12-03T07:17:25Z"}


def test_a_create_answered_409_is_a_write_not_a_creation() -> None:
    spec = importlib.util.spec_from_file_location("bench_kubernetes_scale", SCRIPT)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    workload, controller = bench.WORKLOAD_USER, "agent-sandbox-controller"
    events = [_event(workload, "create", "sandboxes", 201),
              _event(workload, "create", "sandboxes", 409),  # a retry: it existed
              _event(controller, "create", "pods", 201),
              _event(controller, "create", "pods", 409),
              _event(workload, "create", "pods", 201),
              _event(workload, "delete", "sandboxes", 200)]
    counts = bench.audit_counts(events, rollouts=4)
    assert counts["sandbox_creations"] == 1 and counts["pod_creations"] == 2
    assert counts["creations_per_rollout"] == 0.5  # one Sandbox, one bare pod
    assert counts["workload_writes_per_rollout"] == 1.0  # all four of its writes
