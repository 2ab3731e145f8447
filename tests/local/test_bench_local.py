"""benchmarks/bench_local.py --quick runs end to end and reports sane numbers.

No timing assertions: the machine's load decides those. This keeps the script from
rotting as the backend and the pool change under it.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_local.py"


def _sane(summary: dict[str, float], count: int) -> None:
    assert summary["count"] == count
    for key in ("p50", "p99", "max"):
        assert math.isfinite(summary[key]) and summary[key] > 0, summary
    assert summary["p50"] <= summary["p99"] <= summary["max"]


@pytest.mark.slow
def test_quick_run_reports_every_measure(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--json", str(out)],
        capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    r: dict[str, Any] = json.loads(out.read_text())
    cfg = r["config"]

    for run in r["ttfc"].values():
        assert run["failures"] == {} and run["leftovers"] == []
        _sane(run["ttfc_ms"], run["acquires"])
    fixed = r["ttfc"]["in_use"]
    assert fixed["creations"] == 1 and fixed["resets"] == cfg["ttfc_n"]  # reused in place
    _sane(r["cold_create"]["first_result_ms"], cfg["cold_n"])
    _sane(r["exec"]["exec_ms"], cfg["exec_n"])
    for run in r["reset"].values():
        _sane(run["reset_ms"], cfg["reset_n"])
        assert run["files"] == cfg["reset_files"] and run["leftovers"] == []

    reserve, ready = r["idle"]["reserve"], r["idle"]["ready"]
    assert reserve["agents"] == 0 and reserve["processes"] == 2 * cfg["idle_n"]
    assert ready["agents"] == cfg["idle_n"] and ready["processes"] > ready["agents"]
    assert ready["pss_by_kind_mib"]["agent"] > 0
    for idle in (reserve, ready):
        assert idle["total_pss_mib"] > 0 and idle["leftovers"] == []

    rex = r["swerex"]
    if "skipped" in rex:
        assert "uv sync --group bench" in rex["skipped"]
    else:
        _sane(rex["start_first_command_ms"], cfg["rex_starts"])
        _sane(rex["run_in_session_ms"], cfg["rex_session_execs"])
        assert "SWE-ReX run_in_session" in done.stdout

    for label in ("warm TTFC", "cold create", "exec `true`", "reset after", "idle sandboxes",
                  "left behind"):
        assert label in done.stdout, done.stdout


def _script() -> Any:
    import importlib.util

    if "bench_local" not in sys.modules:
        spec = importlib.util.spec_from_file_location("bench_local", SCRIPT)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["bench_local"] = module  # its dataclasses look themselves up there
        spec.loader.exec_module(module)
    return sys.modules["bench_local"]


@pytest.mark.parametrize(("value", "shown"), [(0.04, "0.040 ms"), (1.234, "1.23 ms"),
                                              (15.37, "15.4 ms"), (465.2, "465 ms"),
                                              (math.nan, "n/a")])
def test_times_keep_the_precision_they_need(value: float, shown: str) -> None:
    assert _script().ms(value) == shown  # a 40 µs reset is not "0.0 ms"


@pytest.mark.parametrize(("rollbox_ms", "other_ms", "shown"), [
    (15.0, 465.0, "31x faster"), (0.9, 1.8, "2.00x faster"), (0.88, 0.72, "1.22x slower")])
def test_ratios_read_the_right_way_round(rollbox_ms: float, other_ms: float,
                                         shown: str) -> None:
    assert _script().compared(rollbox_ms, other_ms) == shown
