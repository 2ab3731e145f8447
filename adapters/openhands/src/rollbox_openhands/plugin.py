"""Registers the ``rollbox openhands`` commands (entry point ``rollbox``)."""

from __future__ import annotations

from collections.abc import Callable

from rollbox.cli_commands import Command
from rollbox.hookspecs import hookimpl


@hookimpl
def rollbox_register_commands(register: Callable[[Command], None]) -> None:
    from rollbox_openhands.cli import openhands_command

    register(openhands_command())
