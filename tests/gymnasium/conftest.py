"""Fixtures for the gymnasium adapter tests: a fake shell, a shell task source, the loop.

``local_backend`` is the one place that skips when the real local backend is not there
yet; every real-sandbox test goes through it.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterator

import gymnasium
import pluggy
import pytest
import rollbox_gymnasium
from rollbox import plugins
from rollbox.envs import Task
from rollbox.errors import SandboxFileNotFoundError, SandboxLostError, WorkloadError
from rollbox.hookspecs import hookimpl
from rollbox.sandbox import ExecRequest, ExecResult, Sandbox
from rollbox.spec import SandboxSpec
from rollbox.testing import FakeBackend, FakeSandbox, builtin_handler
from rollbox.testing.fake import resolve_path


async def fake_shell(sandbox: FakeSandbox, request: ExecRequest) -> ExecResult:
    """The fake backend's tiny shell plus ``touch``, ``big N``, ``explode`` (the sandbox
    is lost: infrastructure) and ``crash`` (the command broke its own sandbox, as a real
    backend says of a memory fill that kills its init); anything else (including random
    text that does not even parse) is 'not found', exit 127."""
    command = request.argv[2] if request.argv[:2] == ("/bin/sh", "-c") else None
    try:
        words = shlex.split(command) if command is not None else list(request.argv)
    except ValueError:
        words = ["\0unparseable"]
    name = words[0] if words else ""
    if name == "touch":
        for path in words[1:]:
            sandbox.files[resolve_path(path, request.cwd)] = b""
        return ExecResult(0)
    if name == "big":
        return ExecResult(0, stdout=b"x" * int(words[1]))
    if name == "explode":
        raise SandboxLostError("the fake sandbox exploded", sandbox_id=sandbox.id)
    if name == "crash":
        raise WorkloadError("its processes exhausted its memory", sandbox_id=sandbox.id,
                            cause="memory")
    if name in {"", "true", "false", "exit", "echo", "pwd", "env", "cat", "sleep"}:
        return await builtin_handler(sandbox, request)
    return ExecResult(127, stderr=f"sh: {name[:40]!r}: not found\n".encode())


async def done_file_exists(sandbox: Sandbox, task: Task) -> float:
    try:
        await sandbox.read_file("done")
    except SandboxFileNotFoundError:
        return 0.0
    return 1.0


class DoneFileTasks:
    """A core TaskSource, as a third-party plugin would register it."""

    name = "done_files"

    def __init__(self, count: int = 2) -> None:
        self.count = count

    def tasks(self) -> list[Task]:
        return [
            Task(id=f"done/{i}", spec=SandboxSpec(workdir="/w"), verifier=done_file_exists,
                 prompt=f"Task {i}: create the file done.")
            for i in range(self.count)
        ]


class TaskPlugin:
    @hookimpl
    def rollbox_register_tasks(self, register: Callable[[str, object], None]) -> None:
        register("done_files", DoneFileTasks)


@pytest.fixture
def task_plugin(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Every plugin manager rollbox makes also holds TaskPlugin; the id is removed after."""
    real = plugins.get_plugin_manager

    def with_plugin(*, load_entrypoints: bool = True) -> pluggy.PluginManager:
        pm = real(load_entrypoints=load_entrypoints)
        pm.register(TaskPlugin())
        return pm

    monkeypatch.setattr(plugins, "get_plugin_manager", with_plugin)
    yield "rollbox/DoneFiles-v0"
    gymnasium.registry.pop("rollbox/DoneFiles-v0", None)


@pytest.fixture
def fake_backend() -> Iterator[FakeBackend]:
    backend = FakeBackend(fake_shell)
    yield backend
    rollbox_gymnasium.shutdown()
    assert not backend.live, f"sandboxes left open: {sorted(backend.live)}"


@pytest.fixture(autouse=True)
def _stop_loop() -> Iterator[None]:
    yield
    rollbox_gymnasium.shutdown()


@pytest.fixture
def local_backend() -> str:
    """The real local backend, by name. SKIPS while ``rollbox_local.LocalBackend`` does not
    exist yet (the lead removes this skip once the local backend lands)."""
    try:
        from rollbox_local import LocalBackend  # noqa: F401
    except ImportError:
        pytest.skip("rollbox_local.LocalBackend is not importable yet")
    return "local"
