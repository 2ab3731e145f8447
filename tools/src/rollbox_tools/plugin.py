"""What the tools register through rollbox's hook specification: the backend-agnostic
commands ``rollbox run`` and ``rollbox doctor``."""

from __future__ import annotations

from collections.abc import Callable

from rollbox.cli_commands import Command
from rollbox.hookspecs import hookimpl


@hookimpl
def rollbox_register_commands(register: Callable[[Command], None]) -> None:
    from rollbox_tools import cli

    register(Command("run", "Run a command in a fresh sandbox.", cli.configure_run, cli.run))
    register(Command("doctor", "Check that a backend can run here.", cli.configure_doctor,
                     cli.doctor))
