"""``Server``: one backend and its warm pool, shared by every client over HTTP.

    server = Server(LocalBackend(), token=token)
    await server.start("unix:/run/rollbox.sock")
    ...
    await server.aclose()     # closes every sandbox it holds, then the backend

The HTTP face is ``routes.py`` (the ``remote`` backend's protocol); other faces (e.g.
the OpenHands Runtime API) mount beside it with ``add_face`` and use the same methods
here: ``create``, ``release``, ``held``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import ssl
import time
from collections.abc import Iterator

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from rollbox.backend import Backend
from rollbox.errors import (
    RollboxError,
    SandboxError,
    UsageError,
)
from rollbox.pool import Outcome, Pool
from rollbox.spec import SandboxSpec
from rollbox_remote.address import Address

from rollbox_serve.demand import ClientState, SharedPolicy
from rollbox_serve.metrics import WindowMetrics
from rollbox_serve.registry import Held, Registry

log = logging.getLogger("rollbox.serve")
SHUTDOWN_GRACE_S = 1.0
"""How long requests in flight get to finish when the server stops, before their
sandboxes are closed under them (a command running then ends with the sandbox)."""


class _QuietBadRequests(logging.Filter):
    """aiohttp logs each malformed request a client sends at ERROR, with a traceback;
    the client gets its 400, and the server's log stays for the server's own errors."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not isinstance(error, HttpProcessingError)


_QUIET = _QuietBadRequests()


