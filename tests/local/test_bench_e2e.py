"""``rollbox bench`` end to end on the local backend: real images, real sandboxes, both
arms, with and without chaos. Checks accounting and the JSON's shape, never timings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from rollbox import cli

pytestmark = pytest.mark.slow

IMAGES, ROLLOUTS = 3, 2
SMALL = ["--backend", "local", "--images", str(IMAGES), "--rollouts", str(ROLLOUTS),
         "--concurrency", "2", "--padding-mb", "0.0625", "--think-ms", "5", "--quiet"]
ARM_KEYS = {"policy", "rollouts", "ttfc_s", "ttfc_samples_s", "latency_s", "creations",
            "creations_per_rollout", "resets", "reuses", "evictions", "quarantined",
            "pool_failures_by_kind", "chaos_injected", "attempts", "masked_groups",
            "mean_reward", "leaked_sandboxes", "leftovers", "image_store", "rss_bytes",
            "warmup_s", "wall_s"}


def run_cli(state_dir: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    out = state_dir / "report.json"
    code = cli.main(["bench", *SMALL, "--workdir", str(state_dir / "bench"),
                     "--json", str(out), *extra])
    report = json.loads(out.read_text(), parse_constant=lambda c: pytest.fail(f"{c} in JSON"))
    return code, report


def check_shape_and_accounting(report: dict[str, Any]) -> None:
    assert set(report) == {"workload", "arms", "ratios"}
    assert report["workload"]["rollouts"] == IMAGES * ROLLOUTS
    assert report["workload"]["think_s"] == pytest.approx(0.005)
    assert set(report["arms"]) == {"baseline", "rollbox"}
    assert set(report["ratios"]) == {"ttfc_mean", "ttfc_p50", "ttfc_p99", "ttfc_max",
                                     "creations", "wall"}
    for arm, data in report["arms"].items():
        assert set(data) >= ARM_KEYS, f"{arm} misses {ARM_KEYS - set(data)}"
        rollouts = data["rollouts"]
        assert rollouts["requested"] == IMAGES * ROLLOUTS
        assert rollouts["succeeded"] + rollouts["failed"] == rollouts["requested"]
        assert sum(rollouts["failed_by_kind"].values()) == rollouts["failed"]
        assert rollouts["accounted"] is True
        assert data["leaked_sandboxes"] == 0
        assert data["leftovers"] == []  # no sandbox, directory or bwrap process left
        assert set(data["ttfc_s"]) >= {"mean", "p50", "p99", "max"}
        assert len(data["ttfc_samples_s"]) == data["ttfc_s"]["count"]
        assert data["rss_bytes"]["peak"] > 0
        assert data["image_store"]["hydrations"] >= 1  # each arm starts with a cold store


def test_bench_on_real_sandboxes(state_dir: Path) -> None:
    code, report = run_cli(state_dir)
    assert code == 0
    check_shape_and_accounting(report)
    base, ours = report["arms"]["baseline"], report["arms"]["rollbox"]
    assert base["rollouts"]["succeeded"] == IMAGES * ROLLOUTS
    assert ours["rollouts"]["succeeded"] == IMAGES * ROLLOUTS
    assert base["creations"] == IMAGES * ROLLOUTS and base["resets"] == 0
    assert ours["creations"] == IMAGES and ours["resets"] == IMAGES * (ROLLOUTS - 1)
    assert all(d["ttfc_s"]["count"] == IMAGES * ROLLOUTS for d in report["arms"].values())
    # The scripted policy's rewards are real test runs: right patches pass, wrong fail.
    assert 0.0 <= base["mean_reward"] <= 1.0 and base["mean_reward"] == ours["mean_reward"]


def test_bench_with_chaos_accounts_for_every_fault(state_dir: Path) -> None:
    code, report = run_cli(state_dir, "--chaos", "kill=0.2,hang=0.1,create=0.2",
                           "--exec-timeout", "3", "--seed", "1")
    assert code == 0  # faults are accounted for; nothing unaccounted, nothing left behind
    check_shape_and_accounting(report)
    injected_any = 0
    for data in report["arms"].values():
        injected = data["chaos_injected"]
        injected_any += sum(injected.values())
        retried, failed = data["rollouts"]["retried_by_kind"], data["rollouts"]["failed_by_kind"]
        # Every killed sandbox ended exactly one attempt as sandbox_lost.
        lost = retried.get("sandbox_lost", 0) + failed.get("sandbox_lost", 0)
        assert lost == injected.get("killed", 0)
        # Every hung command ended an attempt as exec_timeout (real timeouts may add).
        timeouts = retried.get("exec_timeout", 0) + failed.get("exec_timeout", 0)
        assert timeouts >= injected.get("hung", 0)
        # Every failed create was seen by the pool (warm creates included).
        assert (data["pool_failures_by_kind"].get("create_failed", 0)
                >= injected.get("create_failed", 0))
    assert injected_any > 0  # the rates are high enough that chaos did something
