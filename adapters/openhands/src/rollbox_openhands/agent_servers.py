"""Agent-servers in rollbox sandboxes, booted ahead of need and reset in place.

Booting an agent-server (a Python process importing ~200 packages) takes seconds; a
``/start`` that finds one already booted answers at once. So, per *kind* of start (the
same image, command, working directory and environment: what the agent-server reads
when it boots), ``AgentServers`` keeps ``warm`` agent-servers booted and healthy. The
first ``/start`` of a kind boots one cold; from then on that kind is kept warm.

Sandboxes come from a rollbox ``Pool``: ``/stop`` gives the lease back, the pool resets
the sandbox in place (its writable layer dropped, every process killed), and the filler
boots the next agent-server in it — a reuse, not a new sandbox.

The session key. The agent-server reads its keys (``OH_SESSION_API_KEYS_0``) once, when
it boots, and ``/start`` must answer with the key, so the key of a pre-booted server is
fixed before anyone asks for it: rollbox generates one per boot (32 random bytes), hands
it to that agent-server's environment only, and keeps it with the booted server. Each
boot, and so each conversation after a reset, has a new key; nothing else in the
sandbox is told it (code running in the sandbox can read its own agent-server's
environment, as in OpenHands' own containers).

The network. By default a sandbox has none: the agent-server listens on its own
loopback at the port its command names (60000 as OpenHands sends it) and the host
reaches it through an ``Ingress`` (a listener on the host's 127.0.0.1, see
``rollbox_openhands.tunnel``); the agent-server reaches its LLM only through the ports
``forward`` names (an ``Egress``). With ``network="host"`` the sandbox shares the host's
network and each agent-server listens on a free host port instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
import uuid
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from rollbox.errors import CreateFailedError, ExecTimeoutError, RollboxError, SandboxError
from rollbox.pool import Lease, Outcome, Pool
from rollbox.sandbox import Process
from rollbox.spec import FrozenMap, Network, Resources, SandboxSpec, Timeouts

from rollbox_openhands.runtime_api import Runtime, StartRequest
from rollbox_openhands.tunnel import PYTHON, Egress, Ingress

_log = logging.getLogger(__name__)

KEY_VARIABLE = "OH_SESSION_API_KEYS_0"
SANDBOX_VARIABLE = "ROLLBOX_SANDBOX_ID"
"""The rollbox sandbox's id, in the agent-server's (and so its commands') environment."""
RUN_FOREVER_S = 365 * 24 * 3600.0
LOG_BYTES = 64 * 1024
DEFAULT_PORT = 8000
BASE_ENV = {
    # The sandbox has no route to the internet: litellm must not fetch its price list.
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "OPENHANDS_SUPPRESS_BANNER": "1",
}


@dataclass(frozen=True)
class Kind:
    """What makes two agent-servers interchangeable: everything they read at boot."""

    image: str
    command: tuple[str, ...]
    working_dir: str
    environment: FrozenMap
    resource_factor: int

    @classmethod
    def of(cls, request: StartRequest) -> Kind:
        return cls(request.image, request.command, request.working_dir,
                   FrozenMap(request.environment), request.resource_factor)


def agent_server_argv(command: Sequence[str], port: int) -> list[str]:
    """``command`` made to listen on 127.0.0.1:``port`` (its --host/--port replaced)."""
    argv: list[str] = []
    items = list(command)
    i = 0
    while i < len(items):
        arg = items[i]
        if arg in ("--port", "--host"):
            i += 2
            continue
        if arg.startswith(("--port=", "--host=")):
            i += 1
            continue
        argv.append(arg)
        i += 1
    return [*argv, "--host", "127.0.0.1", "--port", str(port)]


_SIGNAL_ALL = r"""
keep=" 1 $$ "; p=$PPID
while [ "$p" -gt 1 ]; do keep="$keep$p "; p=$(awk '/^PPid:/ {print $2}' /proc/$p/status); done
for d in /proc/[0-9]*; do
  p=${d#/proc/}
  case "$keep" in *" $p "*) ;; *) kill -"$1" "$p" 2>/dev/null ;; esac
done
exit 0
"""
"""Signal every process of the sandbox but its init and this command's own ancestry
(rollbox runs commands through them: they must keep answering)."""


_WAIT_HEALTHY = r"""
import socket, sys, time
while True:
    try:
        with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5) as s:
            s.sendall(b"GET /health HTTP/1.0\r\nHost: localhost\r\n\r\n")
            if s.recv(12)[9:12] == b"200":
                break
    except OSError:
        pass
    time.sleep(0.02)
"""
"""Run inside the sandbox: returns once the agent-server answers /health with 200."""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def command_port(command: Sequence[str]) -> int:
    """The port ``command`` asks the agent-server to listen on (its default: 8000)."""
    for i, arg in enumerate(command):
        value = command[i + 1] if arg == "--port" and i + 1 < len(command) else (
            arg.removeprefix("--port=") if arg.startswith("--port=") else None)
        if value is not None and value.isdigit() and 0 < int(value) < 65536:
            return int(value)
    return DEFAULT_PORT


@dataclass
class Exposure:
    """Where the host reaches one agent-server: ``url``, and the ``port`` it listens on
    inside its sandbox (on the host's network, a free host port; otherwise the port its
    command names, reached through an ``Ingress``)."""

    url: str
    port: int
    ingress: Ingress | None = None

    async def close(self) -> None:
        if self.ingress is not None:
            await self.ingress.close()


@dataclass
class Booted:
    """A running, healthy agent-server in a leased sandbox."""

    lease: Lease
    process: Process
    exposure: Exposure
    key: str
    logs: deque[bytes]
    drained: asyncio.Task[None]
    egress: Egress | None = None

    @property
    def url(self) -> str:
        return self.exposure.url


@dataclass
class _Active:
    runtime: Runtime
    kind: Kind
    booted: Booted | None = None
    booting: asyncio.Task[Booted] | None = None
    paused: bool = False


class AgentServers:
    """The ``Runtimes`` the Runtime API serves: agent-servers on a rollbox pool."""

    def __init__(self, pool: Pool, *, warm: int = 1, public_host: str = "127.0.0.1",
                 boot_timeout: float = 180.0, memory_mb: int = 8192,
                 network: Network = Network.NONE,
                 forward: Mapping[int, tuple[str, int]] | None = None,
                 log_dir: Path | None = None) -> None:
        self.pool = pool
        self.warm = warm
        self.public_host = public_host
        self.boot_timeout = boot_timeout
        self.memory_mb = memory_mb
        self.network = network
        self.log_dir = log_dir
        """Where each agent-server's output goes (one file per sandbox), if set."""
        self.forward = dict(forward or {})
        """Ports inside every sandbox that lead to (host, port) outside: the LLM's, say
        (only with ``network="none"``; on the host's network everything is reachable)."""
        self._ready: dict[Kind, deque[Booted]] = {}
        self._filling: dict[Kind, asyncio.Task[None]] = {}
        self._active: dict[str, _Active] = {}  # by runtime id
        self._sessions: dict[str, str] = {}  # session id -> runtime id
        self._http: aiohttp.ClientSession | None = None
        self._closed = False

    # -- the Runtimes protocol ---------------------------------------------------------

    async def start(self, request: StartRequest) -> Runtime:
        if self._closed:
            raise CreateFailedError("the Runtime API is shutting down")
        session_id = request.session_id or f"rollbox-{uuid.uuid4().hex}"
        existing = self.by_session(session_id)
        if existing is not None:
            return existing  # a retried /start: the same runtime
        kind = Kind.of(request)
        ready = self._ready.get(kind)
        runtime_id = uuid.uuid4().hex
        if ready:
            booted = ready.popleft()
            runtime = Runtime(runtime_id, session_id, request.image, booted.url, booted.key,
                              status="running", pod_status="ready",
                              sandbox_id=booted.lease.sandbox.id)
            active = _Active(runtime, kind, booted=booted)
        else:
            exposure, key = await self._expose(kind), secrets.token_urlsafe(32)
            runtime = Runtime(runtime_id, session_id, request.image, exposure.url, key)
            active = _Active(runtime, kind)
            active.booting = asyncio.create_task(self._boot(kind, exposure, key))
            active.booting.add_done_callback(lambda task: self._booted(active, task))
            # The next one boots after this one: on a small machine two boots at once
            # would make the one a client waits for twice as slow.
            self._active[runtime_id] = active
            self._sessions[session_id] = runtime_id
            return runtime
        self._active[runtime_id] = active
        self._sessions[session_id] = runtime_id
        self._fill_later(kind)
        return runtime

    async def wait(self, runtime: Runtime) -> Runtime:
        """``runtime`` once its agent-server is healthy (or failed: see its status)."""
        active = self._active.get(runtime.runtime_id)
        if active is not None and active.booting is not None:
            with contextlib.suppress(BaseException):
                await asyncio.shield(active.booting)
            await asyncio.sleep(0)  # let the done callback record the outcome
        return runtime

    def by_session(self, session_id: str) -> Runtime | None:
        runtime_id = self._sessions.get(session_id)
        return self.by_runtime_id(runtime_id) if runtime_id else None

    def by_runtime_id(self, runtime_id: str) -> Runtime | None:
        active = self._active.get(runtime_id)
        return active.runtime if active else None

    def live(self) -> Sequence[Runtime]:
        return [a.runtime for a in self._active.values()]

    def warm_ready(self) -> int:
        return sum(len(ready) for ready in self._ready.values())

    async def pause(self, runtime: Runtime) -> None:
        """Freeze every process of the sandbox (SIGSTOP: memory is kept, no CPU is
        used) but rollbox's own init; ``resume`` continues them (SIGCONT)."""
        active = self._active[runtime.runtime_id]
        if active.booted is None or active.paused:
            return
        await self._signal_all(active.booted, "STOP")
        active.paused = True
        runtime.status, runtime.pod_status = "paused", "paused"

    async def resume(self, runtime: Runtime) -> None:
        active = self._active[runtime.runtime_id]
        if active.booted is None or not active.paused:
            return
        await self._signal_all(active.booted, "CONT")
        active.paused = False
        runtime.status, runtime.pod_status = "running", "ready"

    async def stop(self, runtime: Runtime) -> None:
        """Give the sandbox back: the pool resets it in place for the next agent-server."""
        active = self._active.pop(runtime.runtime_id, None)
        if active is None:
            return
        self._sessions.pop(runtime.session_id, None)
        runtime.status, runtime.pod_status = "stopped", "terminated"
        if active.booting is not None and not active.booting.done():
            active.booting.cancel()
            with contextlib.suppress(BaseException):
                await active.booting
        if active.booted is not None:
            if active.paused:
                with contextlib.suppress(RollboxError):
                    await self._signal_all(active.booted, "CONT")
            await self._release(active.booted, Outcome.OK)

    # -- lifecycle ---------------------------------------------------------------------

    async def aclose(self) -> None:
        self._closed = True
        for task in self._filling.values():
            task.cancel()
        await asyncio.gather(*self._filling.values(), return_exceptions=True)
        for active in list(self._active.values()):
            await self.stop(active.runtime)
        for ready in self._ready.values():
            while ready:
                await self._release(ready.popleft(), Outcome.OK)
        if self._http is not None:
            await self._http.close()

    async def __aenter__(self) -> AgentServers:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- internals ---------------------------------------------------------------------

    def spec_for(self, kind: Kind) -> SandboxSpec:
        return SandboxSpec(
            image=kind.image, workdir=kind.working_dir, network=self.network,
            env={**BASE_ENV, **kind.environment},
            resources=Resources(memory_mb=self.memory_mb * kind.resource_factor,
                                pids=4096),
            timeouts=Timeouts(create_s=self.boot_timeout, exec_s=RUN_FOREVER_S),
            output_limit_bytes=LOG_BYTES,
            labels={"rollbox.openhands": "agent-server"},
        )

    async def _expose(self, kind: Kind) -> Exposure:
        if self.network is Network.HOST:
            port = _free_port()
            return Exposure(f"http://{self.public_host}:{port}", port)
        ingress = Ingress(None, command_port(kind.command))
        return Exposure(await ingress.start(), ingress.port, ingress)

    async def _boot(self, kind: Kind, exposure: Exposure, key: str) -> Booted:
        try:
            lease = await self.pool.acquire(self.spec_for(kind))
        except BaseException:
            await exposure.close()
            raise
        egress = None
        try:
            if self.forward and self.network is Network.NONE:
                egress = Egress(lease.sandbox, self.forward)
                await egress.start()
            process = await lease.sandbox.stream(
                agent_server_argv(kind.command, exposure.port),
                env={KEY_VARIABLE: key, SANDBOX_VARIABLE: lease.sandbox.id},
                timeout=RUN_FOREVER_S, output_limit=2**62)
        except BaseException:
            if egress is not None:
                await egress.close()
            await exposure.close()
            await lease.release(Outcome.BROKEN)
            raise
        if exposure.ingress is not None:
            exposure.ingress.sandbox = lease.sandbox
        logs: deque[bytes] = deque()
        booted = Booted(lease, process, exposure, key, logs,
                        asyncio.create_task(_drain(process, logs, self._log_path(lease))),
                        egress)
        try:
            await self._wait_healthy(booted)
        except BaseException:
            await self._release(booted, Outcome.BROKEN)
            raise
        return booted

    async def _wait_healthy(self, booted: Booted) -> None:
        """Poll /health from inside the sandbox (one command, no tunnel per probe),
        then once through the URL the client gets."""
        inside = asyncio.create_task(booted.lease.sandbox.exec(
            [PYTHON, "-I", "-S", "-c", _WAIT_HEALTHY, str(booted.exposure.port)],
            timeout=self.boot_timeout))
        try:
            done, _ = await asyncio.wait({inside, booted.drained},
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not inside.done():
                inside.cancel()
                with contextlib.suppress(BaseException):
                    await inside
        if inside not in done:
            raise CreateFailedError(
                "the agent-server exited while booting:\n" + _tail(booted.logs),
                sandbox_id=booted.lease.sandbox.id)
        try:
            result = inside.result()
        except ExecTimeoutError:
            raise CreateFailedError(
                f"the agent-server did not answer /health within {self.boot_timeout}s:\n"
                + _tail(booted.logs), sandbox_id=booted.lease.sandbox.id) from None
        if not result.ok:
            raise CreateFailedError(
                "could not wait for the agent-server: " + result.stderr.decode()[-2000:],
                sandbox_id=booted.lease.sandbox.id)
        try:
            async with self._client().get(booted.url + "/health",
                                          timeout=aiohttp.ClientTimeout(total=30)) as reply:
                if reply.status == 200:
                    return
                raise CreateFailedError(f"/health through {booted.url} answered {reply.status}",
                                        sandbox_id=booted.lease.sandbox.id)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise CreateFailedError(f"/health through {booted.url} failed: {exc}",
                                    sandbox_id=booted.lease.sandbox.id) from None

    def _booted(self, active: _Active, task: asyncio.Task[Booted]) -> None:
        active.booting = None
        runtime = active.runtime
        self._fill_later(active.kind)
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            runtime.status, runtime.pod_status = "error", "failed"
            runtime.error = getattr(error, "message", str(error))
            runtime.logs = runtime.error
            _log.warning("agent-server for %s failed to boot: %s", runtime.session_id, error)
            return
        booted = task.result()
        if runtime.runtime_id not in self._active:  # stopped meanwhile
            asyncio.get_running_loop().create_task(self._release(booted, Outcome.OK))
            return
        active.booted = booted
        runtime.sandbox_id = booted.lease.sandbox.id
        runtime.status, runtime.pod_status = "running", "ready"

    def _fill_later(self, kind: Kind) -> None:
        task = self._filling.get(kind)
        if self._closed or self.warm <= 0 or (task is not None and not task.done()):
            return
        self._filling[kind] = asyncio.get_running_loop().create_task(self._fill(kind))

    async def _fill(self, kind: Kind) -> None:
        """Boot agent-servers of ``kind`` one at a time until ``warm`` are ready."""
        ready = self._ready.setdefault(kind, deque())
        failures = 0
        while not self._closed and len(ready) < self.warm and failures < 3:
            try:
                exposure = await self._expose(kind)
                ready.append(await self._boot(kind, exposure, secrets.token_urlsafe(32)))
                failures = 0
            except (SandboxError, RollboxError) as exc:
                failures += 1
                _log.warning("warming an agent-server of %s failed: %s", kind.image, exc)
                await asyncio.sleep(1.0 * failures)

    async def _signal_all(self, booted: Booted, signal_name: str) -> None:
        await booted.lease.sandbox.exec(["/bin/sh", "-c", _SIGNAL_ALL, "sh", signal_name],
                                        timeout=30)

    async def _release(self, booted: Booted, outcome: Outcome) -> None:
        booted.drained.cancel()
        with contextlib.suppress(BaseException):
            await booted.drained
        await booted.exposure.close()
        if booted.egress is not None:
            await booted.egress.close()
        await booted.lease.release(outcome)

    def _log_path(self, lease: Lease) -> Path | None:
        if self.log_dir is None:
            return None
        self.log_dir.mkdir(parents=True, exist_ok=True)
        return self.log_dir / f"agent-server-{lease.sandbox.id}.log"

    def _client(self) -> aiohttp.ClientSession:
        if self._http is None:
            self._http = aiohttp.ClientSession()
        return self._http


async def _drain(process: Process, logs: deque[bytes], path: Path | None) -> None:
    """Keep the last LOG_BYTES of the agent-server's output (for failures), and all of
    it in ``path`` if given."""
    sink = await asyncio.to_thread(path.open, "ab") if path else None
    try:
        async for chunk in process:
            if sink is not None:
                sink.write(chunk.data)
                sink.flush()
            _keep(logs, chunk.data)
    finally:
        if sink is not None:
            sink.close()


def _keep(logs: deque[bytes], data: bytes) -> None:
    size = sum(map(len, logs))
    logs.append(data)
    size += len(data)
    while size > LOG_BYTES and len(logs) > 1:
        size -= len(logs.popleft())


def _tail(logs: deque[bytes]) -> str:
    return b"".join(logs).decode("utf-8", "replace")[-4000:]

