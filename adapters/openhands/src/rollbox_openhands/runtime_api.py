"""The OpenHands Runtime API, independent of any HTTP server.

OpenHands' app server (``RUNTIME=remote``: RemoteSandboxService) and its SDK
(``APIRemoteWorkspace``, and so the OpenHands/benchmarks harness) obtain agent-servers
from a service speaking this API. Every call carries ``X-API-Key``:

    POST /start            {image, command, working_dir, environment, session_id, ...}
    GET  /sessions/{id}    one runtime by session id (404: unknown)
    GET  /sessions/batch   ?ids=a&ids=b -> a list of runtimes (unknown ids left out)
    GET  /list             {"runtimes": [...]}: the live ones
    GET  /rollbox/warm     {"ready": N}: booted agent-servers waiting (rollbox's own)
    GET  /rollbox/failures {"workload": N, "infra": M}: runtimes lost so far, by whose
                           doing (rollbox's own)
    POST /pause|/resume|/stop   {"runtime_id": ...}

A runtime object carries both vocabularies its clients read: ``status`` (the app server:
running | paused | starting | error; anything else is "missing") and ``pod_status``
(the SDK: it waits for "ready"; pending/running are transient, failed is fatal).
Reading a running runtime first checks its agent-server still runs: one that died is
``error``/``failed`` from then on, and ``rollbox_failure`` says whose doing that was
(``workload``: the rollout's own commands, not retryable; ``infra``: retryable).

``RuntimeAPI.handle`` maps one request to one ``Reply``; a web framework only has to
pass the method, path, query, headers and body along (see ``rollbox_openhands.server``).
"""

from __future__ import annotations

import hmac
import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from rollbox.errors import RollboxError, UsageError


class StartRequestError(UsageError):
    """A ``/start`` body OpenHands would never send (answered with HTTP 400)."""


@dataclass(frozen=True)
class StartRequest:
    """What ``/start`` asks for. ``command`` arrives as a list (app server) or a shell
    string (SDK); it is kept as an argv."""

    image: str
    command: tuple[str, ...]
    working_dir: str = "/"
    environment: Mapping[str, str] = field(default_factory=dict)
    session_id: str | None = None
    resource_factor: int = 1

    @classmethod
    def from_json(cls, body: Any) -> StartRequest:
        if not isinstance(body, dict):
            raise StartRequestError("the /start body must be a JSON object")
        image = body.get("image")
        if not isinstance(image, str) or not image.strip():
            raise StartRequestError("/start needs an 'image' (a non-empty string)")
        raw = body.get("command")
        if isinstance(raw, str):
            try:
                command = tuple(shlex.split(raw))
            except ValueError as exc:
                raise StartRequestError(
                    f"/start 'command' is not a valid shell line: {exc}") from None
        elif isinstance(raw, list) and all(isinstance(a, str) for a in raw):
            command = tuple(raw)
        else:
            raise StartRequestError("/start needs a 'command': a list of strings or a string")
        if not command:
            raise StartRequestError("/start 'command' is empty")
        working_dir = body.get("working_dir") or "/"
        if not isinstance(working_dir, str) or not working_dir.startswith("/"):
            raise StartRequestError("/start 'working_dir' must be an absolute path")
        environment = body.get("environment") or {}
        if not isinstance(environment, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in environment.items()):
            raise StartRequestError("/start 'environment' must map strings to strings")
        session_id = body.get("session_id")
        if session_id is not None and (not isinstance(session_id, str) or not session_id
                                       or "/" in session_id):
            raise StartRequestError("/start 'session_id' must be a non-empty string without /")
        factor = body.get("resource_factor", 1)
        if factor not in (1, 2, 4, 8):
            raise StartRequestError("/start 'resource_factor' must be 1, 2, 4 or 8")
        return cls(image=image, command=command, working_dir=working_dir,
                   environment=dict(environment), session_id=session_id,
                   resource_factor=int(factor))


@dataclass(frozen=True)
class Failure:
    """Whose doing a runtime's loss was: ``workload`` (its own commands exhausted its
    limits or killed its agent-server: the rollout's outcome, not to be retried away) or
    ``infra`` (the sandbox was lost: retry on a fresh one)."""

    kind: str
    cause: str
    retryable: bool


@dataclass
class Runtime:
    """One agent-server handed out by ``/start``, as the clients see it."""

    runtime_id: str
    session_id: str
    image: str
    url: str
    session_api_key: str
    status: str = "starting"
    pod_status: str = "pending"
    sandbox_id: str | None = None
    error: str | None = None
    logs: str = ""
    failure: Failure | None = None
    """Why a handed-out runtime's agent-server is gone, once it is found gone."""

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "runtime_id": self.runtime_id, "session_id": self.session_id,
            "image": self.image, "url": self.url, "session_api_key": self.session_api_key,
            "status": self.status, "pod_status": self.pod_status,
            "restart_count": 0, "restart_reasons": [], "sandbox_id": self.sandbox_id,
        }
        if self.error:
            data["error"] = self.error
            data["pod_logs"] = self.logs[-8000:]
        if self.failure is not None:
            data["rollbox_failure"] = vars(self.failure).copy()
            if self.failure.cause == "memory":  # the word Kubernetes' runtimes report
                data["restart_reasons"] = ["OOMKilled"]
        return data


