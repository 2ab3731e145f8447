"""``rollbox openhands build-image | serve``."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from rollbox.cli_commands import Command
from rollbox.errors import UsageError


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
    from rollbox_openhands.server import configure_serve

    configure_serve(serve)


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
