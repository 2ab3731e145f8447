"""``rollbox run`` and ``rollbox doctor``: their arguments and what each does with them."""

from __future__ import annotations

import argparse
import asyncio
import sys
from functools import partial
from typing import Any

from rollbox import cli_args
from rollbox.plugins import DEFAULT_BACKEND, backend_class, backend_names, get_plugin_manager
from rollbox.spec import MiB, Network, SandboxSpec, Timeouts

from rollbox_tools import terminal


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
                        default=SandboxSpec().output_limit_bytes / MiB,
                        help="keep at most this many MiB of stdout and of stderr; more is "
                             "cut, said on stderr, and a command that exited 0 exits "
                             f"{terminal.EXIT_OUTPUT_CUT}")
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
    cap = max(1, int(args.max_output * MiB))
    name = "remote" if args.url else args.backend
    backend = backend_class(get_plugin_manager(), name)
    options: dict[str, Any] = {"url": args.url} if args.url else {}
    return asyncio.run(terminal.run_command(partial(backend, **options), spec, cmd, cap))


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

