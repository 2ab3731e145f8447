"""``rollbox openhands build-image | serve``: the arguments (kept light: every ``rollbox``
command loads them; aiohttp and the server are imported only to run ``serve``)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from rollbox.cli_commands import Command
from rollbox.errors import UsageError
from rollbox.spec import Network

API_KEY_VARIABLE = "ROLLBOX_OPENHANDS_API_KEY"


def openhands_command() -> Command:
    return Command("openhands", "Run OpenHands on rollbox sandboxes.", configure, run)


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="openhands_action", metavar="ACTION", required=True)
    build = sub.add_parser(
        "build-image", help="build an agent-server image from PyPI (no registry) and import "
        "it into the local image store")
    build.add_argument("--name", default=None,
                       help="image name to import it as (default: "
                            "openhands-agent-server:VERSION); '' to skip the import")
    build.add_argument("--version", default=None,
                       help="openhands-agent-server / -tools / -sdk version (default: 1.58.2)")
    build.add_argument("--python", default=None,
                       help="a Python >= 3.12 to copy into the image (default: this one if "
                            ">= 3.12, else python3.13 / python3.12 on PATH)")
    build.add_argument("--output", default=None,
                       help="OCI layout directory to write (default: "
                            "$ROLLBOX_HOME/openhands/images/NAME)")
    build.add_argument("--chromium", action="store_true",
                       help="add Debian's chromium (the app server's browser tool needs it)")
    build.add_argument("--package", action="append", default=[],
                       help="a requirement to install instead of the default three "
                            "(repeatable)")
    serve = sub.add_parser(
        "serve", help="serve the OpenHands Runtime API (RUNTIME=remote, APIRemoteWorkspace) "
        "over rollbox sandboxes")
    _configure_serve(serve)


def _configure_serve(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8420, help="port (default 8420)")
    parser.add_argument("--api-key", default=os.environ.get(API_KEY_VARIABLE),
                        help=f"the X-API-Key clients send (default: ${API_KEY_VARIABLE}; "
                             "generated and printed if unset)")
    parser.add_argument("--warm", type=int, default=1,
                        help="booted agent-servers kept ready per kind of /start (default 1)")
    parser.add_argument("--backend", default=os.environ.get("ROLLBOX_BACKEND", "local"),
                        help="rollbox backend (default: $ROLLBOX_BACKEND or 'local')")
    parser.add_argument("--max-sandboxes", type=int, default=None,
                        help="at most this many sandboxes at once (default: no limit)")
    parser.add_argument("--agent-logs", default=None, metavar="DIR",
                        help="write each agent-server's output to DIR/agent-server-SANDBOX.log")
    parser.add_argument("--network", choices=[n.value for n in Network], default="none",
                        help="the agent-servers' network: none (default; reached through "
                             "rollbox, out only through --forward) or host")
    parser.add_argument("--forward", action="append", default=[], metavar="PORT[=HOST:PORT]",
                        help="make 127.0.0.1:PORT inside every sandbox lead to HOST:PORT "
                             "outside (default 127.0.0.1:PORT): the LLM endpoint, say "
                             "(repeatable)")


def run(args: argparse.Namespace) -> int:
    if args.openhands_action == "build-image":
        return _build_image(args)
    from rollbox_openhands.server import run_serve

    return run_serve(args)


def _build_image(args: argparse.Namespace) -> int:
    from rollbox.paths import default_home

    from rollbox_openhands.image import DEFAULT_VERSION, BuildRequest, build, find_python

    version = args.version or DEFAULT_VERSION
    name = f"openhands-agent-server:{version}" if args.name is None else args.name
    output = Path(args.output) if args.output else (
        default_home() / "openhands" / "images" / (name or f"agent-server-{version}")
        .replace("/", "_").replace(":", "_"))
    python = find_python(args.python)
    print(f"building {output} with {python} (agent-server {version}"
          f"{', chromium' if args.chromium else ''}) ...", file=sys.stderr)
    build(BuildRequest(output=output, python=python, version=version,
                       packages=tuple(args.package), chromium=args.chromium))
    if not name:
        print(output)
        return 0
    if os.environ.get("ROLLBOX_BACKEND", "local") != "local":
        raise UsageError("build-image imports into the local backend's store; with another "
                         "backend pass --name '' and push the OCI layout to its registry")
    from rollbox_local.images import ImageStore

    image = ImageStore.default().import_path(output, name)
    print(f"{name}\t{image.digest}\t{output}")
    return 0
