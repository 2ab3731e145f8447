"""Registers the ``remote`` backend and ``rollbox ps`` with rollbox (entry point ``rollbox``)."""

from __future__ import annotations

from collections.abc import Callable

from rollbox.backend import Backend
from rollbox.cli_commands import Command
from rollbox.hookspecs import BackendRef, hookimpl


@hookimpl
def rollbox_register_backends(register: Callable[[str, BackendRef], None]) -> None:
    register("remote", _remote_backend)


def _remote_backend() -> type[Backend]:
    from rollbox_remote import RemoteBackend

    return RemoteBackend


@hookimpl
def rollbox_register_commands(register: Callable[[Command], None]) -> None:
    from rollbox_remote import cli

    register(Command("ps", "List the sandboxes a rollbox server holds.", cli.configure_ps,
                     cli.ps))
