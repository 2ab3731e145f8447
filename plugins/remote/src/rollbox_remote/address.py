"""Where a rollbox server listens: a unix socket, or TCP (with TLS for ``https``).

Accepted forms: ``unix:/path/to.sock`` (also ``unix:///path`` and
``http+unix://%2Fpath%2Fto.sock``), ``http://HOST:PORT``, ``https://HOST:PORT``, and,
for ``rollbox serve --listen``, a bare ``HOST:PORT``.
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass
from typing import Literal
from urllib.parse import unquote, urlsplit

from rollbox.errors import UsageError


@dataclass(frozen=True)
class Address:
    scheme: Literal["unix", "http", "https"]
    host: str = ""
    port: int = 0
    path: str = ""
    """The socket file of a ``unix`` address."""

    @classmethod
    def parse(cls, url: str) -> Address:
        """The address ``url`` names; UsageError saying the accepted forms if none."""
        text = url.strip()
        if text.startswith("unix:"):
            path = text[len("unix:"):]
            if path.startswith("//"):
                path = path[2:]
            return cls._unix(path, url)
        if text.startswith("http+unix://"):
            return cls._unix(unquote(text[len("http+unix://"):].split("/", 1)[0]), url)
        if "://" not in text:
            text = f"http://{text}"
        try:  # urlsplit raises on a malformed [IPv6] host, .port on a bad port
            parts = urlsplit(text)
            port = parts.port
        except ValueError:
            raise _bad(url) from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise _bad(url)
        if parts.path not in ("", "/") or parts.query:
            raise UsageError(f"rollbox server URL {url!r} must not have a path or query")
        scheme: Literal["http", "https"] = "https" if parts.scheme == "https" else "http"
        if port is None:  # an explicit port 0 stays 0: a server picks a free port
            port = 443 if scheme == "https" else 80
        return cls(scheme, parts.hostname, port)

    @classmethod
    def _unix(cls, path: str, url: str) -> Address:
        if not path.startswith("/"):
            raise _bad(url)
        return cls("unix", path=path)

    @property
    def host_header(self) -> str:
        if self.scheme == "unix":
            return "localhost"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def __str__(self) -> str:
        if self.scheme == "unix":
            return f"unix:{self.path}"
        return f"{self.scheme}://{self.host_header}"

    async def connect(
        self, ssl_context: ssl.SSLContext | None
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A new connection (raises OSError when nothing answers)."""
        limit = 1 << 20
        if self.scheme == "unix":
            return await asyncio.open_unix_connection(self.path, limit=limit)
        tls = (ssl_context or ssl.create_default_context()) if self.scheme == "https" else None
        return await asyncio.open_connection(self.host, self.port, ssl=tls, limit=limit)


def _bad(url: str) -> UsageError:
    return UsageError(
        f"cannot read the rollbox server address {url!r}: use unix:/path/to.sock, "
        "http://HOST:PORT or https://HOST:PORT"
    )
