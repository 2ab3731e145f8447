"""``rollbox serve``: run a server until SIGINT or SIGTERM, then close everything."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import ssl
import sys
from pathlib import Path

from rollbox.errors import UsageError
from rollbox.plugins import backend_class, get_plugin_manager, serve_faces
from rollbox_remote.address import Address
from rollbox_remote.settings import serve_dir

from rollbox_serve import statedir


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--listen", default=None, metavar="unix:PATH|HOST:PORT",
                        help="where to listen (default: unix:STATE_DIR/serve.sock); "
                             "HOST:PORT listens on TCP, with TLS if --tls-cert is given")
    parser.add_argument("--backend", default=None,
                        help="backend to serve (default: $ROLLBOX_BACKEND or 'local')")
    parser.add_argument("--token-file", default=None, type=Path,
                        help="token file: used if it exists (mode 0600), else a new token "
                             "is written there (default: STATE_DIR/token); $ROLLBOX_TOKEN "
                             "gives the token directly")
    parser.add_argument("--state-dir", default=None, type=Path,
                        help="pid file, default socket and token (default: "
                             "$ROLLBOX_HOME/serve)")
    parser.add_argument("--idle-ttl", type=float, default=600.0, metavar="SECONDS",
                        help="take back sandboxes no request touched for this long "
                             "(default %(default)s)")
    parser.add_argument("--max-idle", type=int, default=2,
                        help="sandboxes a release keeps warm per spec beyond what clients "
                             "ask to keep warm (default %(default)s)")
    parser.add_argument("--pool-idle", type=float, default=60.0, metavar="SECONDS",
                        help="how long such surplus stays warm (default %(default)s)")
    parser.add_argument("--max-sandboxes", type=int, default=None,
                        help="most sandboxes at once, held and warm (default: no limit)")
    parser.add_argument("--create-rate", type=float, default=None,
                        help="creates per second at most (default: no limit)")
    parser.add_argument("--max-file-mb", type=float, default=1024.0,
                        help="largest file a client may write (default %(default)s)")
    parser.add_argument("--tls-cert", type=Path, default=None, help="PEM certificate")
    parser.add_argument("--tls-key", type=Path, default=None, help="PEM private key")
    parser.add_argument("--face", action="append", default=[], metavar="NAME",
                        help="also serve this API (a face a plugin registers, e.g. "
                             "openhands); repeatable")
    parser.add_argument("--log-level", default="INFO", help="default %(default)s")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s rollbox serve: %(message)s")
    return asyncio.run(serve(args))


async def serve(args: argparse.Namespace) -> int:
    backend_name = args.backend or os.environ.get("ROLLBOX_BACKEND") or "local"
    if backend_name == "remote":
        raise UsageError("rollbox serve cannot serve the remote backend (itself); pass "
                         "--backend local or unset ROLLBOX_BACKEND")
    state = args.state_dir or serve_dir()
    listen = Address.parse(args.listen or f"unix:{state / 'serve.sock'}")
    context = _tls(args, listen)
    if listen.scheme == "http" and context is not None:
        listen = Address("https", listen.host, listen.port)
    if listen.scheme != "unix" and context is None and listen.host not in (
            "127.0.0.1", "localhost", "::1"):
        print(f"rollbox serve: warning: {listen} is not loopback and has no TLS: the token "
              "and everything else cross the network in clear text", file=sys.stderr)
    pm = get_plugin_manager()
    faces = serve_faces(pm)
    unknown = sorted(set(args.face) - set(faces))
    if unknown:
        raise UsageError(f"no rollbox serve face named {', '.join(unknown)}; installed: "
                         f"{', '.join(sorted(faces)) or 'none'}")
    claim = statedir.claim(
        state, socket=Path(listen.path) if listen.scheme == "unix" else None,
        token_file=args.token_file or state / "token",
        token=os.environ.get("ROLLBOX_TOKEN") or None)
    from rollbox_serve.server import Server  # aiohttp: not for every `rollbox` command

    try:
        backend = backend_class(pm, backend_name)()
        server = Server(backend, token=claim.token, idle_ttl_s=args.idle_ttl,
                        max_idle=args.max_idle, pool_idle_s=args.pool_idle,
                        max_sandboxes=args.max_sandboxes,
                        create_rate=args.create_rate,
                        max_file_bytes=int(args.max_file_mb * 1024 * 1024))
        try:
            for name in args.face:
                faces[name](server)
            address = await server.start(listen, ssl_context=context)
            statedir.record_listen(claim, str(address))
            _announce(address, backend_name, claim)
            await _until_signalled()
            print("rollbox serve: shutting down, closing every sandbox", file=sys.stderr)
        finally:
            await server.aclose()
    finally:
        claim.release()
    return 0


def _tls(args: argparse.Namespace, listen: Address) -> ssl.SSLContext | None:
    if args.tls_cert is None:
        if args.tls_key is not None:
            raise UsageError("--tls-key needs --tls-cert")
        return None
    if listen.scheme == "unix":
        raise UsageError("TLS is for TCP: --listen HOST:PORT with --tls-cert")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(args.tls_cert, args.tls_key)
    except (OSError, ssl.SSLError) as exc:
        raise UsageError(f"cannot load the TLS certificate: {exc}") from None
    return context


def _announce(address: Address, backend: str, claim: statedir.Claim) -> None:
    where = f"token in {claim.token_file}" if claim.token_file and claim.generated else (
        f"token from {claim.token_file}" if claim.token_file else "token from $ROLLBOX_TOKEN")
    print(f"rollbox serve: {backend} backend on {address} ({where})", file=sys.stderr)
    print(f"  use it: ROLLBOX_BACKEND=remote ROLLBOX_URL={address} rollbox ...",
          file=sys.stderr, flush=True)


async def _until_signalled() -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
