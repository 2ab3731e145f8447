"""The rollbox hook specification (pluggy project name ``rollbox``).

Hooks are synchronous: pluggy cannot await. Registrar hooks hand the plugin a
``register`` callable; what a plugin registers (backend classes, policy classes, task
sources, CLI commands) has async methods of its own. Observer hooks are cheap
notifications; an observer must not block or raise.

Every hook below follows one template: when it is called, what it receives, what it
returns.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeAlias, Union

import pluggy

if TYPE_CHECKING:
    from rollbox.backend import Backend
    from rollbox.cli_commands import Command
    from rollbox.errors import SandboxError
    from rollbox.results import RolloutResult
    from rollbox.spec import SandboxSpec

BackendRef: TypeAlias = Union["type[Backend]", Callable[[], "type[Backend]"]]
"""What ``register`` takes for a backend: its class, or a zero-argument function that
imports and returns it (so a heavy plugin costs nothing until its backend is used)."""

PROJECT = "rollbox"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def rollbox_register_backends(register: Callable[[str, BackendRef], None]) -> None:
    """Register backend classes by name.

    Called once per plugin manager, when backends are first looked up.
    ``register(name, backend_class)``; ``backend_class`` may also be a zero-argument
    function returning the class, called only when that backend is looked up by name.
    A name registered twice is a PluginError. Returns nothing.
    """


@hookspec
def rollbox_register_pool_policies(register: Callable[[str, type[object]], None]) -> None:
    """Register warm-pool fill policies by name (``none``, ``static`` … are built in).

    Called once per plugin manager, when policies are first looked up.
    ``register(name, policy_class)``; the class implements ``rollbox.pool.PoolPolicy``.
    Returns nothing.
    """


@hookspec
def rollbox_register_tasks(register: Callable[[str, object], None]) -> None:
    """Register environments: task sources, by name.

    Called each time task sources are looked up (``rollbox.envs.open_task_source``,
    the Gymnasium adapter's env ids). ``register(name, factory)``; ``factory(**options)``
    returns a ``rollbox.envs.TaskSource`` whose tasks are ``rollbox.envs.Task``. A name
    registered twice is a PluginError. Returns nothing.
    """


@hookspec
def rollbox_register_commands(register: Callable[[Command], None]) -> None:
    """Register ``rollbox`` CLI subcommands.

    Called once when the CLI starts. ``register(Command(...))``.
    Returns nothing.
    """


@hookspec
def rollbox_sandbox_created(sandbox_id: str, spec: SandboxSpec, seconds: float) -> None:
    """Observe a sandbox creation by a pool.

    Called by a pool given this plugin manager (``Pool(backend, plugin_manager=pm)``),
    once per sandbox it created, after the backend's ``create`` (and the sandbox's
    ``prepare``) returned; ``seconds`` is how long that took. Returns nothing.
    """


@hookspec
def rollbox_sandbox_failed(error: SandboxError, spec: SandboxSpec) -> None:
    """Observe a sandbox failure that a pool counted.

    Called by a pool given this plugin manager, once per failure it counts, before it
    recovers from it: a ``create`` or ``prepare`` that raised (the backend's error), or
    a sandbox quarantined because it failed its health check before hand-out or its
    reset after a release (``ResetFailedError``). Returns nothing.
    """


@hookspec
def rollbox_rollout_finished(result: RolloutResult) -> None:
    """Observe a rollout that ended, successfully or not (after all its retries).

    Called by the runner once per rollout when it or its pool is given this plugin
    manager (``run_rollouts(..., plugin_manager=pm)`` or ``Pool(..., plugin_manager=pm)``),
    rollouts marked ``cancelled`` when a run is interrupted included. ``result.failure``
    is None on success. Returns nothing.
    """
