"""Registers the local backend and its CLI commands with rollbox (entry point ``rollbox``)."""

from __future__ import annotations

from collections.abc import Callable

from rollbox.backend import Backend
from rollbox.cli_commands import Command
from rollbox.hookspecs import hookimpl


@hookimpl
def rollbox_register_backends(register: Callable[[str, type[Backend]], None]) -> None:
    from rollbox_local.backend import LocalBackend

    register("local", LocalBackend)


@hookimpl
def rollbox_register_commands(register: Callable[[Command], None]) -> None:
    try:
        from rollbox_local.images_cli import image_commands
    except ImportError:
        return
    for command in image_commands():
        register(command)