class Runtimes(Protocol):
    """What the Runtime API needs from whoever runs the agent-servers."""

    async def start(self, request: StartRequest) -> Runtime: ...

    def by_session(self, session_id: str) -> Runtime | None: ...

    def by_runtime_id(self, runtime_id: str) -> Runtime | None: ...

    def live(self) -> Sequence[Runtime]: ...

    async def check(self, runtimes: Sequence[Runtime]) -> None:
        """Bring the running ones of ``runtimes`` up to date: an agent-server that died
        makes its runtime ``error``/``failed`` with its ``failure``."""

    def warm_ready(self) -> int:
        """Booted agent-servers waiting for a /start (of any kind)."""
        ...

    def failure_counts(self) -> Mapping[str, int]:
        """Runtimes found failed so far, by ``Failure.kind``."""
        ...

    async def pause(self, runtime: Runtime) -> None: ...

    async def resume(self, runtime: Runtime) -> None: ...

    async def stop(self, runtime: Runtime) -> None: ...


@dataclass(frozen=True)
class Reply:
    status: int
    body: Any

    def encode(self) -> bytes:
        return json.dumps(self.body).encode()


def _error(status: int, detail: str) -> Reply:
    return Reply(status, {"detail": detail})


class RuntimeAPI:
    """Routes Runtime API requests to ``runtimes``; checks ``X-API-Key``."""

    def __init__(self, runtimes: Runtimes, api_key: str) -> None:
        if not api_key:
            raise UsageError("the Runtime API needs an API key (X-API-Key)")
        self.runtimes = runtimes
        self._api_key = api_key.encode()

    async def handle(self, method: str, path: str, query: Sequence[tuple[str, str]],
                     headers: Mapping[str, str], body: bytes) -> Reply:
        """One request: ``headers`` looked up case-insensitively by the caller's mapping
        (pass one that is, e.g. aiohttp's)."""
        given = headers.get("X-API-Key") or ""
        if not hmac.compare_digest(given.encode(), self._api_key):
            return _error(401, "missing or wrong X-API-Key")
        path = "/" + path.strip("/")
        try:
            if method == "GET":
                return await self._get(path, query)
            if method == "POST":
                return await self._post(path, body)
        except StartRequestError as exc:
            return _error(400, exc.message)
        except RollboxError as exc:
            status = 400 if isinstance(exc, UsageError) else 503
            return _error(status, exc.message)
        return _error(405, f"{method} is not part of the Runtime API")

    async def _get(self, path: str, query: Sequence[tuple[str, str]]) -> Reply:
        if path == "/rollbox/warm":  # rollbox's own: not part of OpenHands' API
            return Reply(200, {"ready": self.runtimes.warm_ready()})
        if path == "/rollbox/failures":  # rollbox's own
            return Reply(200, {"workload": 0, "infra": 0, **self.runtimes.failure_counts()})
        if path == "/list":
            found = list(self.runtimes.live())
            await self.runtimes.check(found)
            return Reply(200, {"runtimes": [r.to_json() for r in found]})
        if path == "/sessions/batch":
            batch = [self.runtimes.by_session(v) for k, v in query if k == "ids"]
            found = [r for r in batch if r is not None]
            await self.runtimes.check(found)
            return Reply(200, [r.to_json() for r in found])
        if path.startswith("/sessions/") and path.count("/") == 2:
            runtime = self.runtimes.by_session(path.removeprefix("/sessions/"))
            if runtime is None:
                return _error(404, "no runtime for this session")
            await self.runtimes.check([runtime])
            return Reply(200, runtime.to_json())
        return _error(404, f"no route {path}")

    async def _post(self, path: str, body: bytes) -> Reply:
        try:
            data = json.loads(body or b"{}")
        except ValueError:
            return _error(400, "the body is not JSON")
        if path == "/start":
            return Reply(200, (await self.runtimes.start(StartRequest.from_json(data)))
                         .to_json())
        actions = {"/pause": self.runtimes.pause, "/resume": self.runtimes.resume,
                   "/stop": self.runtimes.stop}
        if path not in actions:
            return _error(404, f"no route {path}")
        runtime_id = data.get("runtime_id") if isinstance(data, dict) else None
        if not isinstance(runtime_id, str):
            return _error(400, f"{path} needs a 'runtime_id'")
        runtime = self.runtimes.by_runtime_id(runtime_id)
        if runtime is None:
            return _error(404, f"no runtime {runtime_id}")
        await actions[path](runtime)
        return Reply(200, runtime.to_json())
