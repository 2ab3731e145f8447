"""Env ids: one per environment registered with rollbox (``rollbox_register_tasks``).

``register_envs()`` runs when ``rollbox_gymnasium`` is imported, and is also declared as
the package's ``gymnasium.envs`` entry point. Gymnasium 1.x itself no longer loads that
entry-point group, so with it the ids exist once ``rollbox_gymnasium`` is imported::

    import rollbox_gymnasium  # registers the ids
    env = gymnasium.make("rollbox/Shell-v0")
    # or, without an import statement (gymnasium imports the module named before ":"):
    env = gymnasium.make("rollbox_gymnasium:rollbox/Shell-v0")

Every task source registered through ``rollbox_register_tasks`` gets the id
``rollbox/<CamelName>-v0``: ``my_tasks`` becomes ``rollbox/MyTasks-v0``; the ones rollbox
ships are ``rollbox/Shell-v0`` (``shell``) and ``rollbox/SWE-v0`` (``synthetic``).
"""

from __future__ import annotations

import re
import warnings

import gymnasium
from rollbox import plugins
from rollbox.envs import TaskSource
from rollbox.errors import RollboxError

NAMESPACE = "rollbox"
ENTRY_POINT = "rollbox_gymnasium.env:SandboxEnv"
VECTOR_ENTRY_POINT = "rollbox_gymnasium.vector:SandboxVectorEnv"
DEFAULT_MAX_EPISODE_STEPS = 32

# Task sources whose env name is not simply their CamelCased source name.
ENV_NAMES = {"shell": "Shell", "synthetic": "SWE"}


def env_name(source: str) -> str:
    """``my_tasks`` → ``MyTasks`` (the ``Name`` part of ``rollbox/Name-v0``)."""
    if source in ENV_NAMES:
        return ENV_NAMES[source]
    parts = [p for p in re.split(r"[^0-9A-Za-z]+", source) if p]
    return "".join(p[:1].upper() + p[1:] for p in parts) or "Unnamed"


def env_id(source: str) -> str:
    return f"{NAMESPACE}/{env_name(source)}-v0"


def register_source(source: str | TaskSource, *,
                    max_episode_steps: int = DEFAULT_MAX_EPISODE_STEPS) -> str:
    """Register the env id of ``source`` (once) and return it: a registered environment's
    name, or a ``TaskSource`` object (its ``name`` gives the id; ``gymnasium.make`` then
    needs no plugin installed)."""
    name = source if isinstance(source, str) else source.name
    id_ = env_id(name)
    if id_ not in gymnasium.registry:
        gymnasium.register(
            id=id_,
            entry_point=ENTRY_POINT,
            vector_entry_point=VECTOR_ENTRY_POINT,
            max_episode_steps=max_episode_steps,
            # Commands run in a real sandbox: their output depends on time, process ids
            # and scheduling, so the same seed and action need not give the same step.
            nondeterministic=True,
            kwargs={"task_source": source},
        )
    return id_


def register_envs() -> list[str]:
    """Register an env id for every registered rollbox environment; idempotent.
    Returns the ids."""
    try:
        sources = plugins.task_sources(plugins.get_plugin_manager())
    except RollboxError as error:
        warnings.warn(f"rollbox task sources could not be listed: {error}", stacklevel=2)
        sources = {}
    return [register_source(name) for name in sorted(sources)]
