"""``rollbox openhands serve``: the Runtime API over HTTP (aiohttp), on a rollbox pool.

    rollbox openhands serve --port 8420 --api-key KEY --warm 2

then point OpenHands at it: the app server with ``RUNTIME=remote``,
``SANDBOX_REMOTE_RUNTIME_API_URL=http://127.0.0.1:8420`` and ``SANDBOX_API_KEY=KEY``; the
SDK's ``APIRemoteWorkspace(runtime_api_url=..., runtime_api_key=KEY, server_image=...)``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import secrets
import signal
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from aiohttp import web
from rollbox import Pool, open_backend
from rollbox.errors import UsageError
from rollbox.policies import PoolPolicy
from rollbox.spec import Network, SandboxSpec

from rollbox_openhands.agent_servers import AgentServers
from rollbox_openhands.runtime_api import RuntimeAPI


class WarmTargets(PoolPolicy):
    """A pool policy that keeps warm what ``AgentServers`` asks for (``want_warm``), and
    one more of a kind for a sandbox given back: it is reset in place and waits, rather
    than closed while the filler boots a new one."""

    name = "openhands"

    def __init__(self) -> None:
        self.targets: dict[SandboxSpec, int] = {}

    def warm_target(self, spec: SandboxSpec) -> int:
        return self.targets.get(spec, 0)

    def max_idle(self, spec: SandboxSpec) -> int:
        target = self.targets.get(spec, 0)
        return target + 1 if target else 0


def agent_servers_on(pool: Pool, **options: Any) -> AgentServers:
    """``AgentServers`` over a pool of their own (made with ``WarmTargets``)."""
    policy = pool.policy
    if not isinstance(policy, WarmTargets):
        raise UsageError("agent_servers_on needs a Pool(policy=WarmTargets())")

    def want_warm(targets: Mapping[SandboxSpec, int]) -> None:
        before = list(policy.targets)
        policy.targets = dict(targets)
        pool.upcoming(list(dict.fromkeys([*targets, *before])))

    return AgentServers(pool, want_warm, **options)


def make_app(api: RuntimeAPI, middlewares: Sequence[Any] = ()) -> web.Application:
    """An aiohttp application answering every path with ``api`` (``rollbox openhands
    serve`` serves it at its root; ``rollbox serve --face openhands`` mounts it)."""

    async def handle(request: web.Request) -> web.Response:
        # The path below wherever the app is mounted.
        path = "/" + request.match_info["tail"]
        reply = await api.handle(request.method, path, list(request.query.items()),
                                 request.headers, await request.read())
        return web.Response(status=reply.status, body=reply.encode(),
                            content_type="application/json")

    app = web.Application(client_max_size=4 * 1024 * 1024, middlewares=middlewares)
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


@contextlib.asynccontextmanager
async def serving(api: RuntimeAPI, host: str, port: int) -> AsyncIterator[str]:
    """Serve ``api`` on ``host:port`` (0: any free port); yields the base URL."""
    runner = web.AppRunner(make_app(api), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    try:
        bound = runner.addresses[0][1]
        yield f"http://{host}:{bound}"
    finally:
        await runner.cleanup()


def parse_forward(values: list[str]) -> dict[int, tuple[str, int]]:
    """``["8080", "9000=10.0.0.5:443"]`` -> {8080: ("127.0.0.1", 8080), 9000: (...)}."""
    forward: dict[int, tuple[str, int]] = {}
    for value in values:
        inside, _, outside = value.partition("=")
        host, _, port = (outside or f"127.0.0.1:{inside}").rpartition(":")
        if not (inside.isdigit() and port.isdigit() and host):
            raise UsageError(f"--forward {value!r}: use PORT or PORT=HOST:PORT")
        forward[int(inside)] = (host.strip("[]"), int(port))
    return forward


def run_serve(args: argparse.Namespace) -> int:
    api_key = args.api_key or secrets.token_urlsafe(24)
    if not args.api_key:
        print(f"X-API-Key: {api_key}", file=sys.stderr)
    return asyncio.run(_serve(args, api_key))


async def _serve(args: argparse.Namespace, api_key: str) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    async with (
        open_backend(args.backend) as backend,
        Pool(backend, policy=WarmTargets(), max_sandboxes=args.max_sandboxes) as pool,
        agent_servers_on(pool, warm=args.warm, network=Network(args.network),
                         forward=parse_forward(args.forward),
                         log_dir=Path(args.agent_logs) if args.agent_logs else None) as servers,
        serving(RuntimeAPI(servers, api_key), args.host, args.port) as url,
    ):
        print(f"OpenHands Runtime API on {url}", file=sys.stderr, flush=True)
        await stop.wait()
    return 0
