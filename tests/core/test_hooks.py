"""Every hook of the specification is called by core: one test per hook, each failing
if core stops calling it (and a test that fails when a hook is added without one)."""

from __future__ import annotations

import argparse
import inspect
from collections.abc import Callable
from typing import Any

import pluggy
import pytest
from rollbox import hookspecs
from rollbox.backend import Backend
from rollbox.cli_commands import Command
from rollbox.envs import Task, open_task_source
from rollbox.errors import CreateFailedError, SandboxError
from rollbox.hookspecs import hookimpl
from rollbox.plugins import backend_class, commands, get_plugin_manager, pool_policies
from rollbox.pool import Pool, StaticPoolPolicy
from rollbox.results import RolloutOutput, RolloutResult
from rollbox.runner import run_rollouts
from rollbox.sandbox import Sandbox
from rollbox.spec import SandboxSpec
from rollbox.testing.fake import FakeBackend

TESTED = {
    "rollbox_register_backends": "test_register_backends_is_called",
    "rollbox_register_pool_policies": "test_register_pool_policies_is_called",
    "rollbox_register_tasks": "test_register_tasks_is_called",
    "rollbox_register_commands": "test_register_commands_is_called",
    "rollbox_register_serve_faces": "test_register_serve_faces_is_called",
    "rollbox_sandbox_created": "test_sandbox_created_fires_per_creation",
    "rollbox_sandbox_failed": "test_sandbox_failed_fires_per_counted_failure",
    "rollbox_rollout_finished": "test_rollout_finished_fires_per_rollout",
}


def test_every_hookspec_has_a_test_here() -> None:
    specs = {name for name, _ in inspect.getmembers(hookspecs, inspect.isfunction)
             if name.startswith("rollbox_")}
    assert specs == set(TESTED)
    assert all(name in globals() for name in TESTED.values())


class Recorder:
    """A plugin that records every observer call."""

    def __init__(self) -> None:
        self.created: list[tuple[str, SandboxSpec, float]] = []
        self.failed: list[tuple[SandboxError, SandboxSpec]] = []
        self.finished: list[RolloutResult] = []

    @hookimpl
    def rollbox_sandbox_created(self, sandbox_id: str, spec: SandboxSpec, seconds: float) -> None:
        self.created.append((sandbox_id, spec, seconds))

    @hookimpl
    def rollbox_sandbox_failed(self, error: SandboxError, spec: SandboxSpec) -> None:
        self.failed.append((error, spec))

    @hookimpl
    def rollbox_rollout_finished(self, result: RolloutResult) -> None:
        self.finished.append(result)


def manager(*plugins: object) -> pluggy.PluginManager:
    pm = get_plugin_manager(load_entrypoints=False)
    for plugin in plugins:
        pm.register(plugin)
    return pm


class Registrar:
    @hookimpl
    def rollbox_register_backends(self, register: Callable[[str, type[Backend]], None]) -> None:
        register("recorded-backend", FakeBackend)

    @hookimpl
    def rollbox_register_pool_policies(self, register: Callable[[str, type[object]], None]
                                       ) -> None:
        register("recorded-policy", StaticPoolPolicy)

    @hookimpl
    def rollbox_register_tasks(self, register: Callable[[str, object], None]) -> None:
        register("recorded-tasks", TaskList)

    @hookimpl
    def rollbox_register_commands(self, register: Callable[[Command], None]) -> None:
        register(Command("recorded", "a recorded command", lambda p: None, lambda a: 0))


class TaskList:
    name = "recorded-tasks"

    def tasks(self) -> list[Task]:
        return [Task(id="t", spec=SandboxSpec())]


def test_register_backends_is_called() -> None:
    assert backend_class(manager(Registrar()), "recorded-backend") is FakeBackend


def test_register_pool_policies_is_called() -> None:
    assert pool_policies(manager(Registrar()))["recorded-policy"] is StaticPoolPolicy


