"""The scale burst of benchmarks/bench_kubernetes_scale.py at CI size (250 tasks x 4
rollouts) on fresh real control planes with ten kwok nodes: rollbox, upstream's SDK and
raw pods each account for every rollout, and rollbox stays within the issue's goals
(creations and API writes per rollout are counts, not timings). Then 100 x 4 with an
image per task that the nodes pull (``--pulls``): rollbox planning its images, raw pods
pulling on demand. The numbers are printed for docs/benchmarks.md."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType

import pytest
from rollbox_kubernetes.testing.fixtures import ClusterAccess

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_kubernetes_scale.py"


def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_kubernetes_scale", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_250_x_4_burst_on_ten_nodes(k8s_cluster: ClusterAccess,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    k8s_cluster.require_plane()  # its own clusters, from the same binaries
    tasks = int(os.environ.get("ROLLBOX_SCALE_TASKS", "250"))
    results = {r["arm"]: r for r in bench().main(["--tasks", str(tasks), "--rollouts", "4"])}
    with capsys.disabled():
        print()
        print(bench().table(list(results.values())))
    for arm, result in results.items():
        assert result["accounted"], arm
        assert result["succeeded"] + result["failed"] == tasks * 4, arm
        assert result["left_after_burst"] == 0, arm
    rollbox = results["rollbox"]
    assert rollbox["failed"] == 0, rollbox["failed_by_kind"]
    # One sandbox per task, reused by reset across its rollouts. A sandbox that failed to
    # come up (counted by the pool: a pod the node agent could not start in time on a
    # loaded machine) is replaced, which is right, and costs a creation; any other
    # creation past one per task is the policy's, and fails this.
    replaced = sum(rollbox["pool"]["sandbox_failures"].values())
    most = (tasks + replaced) / (tasks * 4)  # 0.25 when nothing failed
    assert rollbox["creations_per_rollout"] <= most + 1e-4, rollbox["pool"]
    assert rollbox["workload_writes_per_rollout"] <= 1.5, rollbox["pool"]


def test_a_100_x_4_burst_with_pulls_on_ten_nodes(k8s_cluster: ClusterAccess,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    k8s_cluster.require_plane()
    tasks = int(os.environ.get("ROLLBOX_SCALE_PULL_TASKS", "100"))
    results = {r["arm"]: r for r in bench().main(
        ["--tasks", str(tasks), "--rollouts", "4", "--pulls", "--lead", "10"])}
    with capsys.disabled():
        print()
        print(bench().table(list(results.values())))
        for arm, result in results.items():
            print(arm, {k: result[k] for k in ("critical_path_pulls", "pull_wait_s",
                                               "planning")})
    for arm, result in results.items():
        assert result["accounted"], arm
        assert result["succeeded"] + result["failed"] == tasks * 4, arm
        assert result["left_after_burst"] == 0, arm
    rollbox, pods = results["rollbox"], results["pods"]
    assert rollbox["failed"] == 0, rollbox["failed_by_kind"]
    planning = rollbox["planning"]
    # With a step of lead, images are prepulled (none failed) and few if any of
    # rollbox's sandbox pods wait for a pull (none here), against nearly every raw pod
    # (about 380 of 400): counts, not timings.
    assert planning.get("prepull_failures", 0) == 0, planning
    assert planning.get("prepulled", 0) >= tasks // 2, planning
    assert rollbox["critical_path_pulls"] * 4 <= pods["critical_path_pulls"], (rollbox, pods)
    replaced = sum(rollbox["pool"]["sandbox_failures"].values())
    assert rollbox["creations_per_rollout"] <= (tasks + replaced) / (tasks * 4) + 1e-4, (
        rollbox["pool"])
