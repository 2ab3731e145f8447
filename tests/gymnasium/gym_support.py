"""Helpers the gymnasium tests import by name (a conftest cannot be imported reliably
when several test directories, each with its own conftest, are collected together)."""

from __future__ import annotations

from rollbox.spec import SandboxSpec
from rollbox_bench.shell import ShellTask, ShellTaskSource


def fake_tasks() -> ShellTaskSource:
    """Two tasks with different specs; each is solved by ``touch done``."""
    return ShellTaskSource(
        [
            ShellTask(id="fake/a", prompt="Create the file done.", check="cat done",
                      spec=SandboxSpec(workdir="/w")),
            ShellTask(id="fake/b", prompt="Create the file done (again).", check="cat done",
                      spec=SandboxSpec(workdir="/w", env={"TASK": "b"}),
                      files={"notes.txt": "hello\n"}),
        ]
    )
