"""Tasks and task sources: what a runner runs rollouts of.

A ``Task`` is one environment instance: an id, the ``SandboxSpec`` its rollouts run in,
and optionally a ``policy`` (a scripted rollout function, e.g. for benchmarks) and a
``verifier`` (how the reward is read from the sandbox). A ``TaskSource`` yields tasks.

Plugins register task-source factories by name through ``rollbox_register_tasks``::

    @hookimpl
    def rollbox_register_tasks(register):
        register("my-env", MyTaskSource)   # MyTaskSource(**options) -> TaskSource

and users open them with ``open_task_source("my-env", **options)``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from rollbox.errors import PluginError, UsageError
from rollbox.results import RolloutOutput
from rollbox.sandbox import Sandbox
from rollbox.spec import SandboxSpec

if TYPE_CHECKING:
    import pluggy

RolloutFn = Callable[[Sandbox, "Task", int], Awaitable[RolloutOutput]]
"""``rollout_fn(sandbox, task, index) -> RolloutOutput``: one rollout on a leased sandbox."""

Verifier = Callable[[Sandbox, "Task"], Awaitable[float]]
"""``verifier(sandbox, task) -> reward``: read the reward from the sandbox's state."""


@dataclass(frozen=True)
class Task:
    """One environment instance. ``id`` must be unique within a run."""

    id: str
    spec: SandboxSpec
    policy: RolloutFn | None = None
    verifier: Verifier | None = None
    meta: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise UsageError(f"Task.id must be a non-empty str, got {self.id!r}")
        if not isinstance(self.spec, SandboxSpec):
            raise UsageError(f"Task {self.id!r}: spec must be a SandboxSpec")


@runtime_checkable
class TaskSource(Protocol):
    """Anything with a ``name`` that yields ``Task`` objects."""

    name: str

    def tasks(self) -> Iterable[Task]:
        """The tasks, in the order a runner should start them."""
        ...


TaskSourceFactory = Callable[..., TaskSource]


def open_task_source(
    name: str, *, plugin_manager: pluggy.PluginManager | None = None, **options: object
) -> TaskSource:
    """The task source registered as ``name``, built with ``options``."""
    from rollbox.plugins import get_plugin_manager, task_sources

    found = task_sources(plugin_manager or get_plugin_manager())
    if name not in found:
        known = ", ".join(sorted(found)) or "none"
        raise UsageError(f"no task source named {name!r}; installed: {known}")
    factory = found[name]
    if not callable(factory):
        raise PluginError(f"task source {name!r} was registered with a non-callable factory")
    source = factory(**options)
    if not isinstance(source, TaskSource):
        raise PluginError(f"task source factory {name!r} returned {type(source).__name__}, "
                          "which has no name/tasks()")
    return source
