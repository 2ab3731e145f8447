"""Whole simulated runs, small: every rollout accounted, and the arms differ as their
design says; ``rollbox simulate`` and ``rollbox simulate plan`` from the command line."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from rollbox.errors import UsageError
from rollbox_sim import PRESETS, Scenario
from rollbox_sim.experiment import run_scenario

SMALL = dataclasses.replace(
    PRESETS["r2e-4578x4"],
    workload=dataclasses.replace(PRESETS["r2e-4578x4"].workload, images=96,
                                 tasks_per_step=32),
    cluster=dataclasses.replace(PRESETS["r2e-4578x4"].cluster, nodes=3, disk_gb=60.0))
"""Three steps of 32 tasks on 3 nodes whose disks hold less than the corpus."""


@pytest.fixture(scope="module")
def report() -> dict[str, object]:
    return run_scenario(SMALL)


def test_every_rollout_is_accounted_in_every_arm(report: dict) -> None:
    for arm, result in report["arms"].items():
        assert result["rollouts"] == {"requested": 384, "succeeded": 384, "failed": 0,
                                      "accounted": True}, arm


def test_the_corpus_does_not_fit_and_gc_makes_room(report: dict) -> None:
    assert report["scenario"]["corpus_gb"] > report["scenario"]["cluster_disk_gb"]
    assert all(r["evictions"] > 0 for r in report["arms"].values())


def test_rollbox_reuses_and_hydrates_ahead(report: dict) -> None:
    base, warm, ours = (report["arms"][a] for a in ("baseline", "warm", "rollbox"))
    assert base["creations"] == warm["creations"] == 384  # one per rollout
    assert ours["creations"] <= 96 * 1.05  # one per task, reset in place between rollouts
    assert base["critical_path_pulls"] > 0 and ours["critical_path_pulls"] == 0
    assert ours["ttfc_s"]["max"] * 10 <= base["ttfc_s"]["max"]
    assert ours["accelerator_idle_fraction"] < base["accelerator_idle_fraction"]
    assert ours["api_writes"] < base["api_writes"]


def test_a_run_is_deterministic_for_its_seed(report: dict) -> None:
    again = run_scenario(SMALL, arms=("rollbox",))
    assert again["arms"]["rollbox"]["ttfc_samples"] == report["arms"]["rollbox"]["ttfc_samples"]


def test_settings_change_the_model_and_bad_ones_are_refused() -> None:
    changed = Scenario().with_settings({"cluster.api_qps": "50", "workload.think": "2,0.1"})
    assert changed.cluster.api_qps == 50.0 and changed.workload.think.median == 2.0
    with pytest.raises(UsageError, match="no parameter"):
        Scenario().with_settings({"cluster.warp": "9"})
    with pytest.raises(UsageError, match="not a number"):
        Scenario().with_settings({"cluster.nodes": "ten"})


def _rollbox(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rollbox", "simulate", *args],
                          capture_output=True, text=True, timeout=300)


def test_the_command_prints_the_table_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "sim.json"
    done = _rollbox("--images", "32", "--set", "workload.tasks_per_step=16", "--quiet",
                    "--json", str(out))
    assert done.returncode == 0, done.stderr
    assert "TTFC = time to first command" in done.stdout
    assert "lower is better" in done.stdout and "sooner than the baseline's" in done.stdout
    report = json.loads(out.read_text())
    for arm in ("baseline", "warm", "rollbox"):
        result = report["arms"][arm]
        assert set(result["ttfc_s"]) == {"mean", "p50", "p99", "max"}
        assert {"creations", "api_writes", "critical_path_pulls",
                "accelerator_idle_fraction"} <= set(result)
        assert result["rollouts"]["accounted"]


def test_a_bad_setting_is_a_clear_error() -> None:
    done = _rollbox("--set", "cluster.warp=9")
    assert done.returncode != 0 and "no parameter 'warp'" in done.stderr


def test_plan_finds_the_cheapest_cluster_and_says_what_binds() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "rollbox", "simulate", "plan", "--images", "64", "--image-gb",
         "2", "--target-max-ttfc", "10", "--tasks-per-step", "32", "--steps", "2",
         "--max-nodes", "8", "--max-disk-gb", "400", "--disk-step-gb", "100"],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "cheapest:" in done.stdout and "binding:" in done.stdout
