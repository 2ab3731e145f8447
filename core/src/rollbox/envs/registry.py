"""One registry of environments: task sources registered through ``rollbox_register_tasks``.

    @hookimpl
    def rollbox_register_tasks(register):
        register("my-env", MyTaskSource)   # MyTaskSource(**options) -> a TaskSource

Every consumer finds environments here by name: the runner's callers, the Gymnasium
adapter (one env id per name), the bench, any other adapter.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rollbox.envs.task import Task, TaskSource
from rollbox.errors import PluginError, UsageError

if TYPE_CHECKING:
    import pluggy


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


def load_tasks(
    source: str | TaskSource, options: Mapping[str, Any] | None = None, *,
    plugin_manager: pluggy.PluginManager | None = None,
) -> list[Task]:
    """The tasks of ``source`` (a registered name, built with ``options``, or a source
    object), checked: at least one, all ``Task``, ids unique."""
    if isinstance(source, str):
        made = open_task_source(source, plugin_manager=plugin_manager, **(options or {}))
    elif options:
        raise UsageError("task options apply only when the task source is given by name")
    elif not isinstance(source, TaskSource):
        raise UsageError(f"{type(source).__name__} is not a task source (name, tasks())")
    else:
        made = source
    tasks = list(made.tasks())
    label = source if isinstance(source, str) else type(source).__name__
    if not tasks:
        raise UsageError(f"task source {label!r} has no tasks")
    strange = [type(t).__name__ for t in tasks if not isinstance(t, Task)]
    if strange:
        raise UsageError(f"task source {label!r} yields {strange[0]}, not rollbox.envs.Task")
    ids = [t.id for t in tasks]
    if len(set(ids)) < len(ids):
        raise UsageError(f"task source {label!r} repeats task ids")
    return tasks