class Server:
    """Serves ``backend``'s sandboxes through one shared ``Pool``.

    ``idle_ttl_s``: a sandbox no request touched for this long is taken back (reset and
    kept for the next client), and a client silent for this long loses its warm
    targets. ``max_idle``: sandboxes a release keeps warm per spec beyond what clients
    asked to keep warm; ``pool_idle_s``: how long such surplus stays before it is closed.
    ``max_sandboxes``, ``create_rate``: the pool's limits. ``owns_backend``: close the
    backend on ``aclose``.
    """

    def __init__(
        self,
        backend: Backend,
        *,
        token: str,
        idle_ttl_s: float = 600.0,
        max_idle: int = 2,
        pool_idle_s: float = 60.0,
        max_sandboxes: int | None = None,
        create_rate: float | None = None,
        max_file_bytes: int = 1 << 30,
        owns_backend: bool = True,
    ) -> None:
        if not token:
            raise UsageError("the server needs a token")
        self.backend = backend
        self.token = token
        self.idle_ttl_s = idle_ttl_s
        self.pool_idle_s = pool_idle_s
        self.max_file_bytes = max_file_bytes
        self.owns_backend = owns_backend
        self.policy = SharedPolicy(max_idle=max_idle)
        self.metrics = WindowMetrics()
        self.pool = Pool(backend, policy=self.policy, max_sandboxes=max_sandboxes,
                         create_rate=create_rate, metrics=self.metrics)
        self.registry = Registry()
        self.requests: dict[tuple[str, int], int] = {}
        """Requests answered, by route and status (for /metrics)."""
        self.started_at = time.time()
        self.address: Address | None = None
        self.closed = False
        self._runner: web.AppRunner | None = None
        self._reaper: asyncio.Task[None] | None = None
        self._streams: set[asyncio.Task[object]] = set()
        self._targeted: set[SandboxSpec] = set()
        self._surplus: dict[SandboxSpec, int] = {}
        from rollbox_serve.routes import make_app

        self.app = make_app(self)

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self, listen: str | Address, *,
                    ssl_context: ssl.SSLContext | None = None) -> Address:
        """Listen on ``listen`` (a unix socket path is created 0600; TCP port 0 picks a
        free port) and return the address clients use."""
        if self._runner is not None:
            raise UsageError("the server is already listening; one address per server")
        address = listen if isinstance(listen, Address) else Address.parse(listen)
        logging.getLogger("aiohttp.server").addFilter(_QUIET)
        runner = web.AppRunner(self.app, access_log=None, handle_signals=False,
                               shutdown_timeout=SHUTDOWN_GRACE_S)
        await runner.setup()
        site: web.BaseSite
        if address.scheme == "unix":
            site = web.UnixSite(runner, address.path)
        else:
            if address.scheme == "https" and ssl_context is None:
                raise UsageError("an https address needs a certificate (--tls-cert/--tls-key)")
            site = web.TCPSite(runner, address.host, address.port, ssl_context=ssl_context)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise UsageError(f"cannot listen on {address}: {exc.strerror or exc}") from None
        if address.scheme == "unix":
            os.chmod(address.path, 0o600)
        else:
            port = runner.addresses[0][1]
            address = Address("https" if ssl_context is not None else "http",
                              address.host, port)
        self._runner = runner
        self.address = address
        self._reaper = asyncio.ensure_future(self._reap())
        return address

    async def aclose(self) -> None:
        """Stop listening, close every sandbox held or pooled and every snapshot, and
        the backend if this server owns it. Idempotent."""
        if self.closed:
            return
        self.closed = True
        if self._reaper is not None:
            self._reaper.cancel()
            await asyncio.gather(self._reaper, return_exceptions=True)
        for task in list(self._streams):
            task.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
        held, self.registry.held = list(self.registry.held.values()), {}
        forks = [h.sandbox for h in held if h.lease is None]
        await asyncio.gather(*(s.close() for s in forks), return_exceptions=True)
        await self.pool.close()
        snapshots, self.registry.snapshots = list(self.registry.snapshots.values()), {}
        await asyncio.gather(*(self.backend.drop_snapshot(s) for s in snapshots),
                             return_exceptions=True)
        if self.owns_backend:
            await self.backend.aclose()
        if self.address is not None and self.address.scheme == "unix":
            with contextlib.suppress(OSError):
                os.unlink(self.address.path)

    def authorized(self, presented: str | None) -> bool:
        """Whether ``presented`` is this server's token (constant time)."""
        return presented is not None and hmac.compare_digest(presented.encode(),
                                                             self.token.encode())

    def add_face(self, prefix: str, app: web.Application) -> None:
        """Mount another HTTP API at ``prefix`` (before ``start``). It checks its own
        credentials, with ``authorized``; the token middleware guards /v1 and /metrics."""
        self.app.add_subapp(prefix, app)

    # -- what the faces call -------------------------------------------------------------

    async def create(self, spec: SandboxSpec, owner: str, *, client: str = "",
                     timeout_s: float | None = None) -> Held:
        """A sandbox for ``owner`` from the shared pool (warm if one is ready)."""
        self._check_open()
        lease = await self.pool.acquire(spec, timeout=timeout_s)
        return self.registry.add(owner, spec, lease.sandbox, lease, client=client)

    async def fork(self, snapshot_handle: str, owner: str, *, client: str = "") -> Held:
        self._check_open()
        snapshot = self.registry.snapshot(snapshot_handle)
        sandbox = await self.backend.fork(snapshot)
        return self.registry.add(owner, snapshot.spec, sandbox, None, client=client)

    async def release(self, held: Held, *, broken: bool = False) -> None:
        """Take ``held`` back: into the pool, reset, if it is sound; else closed."""
        self.registry.held.pop(held.id, None)
        if held.lease is not None:
            await held.lease.release(Outcome.BROKEN if broken else Outcome.OK)
        else:
            with contextlib.suppress(RollboxError, OSError):
                await held.sandbox.close()

    def held(self, sandbox_id: str) -> Held:
        """The sandbox held under ``sandbox_id``; SandboxNotFoundError if none."""
        return self.registry.get(sandbox_id)

    @contextlib.contextmanager
    def working_on(self, held: Held) -> Iterator[Held]:
        """Around every operation on ``held``: busy (not reaped) meanwhile, and errors
        name the handle the client knows, not the backend's own id."""
        with self.registry.using(held):
            try:
                yield held
            except SandboxError as exc:
                if exc.sandbox_id is not None:
                    exc.sandbox_id = held.id
                raise

    async def endpoint(self, held: Held, port: int) -> tuple[str, int, dict[str, str]]:
        """(host, port, headers) where this server reaches ``port`` of ``held``
        (CapabilityNotSupportedError from a backend that cannot expose ports)."""
        found = held.endpoints.get(port)
        if found is None:
            found = held.endpoints[port] = await held.sandbox.endpoint(port)
        return found.host, found.port, dict(found.headers)

    def update_client(self, client: str, state: ClientState) -> None:
        """A client's warm targets and upcoming images (replacing its previous ones)."""
        state.seen = asyncio.get_running_loop().time()
        self.policy.update(client, state)
        self._retarget()

    def heard_from(self, client: str | None) -> None:
        """A request from ``client``: its warm targets stay while it is heard from."""
        state = self.policy.clients.get(client) if client else None
        if state is not None:
            state.seen = asyncio.get_running_loop().time()

    def forget_client(self, client: str) -> None:
        if self.policy.forget(client) is not None:
            self._retarget()

    def _retarget(self) -> None:
        """Start (or stop) warming after the clients' targets changed."""
        if self.closed:
            return
        specs = self.policy.specs
        self.pool.upcoming(list(dict.fromkeys([*specs, *self._targeted])))
        self._targeted = set(specs)
        self.backend.hint_upcoming(self.policy.images())

    async def settled(self, timeout_s: float = 30.0) -> None:
        """Return once the pool creates nothing (its warm sandboxes are all made)."""
        async with asyncio.timeout(timeout_s):
            while True:
                leased = sum(1 for h in self.registry.held.values() if h.lease is not None)
                if self.pool.live <= self.pool.idle_count() + leased:
                    return
                await asyncio.sleep(0.01)

    def _check_open(self) -> None:
        if self.closed:
            raise UsageError("the server is shutting down")

    def track(self, task: asyncio.Task[object]) -> None:
        """A streaming or tunnel handler, cancelled when the server closes."""
        self._streams.add(task)
        task.add_done_callback(self._streams.discard)

    async def drain_idle(self) -> None:
        """Close every warm sandbox of the pool (clients' targets are warmed again)."""
        for spec in self.pool.idle_specs:
            await self.pool.shrink(spec, 0)

    # -- reaping -------------------------------------------------------------------------

    async def _reap(self) -> None:
        period = min(max(min(self.idle_ttl_s / 4, self.pool_idle_s / 2), 0.05), 30.0)
        loop = asyncio.get_running_loop()
        swept = loop.time()
        while True:
            await asyncio.sleep(period)
            for held in self.registry.idle_past(self.idle_ttl_s):
                log.info("reaping %s of %s: idle for %.0fs", held.id, held.owner,
                         self.idle_ttl_s)
                self.metrics.count("reaped")
                await self.release(held)
            now = loop.time()
            for client, state in list(self.policy.clients.items()):
                if now - state.seen > self.idle_ttl_s:
                    self.forget_client(client)
            if now - swept >= self.pool_idle_s:
                swept = now
                await self._sweep()

    async def _sweep(self) -> None:
        """Close warm sandboxes beyond the clients' targets that stayed so for a whole
        sweep period (``pool_idle_s``): nobody asked for them again."""
        surplus = {spec: self.pool.idle_count(spec) - self.policy.warm_target(spec)
                   for spec in self.pool.idle_specs}
        for spec, now in surplus.items():
            stale = min(now, self._surplus.get(spec, 0))
            if stale > 0:
                await self.pool.shrink(spec, self.pool.idle_count(spec) - stale)
        self._surplus = {s: n for s, n in surplus.items() if n > 0}
