"""The ``rollbox`` command. Subcommands come from plugins (``rollbox_register_commands``)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence

from rollbox.errors import CommandNotFoundError, ExecTimeoutError, RollboxError
from rollbox.plugins import backend_class, backend_names, commands, get_plugin_manager
from rollbox.spec import Network, SandboxSpec, Timeouts

EXIT_TIMEOUT = 124  # as timeout(1)
EXIT_NOT_FOUND = 127  # as a shell


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="rollbox", description="Sandboxes for agentic RL and evaluation."
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    try:
        registered = commands(get_plugin_manager())
    except RollboxError as exc:
        print(f"rollbox: {exc.message}", file=sys.stderr)
        return 2
    handlers = {}
    for command in sorted(registered, key=lambda c: c.name):
        command.configure(sub.add_parser(command.name, help=command.help,
                                         description=command.help))
        handlers[command.name] = command.run
    args = parser.parse_args(argv)
    try:
        return handlers[args.command](args)
    except RollboxError as exc:
        print(f"rollbox: {exc.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("rollbox: interrupted", file=sys.stderr)
        return 130


def add_backend_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--backend", default=os.environ.get("ROLLBOX_BACKEND", "local"),
        help="backend to use (default: $ROLLBOX_BACKEND or 'local')",
    )


def configure_run(parser: argparse.ArgumentParser) -> None:
    add_backend_option(parser)
    parser.add_argument("--image", default="host", help="image reference (default: host)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds (exit 124 past it)")
    parser.add_argument("--network", choices=[n.value for n in Network], default="none",
                        help="network reach of the sandbox (default: none)")
    parser.add_argument("--workdir", default="/", help="working directory inside the sandbox")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")


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
    return asyncio.run(_run(args.backend, spec, cmd))


async def _run(backend_name: str, spec: SandboxSpec, cmd: list[str]) -> int:
    backend = backend_class(get_plugin_manager(), backend_name)()
    async with backend:
        sandbox = await backend.create(spec)
        async with sandbox:
            try:
                if backend.capabilities.streaming:
                    process = await sandbox.stream(cmd)
                    async for chunk in process:
                        out = sys.stdout if chunk.stream == "stdout" else sys.stderr
                        out.buffer.write(chunk.data)
                        out.flush()
                    code = await process.wait()
                else:
                    result = await sandbox.exec(cmd)
                    sys.stdout.buffer.write(result.stdout)
                    sys.stderr.buffer.write(result.stderr)
                    code = result.exit_code
            except CommandNotFoundError as exc:
                print(f"rollbox: {exc.message}", file=sys.stderr)
                return EXIT_NOT_FOUND
            except ExecTimeoutError as exc:
                sys.stdout.buffer.write(exc.stdout)
                sys.stderr.buffer.write(exc.stderr)
                print(f"rollbox: timed out after {exc.timeout_s}s", file=sys.stderr)
                return EXIT_TIMEOUT
    return 128 - code if code < 0 else code


def configure_doctor(parser: argparse.ArgumentParser) -> None:
    add_backend_option(parser)
    parser.add_argument("--clean", action="store_true",
                        help="first remove what crashed (killed) processes of this backend "
                             "left behind: directories, snapshots, cgroups")


def doctor(args: argparse.Namespace) -> int:
    pm = get_plugin_manager()
    print(f"backends installed: {', '.join(backend_names(pm))}")
    chosen = backend_class(pm, args.backend)
    if args.clean:
        removed = chosen.clean()
        for item in removed:
            print(f"removed {item}")
        print(f"cleaned: {len(removed)} leftover(s) of dead {args.backend} backends")
    checks = chosen.doctor()
    failed = False
    for check in checks:
        mark = "ok  " if check.ok else ("FAIL" if check.required else "warn")
        print(f"[{mark}] {check.check}: {check.detail}")
        if not check.ok and check.fix:
            print(f"       fix: {check.fix}")
        failed |= check.required and not check.ok
    print(f"backend {args.backend!r} {'cannot' if failed else 'can'} run here")
    return 1 if failed else 0
