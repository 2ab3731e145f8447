"""The Runtime API as a face of ``rollbox serve``: ``rollbox serve --face openhands``.

    rollbox serve --listen 127.0.0.1:8420 --face openhands

answers the OpenHands Runtime API under ``/openhands`` (``SANDBOX_REMOTE_RUNTIME_API_URL``
/ ``runtime_api_url`` = ``http://127.0.0.1:8420/openhands``) beside the remote backend's
API, on the server's one pool: agent-servers and ``ROLLBOX_BACKEND=remote`` clients
share its sandboxes, limits and metrics. The handlers are ``rollbox openhands serve``'s
(``RuntimeAPI``, ``AgentServers``); only the pool and the warm targets are the server's.

The face reads its settings from the environment of ``rollbox serve``:

- ``ROLLBOX_OPENHANDS_API_KEY``: the ``X-API-Key`` OpenHands sends (default: the
  server's token; a key of its own gives OpenHands the Runtime API and nothing else);
- ``ROLLBOX_OPENHANDS_WARM``: booted agent-servers kept per kind of ``/start`` (1);
- ``ROLLBOX_OPENHANDS_FORWARD``: ``PORT[=HOST:PORT]``, comma-separated (the LLM's);
- ``ROLLBOX_OPENHANDS_NETWORK``: ``none`` (default) or ``host``;
- ``ROLLBOX_OPENHANDS_AGENT_LOGS``: a directory for each agent-server's output.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web
from rollbox.errors import InvalidSettingError
from rollbox.pool import Pool
from rollbox.spec import Network, SandboxSpec

from rollbox_openhands.agent_servers import AgentServers, WantWarm
from rollbox_openhands.runtime_api import RuntimeAPI
from rollbox_openhands.server import make_app, parse_forward

if TYPE_CHECKING:
    from rollbox_serve.server import Server

PREFIX = "/openhands"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
OWNER = "openhands"
"""The server's client name for the face's warm targets."""


def attach(server: Server) -> None:
    """Mount the Runtime API on ``server`` (called by ``rollbox serve --face openhands``)."""
    from rollbox_serve.demand import ClientState

    def want_warm(targets: Mapping[SandboxSpec, int]) -> None:
        server.update_client(OWNER, ClientState(owner=OWNER, wishes=dict(targets)))

    servers = _agent_servers(server.pool, want_warm, os.environ)
    api = RuntimeAPI(servers, os.environ.get("ROLLBOX_OPENHANDS_API_KEY") or server.token)

    @web.middleware
    async def heard(request: web.Request, handler: Handler) -> web.StreamResponse:
        server.heard_from(OWNER)  # keeps the warm targets while OpenHands calls
        return await handler(request)

    app = make_app(api, middlewares=[heard])

    async def close(_: web.Application) -> None:
        await servers.aclose()

    app.on_cleanup.append(close)
    server.add_face(PREFIX, app)


def _agent_servers(pool: Pool, want_warm: WantWarm, env: Mapping[str, str]) -> AgentServers:
    warm = env.get("ROLLBOX_OPENHANDS_WARM", "1")
    if not warm.isdigit():
        raise InvalidSettingError(f"ROLLBOX_OPENHANDS_WARM={warm!r}: give a count (0, 1, 2, ...)",
                                  variable="ROLLBOX_OPENHANDS_WARM")
    network = env.get("ROLLBOX_OPENHANDS_NETWORK", "none")
    if network not in {n.value for n in Network}:
        raise InvalidSettingError(f"ROLLBOX_OPENHANDS_NETWORK={network!r}: none or host",
                                  variable="ROLLBOX_OPENHANDS_NETWORK")
    forward = [v.strip() for v in env.get("ROLLBOX_OPENHANDS_FORWARD", "").split(",")
               if v.strip()]
    logs = env.get("ROLLBOX_OPENHANDS_AGENT_LOGS")
    return AgentServers(pool, want_warm, warm=int(warm), network=Network(network),
                        forward=parse_forward(forward), log_dir=Path(logs) if logs else None)
