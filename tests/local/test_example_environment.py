"""examples/word_count_env.py: one environment, run under the runner and under Gymnasium,
on real local sandboxes (docs/writing-an-environment.md shows it)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "word_count_env.py"


@pytest.fixture
def example(state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    pytest.importorskip("rollbox_gymnasium")
    import gymnasium
    import rollbox_gymnasium

    monkeypatch.setenv("ROLLBOX_HOME", str(state_dir))
    spec = importlib.util.spec_from_file_location("word_count_env", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "word_count_env", module)  # dataclasses look it up
    spec.loader.exec_module(module)
    yield module
    rollbox_gymnasium.shutdown()
    gymnasium.registry.pop("rollbox/WordCount-v0", None)


async def test_the_example_runs_under_the_runner(example: ModuleType) -> None:
    report = await example.under_the_runner("local")
    rollouts = report["rollouts"]
    assert rollouts["accounted"] and rollouts["succeeded"] == 6 and rollouts["failed"] == 0
    assert report["mean_reward"] == 0.5  # every other rollout solves its task


def test_the_example_runs_under_gymnasium(example: ModuleType) -> None:
    (prompt, _, _), (words, _, _), (_, reward, done) = example.under_gymnasium("local")
    assert "answer.txt" in prompt
    assert set(words.split()) <= set(example.VOCABULARY)
    assert (reward, done) == (1.0, True)


def test_the_example_registers_through_the_hook(example: ModuleType) -> None:
    from rollbox.envs import load_tasks
    from rollbox.plugins import get_plugin_manager

    pm = get_plugin_manager(load_entrypoints=False)
    pm.register(example)
    tasks = load_tasks("word_count", {"count": 2}, plugin_manager=pm)
    assert [t.id for t in tasks] == ["word_count/0", "word_count/1"]
