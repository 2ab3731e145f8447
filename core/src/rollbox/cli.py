"""The ``rollbox`` command. Subcommands come from plugins (``rollbox_register_commands``)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Callable, Collection, Sequence
from functools import partial
from typing import Any

import pluggy

from rollbox import cli_args, cli_run
from rollbox.errors import MissingExtraError, RollboxError
from rollbox.plugins import (
    DEFAULT_BACKEND,
    backend_class,
    backend_names,
    commands,
    get_plugin_manager,
)
from rollbox.spec import Network, SandboxSpec, Timeouts

OPTIONAL_COMMANDS = {"k8s": ("the kubernetes commands", "kubernetes")}
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


def add_backend_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--backend", type=cli_args.nonempty,
        help=f"backend to use (default: $ROLLBOX_BACKEND, else {DEFAULT_BACKEND!r})",
    )


def configure_run(parser: argparse.ArgumentParser) -> None:
    add_backend_option(parser)
    parser.add_argument("--image", type=cli_args.nonempty, default="host",
                        help="image: a name from `rollbox images ls`, a path to an OCI "
                             "layout, docker-save tar or directory, or host")
    parser.add_argument("--timeout", type=cli_args.positive, default=Timeouts().exec_s,
                        metavar="SECONDS",
                        help="kill the command and exit 124 after this many seconds")
    parser.add_argument("--url", default=None,
                        help="run through the rollbox server at URL (the remote backend; "
                             "token from $ROLLBOX_TOKEN or the server's token file)")
    parser.add_argument("--network", choices=[n.value for n in Network], default="none",
                        help="network reach of the sandbox")
    parser.add_argument("--workdir", type=cli_args.absolute, default="/",
                        help="working directory inside the sandbox")
    parser.add_argument("--max-output", type=cli_args.positive, metavar="MIB",
                        default=SandboxSpec().output_limit_bytes / cli_run.MiB,
                        help="keep at most this many MiB of stdout and of stderr; more is "
                             "cut, said on stderr, and a command that exited 0 exits "
                             f"{cli_run.EXIT_OUTPUT_CUT}")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD [ARGS...]",
                        help="the command; stdin is passed to it")


def run(args: argparse.Namespace) -> int:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        print("rollbox run: give a command after --, e.g. rollbox run -- echo hi", file=sys.stderr)
        return 2
    spec = SandboxSpec(
        image=args.image, network=Network(args.network), workdir=args.workdir,
        timeouts=Timeouts(exec_s=args.timeout),
    )
    cap = max(1, int(args.max_output * cli_run.MiB))
    name = "remote" if args.url else args.backend
    backend = backend_class(get_plugin_manager(), name)
    options: dict[str, Any] = {"url": args.url} if args.url else {}
    return asyncio.run(cli_run.run_command(partial(backend, **options), spec, cmd, cap))


def configure_doctor(parser: argparse.ArgumentParser) -> None:
    add_backend_option(parser)
    parser.add_argument("--clean", action="store_true",
                        help="first remove what crashed (killed) processes of this backend "
                             "left behind: directories, snapshots, cgroups")


def doctor(args: argparse.Namespace) -> int:
    pm = get_plugin_manager()
    print(f"backends installed: {', '.join(backend_names(pm))}")
    backend = backend_class(pm, args.backend)
    if args.clean:
        removed = backend.clean()
        for item in removed:
            print(f"removed {item}")
        print(f"cleaned: {len(removed)} leftover(s) of dead {backend.name} backends")
    checks = backend.doctor()
    failed = [check for check in checks if check.required and not check.ok]
    for check in checks:
        mark = "ok  " if check.ok else ("FAIL" if check.required else "warn")
        print(f"[{mark}] {check.check}: {check.detail}")
        if not check.ok and check.fix:
            print(f"       fix: {check.fix}")
    verdict = "cannot" if failed else "can"
    print(f"backend {backend.name!r} {verdict} run here")
    return 1 if failed else 0

