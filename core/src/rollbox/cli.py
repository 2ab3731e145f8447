"""The ``rollbox`` command. Subcommands come from plugins (``rollbox_register_commands``)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Collection, Sequence

import pluggy

from rollbox import cli_args
from rollbox.errors import MissingExtraError, RollboxError
from rollbox.plugins import commands, get_plugin_manager

OPTIONAL_COMMANDS = {"k8s": ("the kubernetes commands", "kubernetes"),
                     "openhands": ("the OpenHands commands", "openhands")}
"""Subcommands an extra of the ``rollbox`` package adds: name → (what, extra)."""


def build_parser(
    pm: pluggy.PluginManager,
) -> tuple[argparse.ArgumentParser, dict[str, Callable[[argparse.Namespace], int]]]:
    """The ``rollbox`` parser with every registered subcommand, and their handlers."""
    parser = cli_args.CommandParser(
        prog="rollbox", description="Sandboxes for agentic RL and evaluation."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    handlers = {}
    for command in sorted(commands(pm), key=lambda c: c.name):
        command.configure(sub.add_parser(command.name, help=command.help))
        handlers[command.name] = command.run
    return parser, handlers


def main(argv: Sequence[str] | None = None) -> int:
    _open_standard_fds()
    args_list = list(sys.argv[1:] if argv is None else argv)
    try:
        parser, handlers = build_parser(get_plugin_manager())
    except RollboxError as exc:
        print(f"rollbox: {exc.message}", file=sys.stderr)
        return 2
    missing = _missing_optional_command(args_list, handlers)
    if missing is not None:
        print(f"rollbox: {missing.message}", file=sys.stderr)
        return 2
    args = parser.parse_args(args_list)
    try:
        return handlers[args.command](args)
    except RollboxError as exc:
        print(f"rollbox: {exc.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("rollbox: interrupted", file=sys.stderr)
        return 130


def _open_standard_fds() -> None:
    """Put /dev/null on any of fds 0-2 that was closed (``rollbox run ... >&-``): else the
    next pipe or file opened takes that number, and a child that writes to "stdout"
    writes into it."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            opened = os.open(os.devnull, os.O_RDWR)  # the lowest free number: fd itself
            if opened != fd:
                os.dup2(opened, fd)
                os.close(opened)
            os.set_inheritable(fd, True)  # helpers the backend starts inherit it


def _missing_optional_command(argv: list[str], handlers: Collection[str]
                              ) -> MissingExtraError | None:
    """``rollbox k8s`` without the kubernetes extra: say which extra adds it (argparse
    would only say ``invalid choice``)."""
    name = next((a for a in argv if not a.startswith("-")), None)
    if name in OPTIONAL_COMMANDS and name not in handlers:
        what, extra = OPTIONAL_COMMANDS[name]
        return MissingExtraError(f"`rollbox {name}` ({what})", extra)
    return None
