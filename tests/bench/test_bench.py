"""rollbox bench on the fake backend: the JSON report, the CLI, chaos, the plot."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest
from rollbox import cli
from rollbox_bench.bench import BenchConfig, ChaosRates, run_bench
from rollbox_bench.cli import parse_chaos, render_table

SMALL = {"backend": "fake", "images": 8, "rollouts_per_task": 4, "concurrency": 2,
         "padding_bytes": 0, "fake_create_delay_s": 0.01, "fake_exec_delay_s": 0.002,
         "think_s": 0.0}


async def test_report_has_both_arms_and_adds_up() -> None:
    report = await run_bench(BenchConfig(**SMALL))  # type: ignore[arg-type]
    for arm in ("baseline", "rollbox"):
        data = report["arms"][arm]
        rollouts = data["rollouts"]
        assert rollouts["requested"] == 32
        assert rollouts["requested"] == rollouts["succeeded"] + rollouts["failed"]
        assert set(data["ttfc_s"]) >= {"mean", "p50", "p99", "max"}
        assert {"creations", "resets", "wall_s", "failed_by_kind"} <= set(data) | set(rollouts)
        assert data["leaked_sandboxes"] == 0
    base, ours = report["arms"]["baseline"], report["arms"]["rollbox"]
    assert base["creations"] == 32 and base["resets"] == 0
    assert ours["creations"] <= 8 and ours["resets"] >= 24
    assert ours["ttfc_s"]["mean"] < base["ttfc_s"]["mean"]
    assert report["ratios"]["creations"] >= 4
    table = render_table(report)
    assert "TTFC p99" in table and "every rollout accounted: yes" in table


async def test_chaos_run_accounts_for_every_fault() -> None:
    config = BenchConfig(**SMALL, chaos=ChaosRates(kill=0.1, hang=0.05, create_fail=0.05),  # type: ignore[arg-type]
                         exec_timeout_s=0.01)
    report = await run_bench(config)
    for data in report["arms"].values():
        assert data["rollouts"]["accounted"]
        injected = data["chaos_injected"]
        assert injected.get("killed", 0) > 0
        kinds = data["rollouts"]["retried_by_kind"]
        failed = data["rollouts"]["failed_by_kind"]
        assert kinds.get("sandbox_lost", 0) + failed.get("sandbox_lost", 0) == injected["killed"]


def test_cli_writes_strict_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report.json"
    code = cli.main(["bench", "--backend", "fake", "--images", "4", "--rollouts", "2",
                     "--concurrency", "2", "--padding-mb", "0", "--think-ms", "0",
                     "--json", str(out)])
    captured = capsys.readouterr()
    assert code == 0
    assert "[rollbox] 8/8 rollouts" in captured.err  # progress goes to stderr
    assert "TTFC mean" in captured.out
    report = json.loads(out.read_text(), parse_constant=lambda c: pytest.fail(f"{c} in JSON"))
    assert report["arms"]["baseline"]["rollouts"]["requested"] == 8
    assert report["workload"]["think_s"] == 0.0
    for arm in report["arms"].values():
        assert arm["leftovers"] == [] and arm["rss_bytes"]["peak"] > 0


def test_cli_plot(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "ttfc.png"
    code = cli.main(["bench", "--backend", "fake", "--images", "3", "--rollouts", "2",
                     "--padding-mb", "0", "--think-ms", "0", "--quiet", "--plot", str(png)])
    assert code == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    code = cli.main(["bench", "--backend", "fake", "--plot", str(tmp_path / "x.png")])
    assert code == 2
    err = capsys.readouterr().err
    assert "uv sync --inexact --extra plot" in err  # what works in a checkout today
    assert 'pip install "rollbox[plot]"' in err


def test_parse_chaos() -> None:
    assert parse_chaos("kill=0.05,hang=0.01,create=0.02") == ChaosRates(0.05, 0.01, 0.02)
    assert not parse_chaos(None).active
    for bad in ("explode=1", "kill=lots", "kill=-0.1", "hang=2", "create=nan"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_chaos(bad)


def test_default_capacity_is_smaller_than_the_corpus() -> None:
    from rollbox_bench.synthetic import SyntheticSource

    config = BenchConfig()
    source = SyntheticSource(config.images, padding_bytes=config.padding_bytes, kind="fake")
    assert config.capacity(source) < source.corpus_bytes


def test_think_time_reaches_the_policy_and_the_report() -> None:
    import argparse

    from rollbox_bench.cli import config_from, configure

    parser = argparse.ArgumentParser()
    configure(parser)
    args = parser.parse_args(["--think-ms", "40"])
    assert config_from(args).think_s == 0.04
    assert BenchConfig().think_s > 0  # the default run models policy latency


def test_a_leftover_on_the_backend_fails_the_run(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from rollbox.testing.fake import FakeBackend

    async def stray(self: FakeBackend) -> list[str]:
        return ["sandbox fake-1 is still open"]

    monkeypatch.setattr(FakeBackend, "leftovers", stray)
    code = cli.main(["bench", "--backend", "fake", "--images", "2", "--rollouts", "2",
                     "--padding-mb", "0", "--think-ms", "0", "--quiet"])
    captured = capsys.readouterr()
    assert code == 1
    assert "left behind on the backend: baseline 1, rollbox 1" in captured.out
