"""The ``rollbox`` command. Subcommands come from plugins (``rollbox_register_commands``)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

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
    parser.add_argument("--url", default=None,
                        help="run through the rollbox server at URL (the remote backend; "
                             "token from $ROLLBOX_TOKEN or the server's token file)")
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
    options = {"url": args.url} if args.url else {}
    return asyncio.run(_run("remote" if args.url else args.backend, spec, cmd, options))


async def _run(backend_name: str, spec: SandboxSpec, cmd: list[str],
               options: dict[str, str]) -> int:
    backend = backend_class(get_plugin_manager(), backend_name)(**options)
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


def configure_ps(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default=None,
                        help="the server (default: $ROLLBOX_URL or the default socket)")
    parser.add_argument("--owner", default=None, help="only this owner's sandboxes")
    parser.add_argument("--json", action="store_true", help="print JSON")


def ps(args: argparse.Namespace) -> int:
    """The sandboxes a ``rollbox serve`` server holds."""
    from rollbox.remote import RemoteBackend

    async def listing(backend: RemoteBackend) -> list[dict[str, Any]]:
        query = f"?owner={quote(args.owner, safe='')}" if args.owner else ""
        try:
            found: list[dict[str, Any]] = await backend.call("GET", f"/sandboxes{query}")
        finally:
            await backend.http.aclose()
        return found

    backend = RemoteBackend(url=args.url)
    held = asyncio.run(listing(backend))
    if args.json:
        print(json.dumps({"server": backend.server, "sandboxes": held}, indent=2))
        return 0
    info = backend.server
    print(f"{backend.address}: {info.get('backend')} backend, {len(held)} held, "
          f"{info.get('idle')} warm")
    if held:
        print(f"{'ID':<37} {'OWNER':<24} {'IMAGE':<24} {'AGE':>7} {'IDLE':>7}  STATE")
    now = time.time()
    for s in held:
        state = f"busy ({s['busy']})" if s["busy"] else "idle"
        print(f"{s['id']:<37} {s['owner'][:24]:<24} {s['image'][:24]:<24} "
              f"{_age(now - s['created_at']):>7} {_age(s['idle_s']):>7}  {state}")
    return 0


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.0f}h"
