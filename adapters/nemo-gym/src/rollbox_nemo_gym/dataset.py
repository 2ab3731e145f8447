"""NeMo Gym dataset rows for a rollbox environment: one per task.

A row is what NeMo Gym's agents run (``simple_agent``'s ``/run``): the task's prompt and
the ``run_command`` tool in ``responses_create_params``, and the rollbox ``task_id``
that ``/seed_session`` of ``rollbox_nemo_gym.server`` starts the episode of::

    python -m rollbox_nemo_gym.dataset synthetic '{"n_images": 8}' > data/synthetic.jsonl
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Any

from rollbox.envs import Task, load_tasks

RUN_COMMAND_TOOL: dict[str, Any] = {
    "type": "function",
    "name": "run_command",
    "description": "Run a shell command in your sandbox and see what it printed. The "
                   "episode's reward comes from the sandbox's state.",
    "parameters": {
        "type": "object",
        "properties": {"command": {"type": "string", "description": "A shell command."}},
        "required": ["command"],
        "additionalProperties": False,
    },
    "strict": True,
}
"""The tool the server's ``/run_command`` route serves, in the Responses API's format."""


def row(task: Task) -> dict[str, Any]:
    return {
        "responses_create_params": {
            "input": [{"role": "user", "content": task.instruction}],
            "tools": [RUN_COMMAND_TOOL],
        },
        "task_id": task.id,
    }


def rows(environment: str, options: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """A row for every task of the registered ``environment``."""
    return [row(task) for task in load_tasks(environment, options)]


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if not 1 <= len(args) <= 2:
        sys.exit("usage: python -m rollbox_nemo_gym.dataset ENVIRONMENT [OPTIONS_JSON]")
    options = json.loads(args[1]) if len(args) == 2 else {}
    for item in rows(args[0], options):
        print(json.dumps(item))


if __name__ == "__main__":
    main()
