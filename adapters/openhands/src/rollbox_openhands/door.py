"""``Door``: an address for an agent-server that is still booting.

OpenHands' clients take the agent-server's URL and session key from the ``/start``
answer and keep them, while the agent-server may still be booting in a sandbox that
does not exist yet (a cold start). A door is a listener on the host's 127.0.0.1 made at
``/start``: once the agent-server is up, each connection to it is relayed to the
sandbox's ``Endpoint`` (``lead_to``); before that, connections are closed (the clients
only connect once the runtime reads ``running``/``ready``).
"""

from __future__ import annotations

import asyncio

from rollbox.relay import LoopbackListener, splice, streams
from rollbox.sandbox import Endpoint


class Door:
    def __init__(self) -> None:
        self._to: Endpoint | None = None
        self._listener = LoopbackListener(self._relay)

    async def open(self) -> str:
        """Start listening; the URL clients use."""
        await self._listener.start()
        return self._listener.url

    def lead_to(self, endpoint: Endpoint) -> None:
        self._to = endpoint

    async def close(self) -> None:
        """Stop listening and cut every connection it carries."""
        await self._listener.aclose()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        endpoint = self._to
        if endpoint is None:
            return  # not up yet: the listener closes the connection
        inner_reader, inner_writer = await asyncio.open_connection(endpoint.host, endpoint.port)
        await splice(streams(reader, writer), streams(inner_reader, inner_writer))
