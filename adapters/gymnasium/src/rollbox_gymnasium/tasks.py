"""What an env needs from a task, and how a task source is found by name.

An env speaks to tasks only through ``EnvTask``: which sandbox it needs (``spec``), what
the agent is told (``prompt``), how the sandbox is prepared (``setup``) and, after each
action, the verdict of the task's verifier (``judge``: reward, and whether the episode is
over). Task sources registered through rollbox's hook spec are adapted to it here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from rollbox import plugins
from rollbox.errors import UsageError
from rollbox.sandbox import ExecResult, Sandbox
from rollbox.spec import SandboxSpec
from rollbox.tasks import TaskSource, open_task_source


@dataclass(frozen=True)
class StepOutcome:
    """What the agent's action did, handed to the verifier.

    ``result`` holds what the command printed (up to its timeout when ``timed_out``).
    """

    action: str
    result: ExecResult
    timed_out: bool = False


@dataclass(frozen=True)
class Judgement:
    """The verifier's verdict after one action."""

    reward: float
    terminated: bool
    info: Mapping[str, Any] = field(default_factory=dict)


@runtime_checkable
class EnvTask(Protocol):
    """One task an episode is about."""

    @property
    def id(self) -> str: ...

    @property
    def spec(self) -> SandboxSpec: ...

    @property
    def prompt(self) -> str: ...

    async def setup(self, sandbox: Sandbox) -> None:
        """Prepare a clean sandbox of ``spec`` for the episode (files, repositories)."""

    async def judge(self, sandbox: Sandbox, step: StepOutcome) -> Judgement:
        """Reward the last action and say whether the task is finished.

        A SandboxError raised here is a sandbox failure, never a zero reward.
        """


@runtime_checkable
class EnvTaskSource(Protocol):
    """A finite, indexable collection of tasks; ``reset`` picks one by the env's RNG."""

    def tasks(self) -> Sequence[EnvTask]: ...


TaskSourceFactory = Callable[..., object]


def builtin_sources() -> dict[str, TaskSourceFactory]:
    """Task sources this package ships or wraps (``synthetic``: core's, with its images
    built and an agent prompt); rollbox plugins add more."""
    from rollbox_gymnasium.shell import ShellTaskSource
    from rollbox_gymnasium.swe import synthetic_source

    return {"shell": ShellTaskSource, "synthetic": synthetic_source}


def plugin_sources() -> dict[str, TaskSourceFactory]:
    """Task sources registered through rollbox's ``rollbox_register_tasks`` hook."""
    found = plugins.task_sources(plugins.get_plugin_manager())
    return {name: _factory(name, item) for name, item in found.items()}


def _factory(name: str, item: object) -> TaskSourceFactory:
    if not callable(item):
        raise UsageError(f"task source {name!r} was registered with a non-callable {item!r}")
    return item


def resolve_task_source(
    source: str | EnvTaskSource | object, options: Mapping[str, Any] | None = None
) -> EnvTaskSource:
    """The task source called ``source`` (or ``source`` itself), made with ``options``.

    Names are this package's own sources (``shell``) or any registered through rollbox's
    ``rollbox_register_tasks`` hook; core ``TaskSource`` objects are adapted
    (``rollbox_gymnasium.core_tasks``).
    """
    if isinstance(source, str):
        builtin = builtin_sources()
        if source in builtin:
            made = builtin[source](**(options or {}))
        else:
            made = open_task_source(
                source, plugin_manager=plugins.get_plugin_manager(), **(options or {})
            )
        return adapt_task_source(made, name=source)
    if options:
        raise UsageError("task_options apply only when the task source is given by name")
    return adapt_task_source(source, name=type(source).__name__)


def adapt_task_source(obj: object, *, name: str) -> EnvTaskSource:
    """``obj`` as an EnvTaskSource, or a UsageError naming what is missing."""
    from rollbox_gymnasium.core_tasks import CoreTaskSource

    adapted: EnvTaskSource
    if isinstance(obj, TaskSource) and not _all_env_tasks(obj):
        adapted = CoreTaskSource(obj)
    elif isinstance(obj, EnvTaskSource) and _all_env_tasks(obj):
        adapted = obj
    else:
        raise UsageError(
            f"task source {name!r} ({type(obj).__name__}) is neither a rollbox TaskSource "
            "nor has a tasks() method returning EnvTask objects (id, spec, prompt, setup, judge)"
        )
    if not len(adapted.tasks()):
        raise UsageError(f"task source {name!r} has no tasks")
    return adapted


def _all_env_tasks(obj: object) -> bool:
    tasks = getattr(obj, "tasks", None)
    if not callable(tasks):
        return False
    found = tasks()
    return isinstance(found, Sequence) and all(isinstance(t, EnvTask) for t in found)
