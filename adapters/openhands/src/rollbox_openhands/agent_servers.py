"""Agent-servers as the entrypoint of rollbox sandboxes, handed out warm.

Booting an agent-server (a Python process importing ~200 packages) takes seconds. What
it reads at boot is fixed by its ``/start``: image, command, working directory,
environment (a *kind*). Each kind is one ``SandboxSpec`` whose ``entrypoint`` is the
agent-server (wrapped in ``BOOT``) and whose ``ready_port`` is its port, so the backend
starts it with every fresh sandbox generation and hands the sandbox out only once it
listens. Warm sandboxes of the pool are running agent-servers; ``/stop`` gives the
sandbox back, the pool resets it in place, and the backend boots the next agent-server
in it. The first ``/start`` of a kind boots cold; from then on ``warm`` of that kind are
kept booted (``want_warm``).

The session key. The agent-server reads its keys (``OH_SESSION_API_KEYS_0``) once, at
boot, so a warm agent-server's key is made before anyone asks for it: ``BOOT`` draws 32
random bytes inside the sandbox at each generation, gives them to that agent-server
only and leaves them in ``BOOT_DIR/boot`` for the host, which reads them at hand-out.
Every generation, and so every conversation after a reset, has a new key; no other
sandbox and no other conversation sees it. A cold ``/start`` must answer with its key
before its sandbox exists: rollbox draws that key itself and boots the agent-server
from a spec of its own carrying it, used once and closed at ``/stop``.

The network. A sandbox has none by default: the agent-server listens on its own
loopback and the host reaches it through ``Sandbox.endpoint`` (the backend must declare
``capabilities.ports`` and ``capabilities.entrypoint``); it reaches its LLM only through
the ports ``forward`` names (an ``Egress``). With ``network="host"`` the sandbox shares
the host's network, every agent-server picks a free port at boot (no ``ready_port``:
the hand-out waits for ``/health``) and reaches what the host reaches.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
import uuid
from collections import Counter
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from rollbox.errors import (
    CapabilityNotSupportedError,
    CreateFailedError,
    ExecTimeoutError,
    RollboxError,
    SandboxError,
    WorkloadError,
)
from rollbox.pool import Lease, Outcome, Pool
from rollbox.sandbox import Endpoint
from rollbox.spec import FrozenMap, Network, Resources, SandboxSpec, Timeouts

from rollbox_openhands.door import Door
from rollbox_openhands.egress import RELAY, Egress
from rollbox_openhands.runtime_api import Failure, Runtime, StartRequest

_log = logging.getLogger(__name__)

KEY_VARIABLE = "OH_SESSION_API_KEYS_0"
BOOT_DIR = "/tmp/rollbox-openhands"
"""In every agent-server's sandbox: ``boot`` (its port and key), ``agent-server.log``
(its output) and, once handed out, ``sandbox-id`` (the rollbox sandbox's id)."""
DEFAULT_PORT = 8000
LOG_BYTES = 256 * 1024
BASE_ENV = {
    # The sandbox has no route to the internet: litellm must not fetch its price list.
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "OPENHANDS_SUPPRESS_BANNER": "1",
}

BOOT = r"""
set -e
umask 077
mkdir -p "$BOOT_DIR"
port=$1 relay_ports=$2 relay=$3; shift 3
if [ -n "$relay_ports" ]; then
  python3 -I -S -c "$relay" "$BOOT_DIR/relay" $relay_ports > "$BOOT_DIR/relay.log" 2>&1 &
  while [ ! -s "$BOOT_DIR/relay" ]; do
    kill -0 $! 2>/dev/null || { echo "rollbox-openhands: the LLM relay did not start" \
      "(is python3 on the image's PATH?):" >&2; cat "$BOOT_DIR/relay.log" >&2; exit 1; }
    sleep 0.01
  done
fi
if [ "$port" = 0 ]; then
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])')
fi
if [ -z "$OH_SESSION_API_KEYS_0" ]; then
  OH_SESSION_API_KEYS_0=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
  export OH_SESSION_API_KEYS_0
fi
printf '%s %s %s\n' "$port" "$$" "$OH_SESSION_API_KEYS_0" > "$BOOT_DIR/boot.new"
mv "$BOOT_DIR/boot.new" "$BOOT_DIR/boot"
exec "$@" --host 127.0.0.1 --port "$port" > "$BOOT_DIR/agent-server.log" 2>&1
""".replace("$BOOT_DIR", BOOT_DIR)
"""The entrypoint: ``sh -c BOOT boot PORT RELAY_PORTS RELAY COMMAND...`` (PORT 0: pick a
free one; RELAY_PORTS, space-separated, empty for none: start the LLM relay ``RELAY``
listening on them first, ``rollbox_openhands.egress``)."""

HAND_OUT = r"""
while [ ! -s "$BOOT_DIR/boot" ]; do sleep 0.02; done
read -r port pid key < "$BOOT_DIR/boot"
kill -0 "$pid" || { echo "the agent-server (pid $pid) is gone" >&2; exit 3; }
printf '%s\n' "$1" > "$BOOT_DIR/sandbox-id"
relay=$(cat "$BOOT_DIR/relay" 2>/dev/null) || relay=-
echo "$port $key $relay"
""".replace("$BOOT_DIR", BOOT_DIR)
"""Run at hand-out: checks the agent-server still runs, names the sandbox, prints
``PORT KEY RELAY`` (RELAY: the LLM relay's control port, or ``-``)."""

ALIVE = r"""
read -r port pid key < "$BOOT_DIR/boot" && kill -0 "$pid" 2>/dev/null
""".replace("$BOOT_DIR", BOOT_DIR)
"""Exits 0 while the handed-out agent-server runs."""
CHECK_INTERVAL_S = 1.0
"""A runtime read more often than this is answered with what its last check found."""

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
(rollbox runs commands and relays through them: they must keep answering)."""


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
        # rollbox decides the session key, never the caller.
        environment = {k: v for k, v in request.environment.items()
                       if not k.startswith("OH_SESSION_API_KEYS_")}
        return cls(request.image, request.command, request.working_dir,
                   FrozenMap(environment), request.resource_factor)


def without_listen_options(command: Sequence[str]) -> list[str]:
    """``command`` without its --host/--port (rollbox chooses where it listens)."""
    argv: list[str] = []
    items = list(command)
    i = 0
    while i < len(items):
        arg = items[i]
        if arg in ("--port", "--host"):
            i += 2
            continue
        if not arg.startswith(("--port=", "--host=")):
            argv.append(arg)
        i += 1
    return argv


def command_port(command: Sequence[str]) -> int:
    """The port ``command`` asks the agent-server to listen on (its default: 8000)."""
    for i, arg in enumerate(command):
        value = command[i + 1] if arg == "--port" and i + 1 < len(command) else (
            arg.removeprefix("--port=") if arg.startswith("--port=") else None)
        if value is not None and value.isdigit() and 0 < int(value) < 65536:
            return int(value)
    return DEFAULT_PORT


RELAY_PORTS_ARG = 5
"""Where ``BOOT``'s RELAY_PORTS sits in a spec's entrypoint."""


def relay_ports(spec: SandboxSpec) -> list[int]:
    """The ports ``spec``'s agent-server reaches through its LLM relay."""
    return [int(p) for p in (spec.entrypoint or ())[RELAY_PORTS_ARG].split()]


WantWarm = Callable[[Mapping[SandboxSpec, int]], None]
"""Tells the pool's policy how many sandboxes of each spec to keep warm (all specs)."""


@dataclass
class Booted:
    """A running, healthy agent-server in a leased sandbox."""

    lease: Lease
    endpoint: Endpoint
    key: str
    once: bool
    """Its spec carries a key rollbox drew (a cold start): closed, never reset, at stop."""
    egress: Egress | None = None


@dataclass
class _Active:
    runtime: Runtime
    kind: Kind
    booted: Booted | None = None
    booting: asyncio.Task[Booted] | None = None
    door: Door | None = None
    paused: bool = False
    checked_at: float = -CHECK_INTERVAL_S


class AgentServers:
    """The ``Runtimes`` the Runtime API serves: agent-servers on a rollbox pool."""

    def __init__(self, pool: Pool, want_warm: WantWarm, *, warm: int = 1,
                 boot_timeout: float = 180.0, memory_mb: int = 8192,
                 network: Network = Network.NONE,
                 forward: Mapping[int, tuple[str, int]] | None = None,
                 log_dir: Path | None = None) -> None:
        caps = pool.backend.capabilities
        if not (caps.entrypoint and caps.ports):
            raise CapabilityNotSupportedError(
                f"the {pool.backend.name!r} backend cannot run OpenHands agent-servers: "
                "rollbox needs a backend that starts a spec's entrypoint and exposes ports "
                "(capabilities.entrypoint and .ports: local, or remote through rollbox serve)")
        self.pool = pool
        self.want_warm = want_warm
        self.warm = warm
        self.boot_timeout = boot_timeout
        self.memory_mb = memory_mb
        self.network = Network(network)
        self.log_dir = log_dir
        """Where each agent-server's output goes at /stop (one file per sandbox), if set."""
        self.forward = dict(forward or {})
        """Ports inside every sandbox that lead to (host, port) outside: the LLM's, say
        (only with ``network="none"``; on the host's network everything is reachable)."""
        self._specs: dict[tuple[Kind, Network, str], SandboxSpec] = {}
        self._targets: dict[SandboxSpec, int] = {}
        self._active: dict[str, _Active] = {}  # by runtime id
        self._sessions: dict[str, str] = {}  # session id -> runtime id
        self._http: aiohttp.ClientSession | None = None
        self._giving_back: set[asyncio.Task[None]] = set()
        self._failures: Counter[str] = Counter()
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
        runtime = Runtime(uuid.uuid4().hex, session_id, request.image, "", "")
        active = _Active(runtime, kind)
        self._active[runtime.runtime_id] = active
        self._sessions[session_id] = runtime.runtime_id
        try:
            if self.pool.idle_count(self.spec_for(kind)):
                with contextlib.suppress(SandboxError):  # e.g. it died: boot one instead
                    self._handed(active, await self._hand_out(
                        await self.pool.acquire(self.spec_for(kind)), once=False))
                    self._keep_warm(kind)
                    return runtime
            await self._start_cold(active)
        except BaseException:
            self._forget(runtime)
            raise
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
        return sum(self.pool.idle_count(spec) for spec in self._targets)

    def failure_counts(self) -> Mapping[str, int]:
        return dict(self._failures)

    async def check(self, runtimes: Sequence[Runtime]) -> None:
        """Ask each running, handed-out runtime's sandbox whether its agent-server still
        runs (at most every CHECK_INTERVAL_S). One that does not is the workload's doing
        when its sandbox lives on, or when the backend says the workload broke it; the
        infrastructure's when the sandbox was lost."""
        now = time.monotonic()
        due = [a for a in (self._active.get(r.runtime_id) for r in runtimes)
               if a is not None and a.booted is not None and not a.paused
               and a.runtime.status == "running" and now - a.checked_at >= CHECK_INTERVAL_S]
        for active in due:
            active.checked_at = now
        await asyncio.gather(*(self._check(a) for a in due))

    async def _check(self, active: _Active) -> None:
        assert active.booted is not None
        sandbox = active.booted.lease.sandbox
        try:
            alive = await sandbox.exec(["/bin/sh", "-c", ALIVE], timeout=30)
        except ExecTimeoutError:
            return  # a busy sandbox is not a dead one: asked again at the next read
        except WorkloadError as exc:
            self._failed(active, exc.message, Failure("workload", exc.cause, False))
            return
        except SandboxError as exc:
            self._failed(active, exc.message, Failure("infra", exc.kind, exc.retryable))
            return
        if not alive.ok:
            self._failed(active, (
                f"the agent-server in sandbox {sandbox.id} exited while its sandbox lives "
                "on: the rollout's own commands killed it, or exhausted its memory "
                f"(memory_mb={sandbox.spec.resources.memory_mb}); this counts as the "
                "rollout's outcome"), Failure("workload", "agent-server", False))

    def _failed(self, active: _Active, message: str, failure: Failure) -> None:
        runtime = active.runtime
        if runtime.failure is not None or runtime.runtime_id not in self._active:
            return
        runtime.status, runtime.pod_status = "error", "failed"
        runtime.error, runtime.failure = message, failure
        self._failures[failure.kind] += 1
        _log.warning("runtime %s (session %s) failed: %s", runtime.runtime_id,
                     runtime.session_id, message)

    async def pause(self, runtime: Runtime) -> None:
        """Freeze every process of the sandbox (SIGSTOP: memory is kept, no CPU is
        used) but rollbox's own; ``resume`` continues them (SIGCONT)."""
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
        """Forget ``runtime`` and give its sandbox back, in the background: the pool
        resets it in place for the next agent-server (which may take that agent-server's
        boot, if the backend had not booted it ahead)."""
        active = self._forget(runtime)
        if active is None:
            return
        runtime.status, runtime.pod_status = "stopped", "terminated"
        if active.booting is not None and not active.booting.done():
            active.booting.cancel()
            with contextlib.suppress(BaseException):
                await active.booting
        if active.door is not None:
            await active.door.close()
        if active.booted is not None:
            outcome = Outcome.OK if runtime.failure is None else Outcome.BROKEN
            self._background(self._give_back(active.booted, active.paused, outcome))

    async def _give_back(self, booted: Booted, paused: bool, outcome: Outcome) -> None:
        if paused:
            with contextlib.suppress(RollboxError):
                await self._signal_all(booted, "CONT")
        await self._save_log(booted)
        await self._release(booted, outcome)

    # -- lifecycle ---------------------------------------------------------------------

    async def aclose(self) -> None:
        self._closed = True
        self._targets = {}
        self.want_warm({})
        for active in list(self._active.values()):
            await self.stop(active.runtime)
        await asyncio.gather(*self._giving_back, return_exceptions=True)
        if self._http is not None:
            await self._http.close()

    async def __aenter__(self) -> AgentServers:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- internals ---------------------------------------------------------------------

    @property
    def _relayed(self) -> bool:
        """The agent-servers reach ``forward``'s targets through an LLM relay."""
        return bool(self.forward) and self.network is Network.NONE

    def spec_for(self, kind: Kind) -> SandboxSpec:
        relay_ports = " ".join(map(str, sorted(self.forward))) if self._relayed else ""
        key = (kind, self.network, relay_ports)  # forward may grow (RollboxWorkspace)
        spec = self._specs.get(key)
        if spec is None:
            port = 0 if self.network is Network.HOST else command_port(kind.command)
            spec = self._specs[key] = SandboxSpec(
                image=kind.image, workdir=kind.working_dir, network=self.network,
                env={**BASE_ENV, **kind.environment},
                resources=Resources(memory_mb=self.memory_mb * kind.resource_factor,
                                    pids=4096),
                # A reset hands over the next generation once its agent-server is up.
                timeouts=Timeouts(create_s=self.boot_timeout, reset_s=self.boot_timeout),
                labels={"rollbox.openhands": "agent-server"},
                entrypoint=("/bin/sh", "-c", BOOT, "rollbox-openhands-boot", str(port),
                            relay_ports, RELAY, *without_listen_options(kind.command)),
                ready_port=port or None,
            )
        return spec

    async def _start_cold(self, active: _Active) -> None:
        """Answer at once with a door and a key of rollbox's; boot behind them."""
        door = active.door = Door()
        key = secrets.token_hex(32)
        runtime = active.runtime
        runtime.url, runtime.session_api_key = await door.open(), key
        spec = self.spec_for(active.kind)
        once = spec.replace(env={**spec.env, KEY_VARIABLE: key})

        async def boot() -> Booted:
            booted = await self._hand_out(await self.pool.acquire(once), once=True)
            door.lead_to(booted.endpoint)
            return booted

        active.booting = asyncio.create_task(boot())
        active.booting.add_done_callback(lambda task: self._booted(active, task))

    async def _hand_out(self, lease: Lease, *, once: bool) -> Booted:
        """``lease``'s agent-server, running and listening, its key read and its LLM
        forwarded."""
        sandbox = lease.sandbox
        egress = None
        known = lease.spec.ready_port  # else the boot picked one: known from ``boot``
        try:
            boot, endpoint = await asyncio.gather(
                sandbox.exec(["/bin/sh", "-c", HAND_OUT, "hand-out", sandbox.id],
                             timeout=self.boot_timeout),
                sandbox.endpoint(known) if known else asyncio.sleep(0, None))
            port, key, relay = [*boot.text.split(), "", "", ""][:3]
            if not boot.ok or not port.isdigit() or not key:
                raise CreateFailedError(f"the agent-server's boot left no key: "
                                        f"{boot.stderr.decode(errors='replace')[-500:]}",
                                        sandbox_id=sandbox.id)
            if endpoint is None:
                endpoint = await sandbox.endpoint(int(port))
            relayed = relay_ports(lease.spec)
            if relayed:
                if not relay.isdigit():
                    raise CreateFailedError("the agent-server booted without its LLM relay "
                                            f"(ports {relayed})", sandbox_id=sandbox.id)
                egress = Egress(sandbox, {p: self.forward[p] for p in relayed}, int(relay))
                await egress.start()
            booted = Booted(lease, endpoint, key, once, egress)
        except BaseException:
            if egress is not None:
                await egress.close()
            await lease.release(Outcome.BROKEN)
            raise
        try:
            if known is None:
                # The backend waited for nothing: wait for /health. Otherwise it waited
                # for the port, which the agent-server opens once its app has started,
                # and HAND_OUT found it still running.
                await self._wait_healthy(booted)
        except BaseException:
            await self._release(booted, Outcome.BROKEN)
            raise
        return booted

    async def _wait_healthy(self, booted: Booted) -> None:
        """Until ``/health`` answers 200."""
        sandbox_id = booted.lease.sandbox.id
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.boot_timeout
        while True:
            try:
                async with self._client().get(booted.endpoint.url + "/health",
                                              timeout=aiohttp.ClientTimeout(total=30)) as reply:
                    if reply.status == 200:
                        return
                    problem = f"answered {reply.status}"
            except (aiohttp.ClientError, TimeoutError) as exc:
                problem = f"failed: {exc}"
            if loop.time() > deadline:
                raise CreateFailedError(f"the agent-server's /health {problem} after "
                                        f"{self.boot_timeout}s", sandbox_id=sandbox_id)
            await asyncio.sleep(0.05)

    def _handed(self, active: _Active, booted: Booted) -> None:
        runtime = active.runtime
        if runtime.runtime_id not in self._active:  # stopped meanwhile
            self._background(self._release(booted, Outcome.OK))
            return
        active.booted = booted
        runtime.sandbox_id = booted.lease.sandbox.id
        runtime.status, runtime.pod_status = "running", "ready"
        if not booted.once:
            runtime.url, runtime.session_api_key = booted.endpoint.url, booted.key

    def _booted(self, active: _Active, task: asyncio.Task[Booted]) -> None:
        active.booting = None
        if task.cancelled():
            return
        error = task.exception()
        runtime = active.runtime
        if error is not None:
            runtime.status, runtime.pod_status = "error", "failed"
            runtime.error = runtime.logs = getattr(error, "message", str(error))
            runtime.failure = Failure("infra", getattr(error, "kind", "boot"),
                                      getattr(error, "retryable", True))
            self._failures["infra"] += 1
            _log.warning("agent-server for %s failed to boot: %s", runtime.session_id, error)
            return
        self._handed(active, task.result())
        # Warm the next ones after this boot: on a small machine two boots at once would
        # make the one a client waits for twice as slow.
        self._keep_warm(active.kind)

    def _keep_warm(self, kind: Kind) -> None:
        """(Re)state the warm targets: after each hand-out, so a pool that dropped them
        (``rollbox serve`` forgets a silent client's) warms again."""
        if self._closed or self.warm <= 0:
            return
        self._targets[self.spec_for(kind)] = self.warm
        self.want_warm(dict(self._targets))

    def _background(self, release: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(release)
        self._giving_back.add(task)
        task.add_done_callback(self._giving_back.discard)

    def _forget(self, runtime: Runtime) -> _Active | None:
        active = self._active.pop(runtime.runtime_id, None)
        if active is not None:
            self._sessions.pop(runtime.session_id, None)
        return active

    async def _signal_all(self, booted: Booted, signal_name: str) -> None:
        await booted.lease.sandbox.exec(["/bin/sh", "-c", _SIGNAL_ALL, "sh", signal_name],
                                        timeout=30)

    async def _release(self, booted: Booted, outcome: Outcome) -> None:
        if booted.egress is not None:
            await booted.egress.close()
        # A sandbox whose spec carries a drawn key is never reused: it is closed.
        await booted.lease.release(Outcome.BROKEN if booted.once else outcome)

    async def _save_log(self, booted: Booted) -> None:
        if self.log_dir is None:
            return
        sandbox = booted.lease.sandbox
        with contextlib.suppress(RollboxError, OSError):
            result = await sandbox.exec(["tail", "-c", str(LOG_BYTES),
                                         f"{BOOT_DIR}/agent-server.log"], timeout=30)
            await asyncio.to_thread(self.log_dir.mkdir, parents=True, exist_ok=True)
            path = self.log_dir / f"agent-server-{sandbox.id}.log"
            await asyncio.to_thread(path.write_bytes, result.stdout)

    def _client(self) -> aiohttp.ClientSession:
        if self._http is None:
            self._http = aiohttp.ClientSession()
        return self._http
