"""``rollbox bench`` wastes no work and hides no failure: bad output paths and a store
too small for one image are refused before the run, failures the injected faults do not
explain fail the run with their reason, and each arm's memory is its own."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from cli_support import Rollbox

FAST = ("bench", "--backend", "fake", "--think-ms", "0", "--quiet")


@pytest.mark.parametrize("option", ["--json", "--plot"])
def test_an_output_path_in_a_missing_directory_is_refused_before_the_run(
        rollbox: Rollbox, tmp_path: Path, option: str) -> None:
    started = time.monotonic()
    result = rollbox(*FAST, option, str(tmp_path / "missing" / "out"))
    assert result.returncode == 2 and f"argument {option}" in result.stderr
    assert "does not exist" in result.stderr and "Traceback" not in result.stderr
    assert "TTFC" not in result.stdout, "the run should not have started"
    assert time.monotonic() - started < 30


def test_a_store_smaller_than_one_image_is_refused_before_the_run(rollbox: Rollbox,
                                                                  tmp_path: Path) -> None:
    result = rollbox("bench", "--images", "2", "--rollouts", "1", "--capacity-mb", "1",
                     "--workdir", str(tmp_path), "--quiet")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "cannot hold one task image" in result.stderr and "--capacity-mb" in result.stderr
    assert "the 16 images the rollbox arm holds at once" in result.stderr
    assert not list(tmp_path.glob("images-*/task-*")), "images were built for nothing"


def test_rollouts_failing_for_an_unexplained_reason_fail_the_run(rollbox: Rollbox,
                                                                 home: Path) -> None:
    """A store that holds one image while four rollouts want theirs: the run says so."""
    result = rollbox("bench", "--images", "4", "--rollouts", "1", "--concurrency", "4",
                     "--padding-mb", "1", "--capacity-mb", "1.5", "--think-ms", "0",
                     "--workdir", str(home / "bench"), "--quiet", timeout=600)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "failed as image_store_full: image store full" in result.stderr
    assert "the bench sets its store's capacity: --capacity-mb" in result.stderr


def test_injected_faults_do_not_fail_the_run(rollbox: Rollbox) -> None:
    result = rollbox(*FAST, "--images", "8", "--chaos", "kill=0.2")
    assert result.returncode == 0, result.stderr
    assert "chaos killed" in result.stdout


def test_each_arm_reports_its_own_peak_memory(rollbox: Rollbox, tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    assert rollbox(*FAST, "--json", str(report)).returncode == 0
    arms = json.loads(report.read_text())["arms"]
    corpus = json.loads(report.read_text())["workload"]["corpus_bytes"]
    base, ours = arms["baseline"]["rss_bytes"], arms["rollbox"]["rss_bytes"]
    assert base["peak_scope"] == ours["peak_scope"] == "arm"
    # The second arm's peak is not the first arm's plus its own (it was: 230 vs 422 MiB).
    assert ours["peak"] < base["peak"] + corpus / 2
