"""The synthetic SWE-style task source."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from rollbox.envs import TaskSource, open_task_source
from rollbox.errors import UsageError
from rollbox.pool import Pool
from rollbox.runner import run_rollouts
from rollbox_bench.synthetic import REPO, Problem, SyntheticSource


def test_deterministic_for_a_seed() -> None:
    a = SyntheticSource(3, seed=7, kind="fake", padding_bytes=64)
    b = SyntheticSource(3, seed=7, kind="fake", padding_bytes=64)
    c = SyntheticSource(3, seed=8, kind="fake", padding_bytes=64)
    assert a.image_files(a.problems[1]) == b.image_files(b.problems[1])
    assert a.image_files(a.problems[1]) != c.image_files(c.problems[1])
    assert len({p.fixed for p in a.problems}) == 3  # distinct images


def test_registered_and_opened_by_name() -> None:
    source = open_task_source("synthetic", n_images=2, kind="fake")
    assert isinstance(source, TaskSource)
    assert [t.id for t in source.tasks()] == ["synthetic-00000", "synthetic-00001"]
    with pytest.raises(UsageError):
        open_task_source("no-such-source")


async def test_scripted_policy_rewards_follow_the_patch() -> None:
    source = SyntheticSource(10, kind="fake", padding_bytes=0, p_correct=0.5, seed=1)
    async with Pool(source.fake_backend()) as pool:
        report = await run_rollouts(pool, list(source.tasks()), 4, concurrency=4)
    assert report.succeeded == 40
    for result in report.results:
        assert result.info["failing_before"] is True
        assert result.reward == (1.0 if result.info["patch"] == "right" else 0.0)
    assert 0 < report.mean_reward < 1


def test_p_correct_extremes() -> None:
    problem = Problem.make(0, 0)
    src = SyntheticSource(1, kind="fake", p_correct=1.0)
    policy = next(iter(src.tasks())).policy
    assert policy is not None
    assert all(policy.right_patch(i) for i in range(20))  # type: ignore[attr-defined]
    assert problem.passes(problem.fixed) and not problem.passes(problem.wrong)
    with pytest.raises(UsageError):
        SyntheticSource(1, kind="fake", p_correct=2)
    with pytest.raises(UsageError):
        SyntheticSource(1, kind="local")  # no root


@pytest.mark.skipif(shutil.which("git") is None or shutil.which("python3") is None,
                    reason="needs git and python3")
@pytest.mark.parametrize("index", range(8))
def test_the_image_is_real_git_with_a_failing_test_and_no_answer_anywhere(
        tmp_path: Path, index: int) -> None:
    """Every object git can reach or not (``--batch-all-objects``), every ref, reflog,
    stash and pack of the repository, and every file of the image: none holds the fix or
    the hidden cases. The fix, written by the hidden test's rules, passes them."""
    source = SyntheticSource(8, kind="fake", padding_bytes=0, seed=3)
    problem = source.problems[index]
    files = source.image_files(problem)
    for path, data in files.items():
        dest = tmp_path / path.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)
    repo = tmp_path / REPO.lstrip("/")

    def run(*cmd: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(cmd, cwd=repo, capture_output=True, text=True, timeout=30)

    assert run("git", "fsck", "--strict").returncode == 0
    assert run("git", "status", "--porcelain").stdout == ""
    assert run("git", "for-each-ref", "--format=%(refname)").stdout.split() == ["refs/heads/main"]
    assert run("git", "stash", "list").stdout == "" and not (repo / ".git/logs").exists()
    assert not (repo / ".git/packed-refs").exists()
    assert not list((repo / ".git").rglob("*.pack"))
    objects = subprocess.run(["git", "cat-file", "--batch-all-objects", "--batch"], cwd=repo,
                             capture_output=True, timeout=30, check=True).stdout
    assert objects.count(b" blob ") == 4 and problem.buggy in objects
    secrets = [problem.fixed, *(f"{x}, {want}".encode() for x, want in problem.hidden_cases)]
    for secret in secrets:
        assert secret not in objects
        assert not any(secret in data for data in files.values())
    assert run("python3", "-B", "test_solution.py").returncode == 1
    (repo / "solution.py").write_bytes(problem.fixed)
    for name, data in problem.judge_files().items():
        (repo / name).write_bytes(data)
    assert run("python3", "-B", "test_hidden.py").returncode == 0
    (repo / "solution.py").write_bytes(problem.wrong)
    assert run("python3", "-B", "test_hidden.py").returncode == 1


def test_local_layouts_are_written(tmp_path: Path) -> None:
    pytest.importorskip("rollbox_local.oci_build")
    source = SyntheticSource(2, root=tmp_path, padding_bytes=1024)
    paths = source.build()
    assert all((p / "index.json").is_file() and (p / "oci-layout").is_file() for p in paths)
    stamp = [(p / "index.json").stat().st_mtime_ns for p in paths]
    assert source.build() == paths  # complete layouts are reused, not rewritten
    assert [(p / "index.json").stat().st_mtime_ns for p in paths] == stamp
    assert next(iter(source.tasks())).spec.image == str(paths[0])


def test_think_time_is_seeded_and_averages_its_mean() -> None:
    from rollbox_bench.synthetic import ThinkTime

    think = ThinkTime(0.2, seed=3)
    draws = [think.draw(t, r, s) for t in range(40) for r in range(4) for s in (1, 2, 3)]
    assert draws == [ThinkTime(0.2, seed=3).draw(t, r, s)
                     for t in range(40) for r in range(4) for s in (1, 2, 3)]
    assert draws != [ThinkTime(0.2, seed=4).draw(t, r, s)
                     for t in range(40) for r in range(4) for s in (1, 2, 3)]
    assert all(d > 0 for d in draws) and len(set(draws)) == len(draws)
    assert 0.18 < sum(draws) / len(draws) < 0.22  # log-normal with that mean (480 draws)
    assert ThinkTime(0.0).draw(1, 2, 3) == 0.0
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(UsageError):
            ThinkTime(bad)


async def test_scripted_policy_thinks_between_actions_not_before_the_first() -> None:
    source = SyntheticSource(2, kind="fake", padding_bytes=0, think_s=0.01, seed=5)
    backend = source.fake_backend()
    events: list[str] = []
    run_command, pause = backend.handler, source.think.pause

    async def logged_command(sandbox: Any, request: Any) -> Any:
        events.append(request.argv[-1].split()[0])
        return await run_command(sandbox, request)

    async def logged_pause(task: int, rollout: int, step: int) -> None:
        events.append(f"think{step}")
        await pause(task, rollout, step)

    backend.handler = logged_command
    source.think.pause = logged_pause  # type: ignore[method-assign]
    async with Pool(backend) as pool:
        report = await run_rollouts(pool, list(source.tasks()), 2, concurrency=1)
    assert report.succeeded == 4
    one = ["README.md", "think1", "python3", "think2", "think3", "python3"]
    assert events == one * 4  # reset command first, then a pause before every action
    for result in report.results:
        n = int(result.task_id.rsplit("-", 1)[1])
        thought = sum(source.think.draw(n, result.index, step) for step in (1, 2, 3))
        assert result.duration_s >= thought  # each pause lasts at least its draw
