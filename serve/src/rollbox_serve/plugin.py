"""Registers ``rollbox serve`` with rollbox (entry point ``rollbox``)."""

from __future__ import annotations

from collections.abc import Callable

from rollbox.cli_commands import Command
from rollbox.hookspecs import hookimpl


@hookimpl
def rollbox_register_commands(register: Callable[[Command], None]) -> None:
    from rollbox_serve import cli

    register(Command("serve", "Serve a backend's warm pool to many processes over HTTP.",
                     cli.configure, cli.run))
