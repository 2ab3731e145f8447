"""Registers ``rollbox openhands`` and the ``openhands`` face of ``rollbox serve``
(entry point ``rollbox``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rollbox.cli_commands import Command
from rollbox.hookspecs import hookimpl


@hookimpl
def rollbox_register_commands(register: Callable[[Command], None]) -> None:
    from rollbox_openhands.cli import openhands_command

    register(openhands_command())


@hookimpl
def rollbox_register_serve_faces(register: Callable[[str, Callable[[Any], None]], None]) -> None:
    from rollbox_openhands.face import attach

    register("openhands", attach)
