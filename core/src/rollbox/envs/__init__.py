"""The environment contract every adapter stands on (see ``docs/writing-an-environment.md``).

* ``Task`` (``rollbox.envs.task``): one environment instance — spec, prompt, setup, act,
  judge; ``TaskSource``: a named collection of tasks.
* the registry (``rollbox.envs.registry``): task sources registered through
  ``rollbox_register_tasks``, opened by name.
* ``Session`` (``rollbox.envs.session``): episodes of tasks on leased sandboxes — the
  state machine an adapter translates.
* the sync bridge (``rollbox.envs.bridge``) and shared pools (``rollbox.envs.pools``):
  one event loop per process and pools shared by every synchronous caller.
"""

from __future__ import annotations

from rollbox.envs.registry import load_tasks, open_task_source
from rollbox.envs.session import Session, Started, Transition
from rollbox.envs.task import (
    SUBMIT,
    Judgement,
    RolloutFn,
    StepOutcome,
    Task,
    TaskSource,
    Verifier,
    is_sandbox_text,
)

__all__ = [
    "SUBMIT",
    "Judgement",
    "RolloutFn",
    "Session",
    "Started",
    "StepOutcome",
    "Task",
    "TaskSource",
    "Transition",
    "Verifier",
    "is_sandbox_text",
    "load_tasks",
    "open_task_source",
]
