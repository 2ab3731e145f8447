"""What core registers through its own hook spec: the fake backend, the pool policies
and the backend-agnostic CLI commands."""

from __future__ import annotations

from collections.abc import Callable

from rollbox.cli_commands import Command
from rollbox.hookspecs import BackendRef, hookimpl
from rollbox.policies import LookaheadPolicy
from rollbox.pool import NoPoolPolicy, StaticPoolPolicy
from rollbox.testing.fake import FakeBackend


@hookimpl
def rollbox_register_backends(register: Callable[[str, BackendRef], None]) -> None:
    register("fake", FakeBackend)


@hookimpl
def rollbox_register_pool_policies(register: Callable[[str, type[object]], None]) -> None:
    register(NoPoolPolicy.name, NoPoolPolicy)
    register(StaticPoolPolicy.name, StaticPoolPolicy)
    register(LookaheadPolicy.name, LookaheadPolicy)


@hookimpl
def rollbox_register_commands(register: Callable[[Command], None]) -> None:
    from rollbox import cli

    register(Command("run", "Run a command in a fresh sandbox.", cli.configure_run, cli.run))
    register(Command("doctor", "Check that a backend can run here.", cli.configure_doctor,
                     cli.doctor))