def test_register_tasks_is_called() -> None:
    source = open_task_source("recorded-tasks", plugin_manager=manager(Registrar()))
    assert [t.id for t in source.tasks()] == ["t"]


def test_register_commands_is_called() -> None:
    found = {c.name: c for c in commands(manager(Registrar()))}
    assert found["recorded"].run(argparse.Namespace()) == 0


async def test_sandbox_created_fires_per_creation() -> None:
    recorder = Recorder()
    spec = SandboxSpec(image="host")
    async with Pool(FakeBackend(create_delay=0.01), plugin_manager=manager(recorder)) as pool:
        leases = [await pool.acquire(spec) for _ in range(3)]
        for lease in leases:
            await lease.release()
        await pool.prewarm(spec, 1)
    assert [s for _, s, _ in recorder.created] == [spec] * 4
    assert len({i for i, _, _ in recorder.created}) == 4
    assert all(seconds >= 0.01 for _, _, seconds in recorder.created)
    assert pool.metrics.counters["creations"] == 4


async def test_sandbox_failed_fires_per_counted_failure() -> None:
    recorder = Recorder()
    backend = FakeBackend(fail_creates=1)
    spec = SandboxSpec(image="host")
    async with Pool(backend, plugin_manager=manager(recorder)) as pool:
        with pytest.raises(CreateFailedError):
            await pool.acquire(spec)
        lease = await pool.acquire(spec)
        await lease.release()  # reset, kept idle
        backend.kill(lease.raw.id)  # dies while idle: fails its health check
        await (await pool.acquire(spec)).release()
    assert [e.kind for e, _ in recorder.failed] == ["create_failed", "reset_failed"]
    assert all(s == spec for _, s in recorder.failed)
    assert sum(pool.metrics.failures_by_kind().values()) == 2


async def rollout(sandbox: Sandbox, task: Task, index: int) -> RolloutOutput:
    if index == 1:
        raise ValueError("a failing rollout")
    await sandbox.exec("true")
    return RolloutOutput(1.0)


@pytest.mark.parametrize("where", ["run", "pool"])
async def test_rollout_finished_fires_per_rollout(where: str) -> None:
    recorder = Recorder()
    pm = manager(recorder)
    tasks = [Task(id=f"t{i}", spec=SandboxSpec()) for i in range(2)]
    on_pool: dict[str, Any] = {"plugin_manager": pm} if where == "pool" else {}
    on_run: dict[str, Any] = {"plugin_manager": pm} if where == "run" else {}
    async with Pool(FakeBackend(), **on_pool) as pool:
        report = await run_rollouts(pool, tasks, 3, rollout, **on_run)
    assert sorted((r.task_id, r.index, r.ok) for r in recorder.finished) == sorted(
        (r.task_id, r.index, r.ok) for r in report.results)
    assert len(recorder.finished) == 6 and sum(not r.ok for r in recorder.finished) == 2


async def test_a_raising_observer_is_counted_not_fatal() -> None:
    class Broken:
        @hookimpl
        def rollbox_sandbox_created(self, sandbox_id: str, spec: SandboxSpec,
                                    seconds: float) -> None:
            raise RuntimeError("observer bug")

    async with Pool(FakeBackend(), plugin_manager=manager(Broken())) as pool:
        with pytest.warns(RuntimeWarning, match="observer bug"):
            await (await pool.acquire(SandboxSpec())).release()
    assert pool.metrics.counters["observer_errors"] == 1


def test_register_serve_faces_is_called() -> None:
    """``rollbox serve`` looks its faces up through ``serve_faces`` (rollbox_serve.cli)."""
    from rollbox.plugins import serve_faces

    def attach(server: object) -> None:
        """Would mount an HTTP API on the server."""

    class FacePlugin:
        @hookimpl
        def rollbox_register_serve_faces(self, register: Callable[[str, Any], None]) -> None:
            register("demo", attach)

    pm = get_plugin_manager(load_entrypoints=False)
    pm.register(FacePlugin())
    assert serve_faces(pm) == {"demo": attach}
