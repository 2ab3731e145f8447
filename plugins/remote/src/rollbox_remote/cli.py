"""``rollbox ps``: what a ``rollbox serve`` server holds."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any
from urllib.parse import quote

from rollbox_remote.backend import RemoteBackend


def configure_ps(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default=None,
                        help="the server (default: $ROLLBOX_URL or the default socket)")
    parser.add_argument("--owner", default=None, help="only this owner's sandboxes")
    parser.add_argument("--json", action="store_true", help="print JSON")


def ps(args: argparse.Namespace) -> int:
    """The sandboxes a ``rollbox serve`` server holds."""
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
