"""What the bench registers through rollbox's hook specification: the ``bench`` command
and the environments rollbox ships, ``shell`` and ``synthetic``."""

from __future__ import annotations

from collections.abc import Callable

from rollbox.cli_commands import Command
from rollbox.hookspecs import hookimpl

from rollbox_bench.shell import ShellTaskSource
from rollbox_bench.synthetic import synthetic_source


@hookimpl
def rollbox_register_tasks(register: Callable[[str, object], None]) -> None:
    register(ShellTaskSource.name, ShellTaskSource)
    register("synthetic", synthetic_source)


@hookimpl
def rollbox_register_commands(register: Callable[[Command], None]) -> None:
    from rollbox_bench import cli

    register(Command("bench", "Compare baseline and rollbox on a burst of rollouts.",
                     cli.configure, cli.run))
