"""Registers the ``sim`` backend and ``rollbox simulate`` (entry point ``rollbox``)."""

from __future__ import annotations

from collections.abc import Callable

from rollbox.backend import Backend
from rollbox.cli_commands import Command
from rollbox.hookspecs import BackendRef, hookimpl


@hookimpl
def rollbox_register_backends(register: Callable[[str, BackendRef], None]) -> None:
    register("sim", _sim_backend)


def _sim_backend() -> type[Backend]:
    from rollbox_sim.backend import SimBackend

    return SimBackend


@hookimpl
def rollbox_register_commands(register: Callable[[Command], None]) -> None:
    from rollbox_sim import cli

    register(Command("simulate", "Replay a training run's sandbox burst on a simulated "
                     "cluster, in virtual time.", cli.configure, cli.run))
