"""Where a client finds a server, and the token for it, when nothing is given.

``rollbox serve`` listens on ``$ROLLBOX_HOME/serve/serve.sock`` and writes its token to
``$ROLLBOX_HOME/serve/token`` (0600) by default, so a client of the same user on the
same machine needs no setting at all; anything else is ``ROLLBOX_URL`` and
``ROLLBOX_TOKEN`` (or ``ROLLBOX_TOKEN_FILE``).
"""

from __future__ import annotations

import os
from pathlib import Path

from rollbox.errors import UsageError
from rollbox.paths import default_home


def serve_dir() -> Path:
    """The default state directory of ``rollbox serve``."""
    return default_home() / "serve"


def default_url() -> str:
    return os.environ.get("ROLLBOX_URL") or f"unix:{serve_dir() / 'serve.sock'}"


def default_token_file() -> Path:
    return Path(os.environ.get("ROLLBOX_TOKEN_FILE") or serve_dir() / "token")


def resolve_token(token: str | None, token_file: str | Path | None, *,
                  local: bool = False) -> str:
    """``token``, else ``$ROLLBOX_TOKEN``, else the first line of ``token_file`` (default
    ``$ROLLBOX_TOKEN_FILE`` or the server's default token file). ``local``: the server is
    this machine's default one, so a missing default token file means none has run."""
    if token:
        return token
    if env := os.environ.get("ROLLBOX_TOKEN"):
        return env
    path = Path(token_file) if token_file is not None else default_token_file()
    try:
        found = path.read_text().strip()
    except FileNotFoundError:
        if local and token_file is None and not os.environ.get("ROLLBOX_TOKEN_FILE"):
            raise UsageError(
                f"no rollbox server has run here (no token at {path}): start one with "
                "`rollbox serve`, or reach yours with ROLLBOX_URL and ROLLBOX_TOKEN (or "
                "ROLLBOX_TOKEN_FILE)") from None
        raise UsageError(f"no token for the rollbox server: {path} does not exist; set "
                         "ROLLBOX_TOKEN or ROLLBOX_TOKEN_FILE (`rollbox serve` prints where "
                         "it wrote its token)") from None
    except OSError as exc:
        raise UsageError(
            f"no token for the rollbox server: cannot read {path} ({exc.strerror}); set "
            "ROLLBOX_TOKEN or ROLLBOX_TOKEN_FILE (`rollbox serve` prints where it wrote its "
            "token; in Python, RemoteBackend(token=...))"
        ) from None
    if not found:
        raise UsageError(f"the token file {path} is empty")
    return found
