"""``RollboxProvider``: rollbox's warm, isolated sandboxes behind NeMo Gym's provider
protocol (``nemo_gym.sandbox.providers.base.SandboxProvider``).

NeMo Gym finds it through the entry point ``rollbox`` of the group
``nemo_gym.sandbox_providers`` and builds it from YAML::

    sandbox:
      rollbox: {backend: local, pool_options: {policy: static, policy_options: {size: 4}}}

``create`` hands out a sandbox from a warm pool keyed by the mapped spec
(``rollbox_nemo_gym.specs``) and returns once it is ready; ``close`` gives it back to
be reset in place. Providers of equal settings share their pool, which outlives them by
``keep_warm_s`` (``rollbox.envs.pools``), because NeMo Gym makes one provider per
sandbox and closes it with the sandbox.

The pools run on the process's one rollbox event loop, on a thread of its own
(``rollbox.envs.bridge``), not on the caller's: NeMo Gym's synchronous ``Sandbox``
facade gives every sandbox an event loop of its own and closes it on ``stop``, and a
pool (its sandboxes, their pipes, its timers) belongs to the loop that made it. Every
provider method hands its work to that loop and awaits the result; cancelling the
caller cancels the work.
"""

from __future__ import annotations

import functools
import os
import socket
import weakref
from collections.abc import Coroutine, Mapping
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from nemo_gym.sandbox import (
    SandboxCreateError,
    SandboxEndpoint,
    SandboxExecResult,
    SandboxHandle,
    SandboxSpec,
    SandboxStatus,
)
from rollbox.envs.bridge import LoopThread
from rollbox.envs.pools import PoolRegistry, SharedPool, registry
from rollbox.errors import (
    AcquireTimeoutError,
    PoolError,
    RollboxError,
    SandboxError,
    SandboxLostError,
    SandboxNotFoundError,
    UsageError,
)
from rollbox.plugins import backend_class, get_plugin_manager
from rollbox_remote.backend import RemoteBackend

from rollbox_nemo_gym.box import Box
from rollbox_nemo_gym.config import ProviderConfig
from rollbox_nemo_gym.specs import MappedSpec, SpecNotSupportedError, map_spec

T = TypeVar("T")

_boxes: weakref.WeakValueDictionary[str, Box] = weakref.WeakValueDictionary()
"""Every open sandbox of this process by id, for ``connect`` (rollbox loop only); one no
handle refers to any more is forgotten."""


class RollboxCreateError(SandboxCreateError):
    """rollbox could not hand out a sandbox. ``cause`` is the rollbox error, whose
    ``retryable`` says whether trying again may succeed."""

    def __init__(self, message: str, cause: RollboxError) -> None:
        super().__init__(message)
        self.cause = cause
        self.retryable = cause.retryable


class RollboxProvider:
    """A NeMo Gym sandbox provider backed by a rollbox backend and a shared warm pool.

    Keyword arguments are the provider's YAML settings (``rollbox_nemo_gym.config``).
    """

    name = "rollbox"

    def __init__(self, **settings: Any) -> None:
        self.config = ProviderConfig.from_options(settings)
        self._thread: LoopThread | None = None
        self._registry: PoolRegistry | None = None
        self._shared: SharedPool | None = None
        self._owned: dict[str, Box] = {}
        self._borrowed: dict[str, Box] = {}
        """Sandboxes of other processes ``connect`` attached: ``close`` ends them,
        ``aclose`` lets them go (their creator ends them)."""

    # -- SandboxProvider -------------------------------------------------------------------

    async def create(self, spec: SandboxSpec) -> SandboxHandle:
        """A ready sandbox for ``spec``: a warm one from the pool when there is one.

        Raises SpecNotSupportedError / InvalidSpecError (ValueError-like: fix the spec),
        or RollboxCreateError (a NeMo Gym ``SandboxCreateError``) when no sandbox could
        be had in time.
        """
        mapped = map_spec(spec, self.config)
        thread, _ = registry()
        box = await thread.call(self._open(thread, mapped))
        return SandboxHandle(sandbox_id=box.id, provider_name=self.name, raw=box)

    async def exec(
        self,
        handle: SandboxHandle,
        command: str,
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_s: int | float | None = None,
        user: str | int | None = None,
    ) -> SandboxExecResult:
        """Run ``command`` through the image's shell; a non-zero exit is a result.

        Commands run as the sandbox's root (its only user, mapped to an unprivileged one
        outside); ``user`` may say ``root`` or ``0`` and nothing else.
        """
        if user not in (None, "root", 0, "0"):
            raise SpecNotSupportedError(
                f"exec user={user!r}: rollbox runs commands as the sandbox's root (uid 0 "
                "inside, unprivileged outside); switch users inside the command instead",
                field="exec.user", backend=self.config.backend_name,
            )
        box = _box(handle)
        timeout = float(timeout_s) if timeout_s is not None else self.config.default_timeout_s
        if not box.thread.alive:
            return _outlived(box)
        return await box.thread.call(box.exec(command, cwd=cwd, env=env, timeout_s=timeout))

    async def upload_file(self, handle: SandboxHandle, source_path: Path, target_path: str) -> None:
        box = _box(handle)
        await _on(box, box.upload(Path(source_path), target_path))

    async def download_file(
        self, handle: SandboxHandle, source_path: str, target_path: Path
    ) -> None:
        box = _box(handle)
        await _on(box, box.download(source_path, Path(target_path)))

    async def status(self, handle: SandboxHandle) -> SandboxStatus:
        box = _box(handle)
        if not box.thread.alive:
            return SandboxStatus.STOPPED
        return await box.thread.call(box.status())

    async def close(self, handle: SandboxHandle) -> None:
        """Give the sandbox back to its pool to be reset in place. Idempotent."""
        box = _box(handle)
        self._owned.pop(box.id, None)
        self._borrowed.pop(box.id, None)
        if box.thread.alive:
            await box.thread.call(_close(box))

    async def aclose(self) -> None:
        """Close every sandbox this provider made and leave the shared pool (which
        closes after ``keep_warm_s`` without providers, at once when it is 0). Sandboxes
        ``connect`` found are left to their creator (their port relays here close)."""
        owned, self._owned = list(self._owned.values()), {}
        borrowed, self._borrowed = list(self._borrowed.values()), {}
        thread, pools, shared = self._thread, self._registry, self._shared
        self._thread = self._registry = self._shared = None
        if thread is None or not thread.alive:
            return
        for box in owned:
            await thread.call(_close(box))
        for box in borrowed:
            await thread.call(box.let_go())
        if pools is not None and shared is not None:
            await thread.call(pools.detach(shared, self.config.keep_warm_s))

    # -- SupportsSandboxPauseResume --------------------------------------------------------

    async def pause(self, handle: SandboxHandle) -> None:
        """Keep the sandbox's files, give its processes and pool slot back.

        A snapshot of the writable layer is taken and the sandbox returns to its pool;
        ``resume`` forks a new sandbox from the snapshot. Processes do not survive.
        """
        box = _box(handle)
        await _on(box, box.pause())

    async def resume(self, handle: SandboxHandle) -> None:
        box = _box(handle)
        await _on(box, box.resume())

    # -- SupportsSandboxEndpoint -----------------------------------------------------------

    async def endpoint(self, handle: SandboxHandle, port: int) -> SandboxEndpoint:
        """Where the host reaches ``port`` (declared in ``SandboxSpec.ports``) of the
        sandbox: rollbox's port exposure, which gives the sandbox no network itself."""
        box = _box(handle)
        return await _on(box, box.endpoint(port))

    # -- ConnectableProvider ---------------------------------------------------------------

    async def serialize_handle(
        self, handle: SandboxHandle, *, scope: str | None = None
    ) -> dict[str, Any]:
        """A descriptor ``connect`` rebuilds the handle from: ids and, for ``remote``, the
        server's address; never a token (the connecting process has its own)."""
        box = _box(handle)
        descriptor = {"provider": self.name, "sandbox_id": box.id,
                      "rollbox_id": box.rollbox_id, "backend": box.backend.name,
                      "host": socket.gethostname(), "pid": os.getpid()}
        if isinstance(box.backend, RemoteBackend):
            descriptor["server"] = _without_credentials(box.backend.url)
        return descriptor

    async def connect(self, descriptor: Mapping[str, Any]) -> SandboxHandle:
        """The sandbox a descriptor names, as a handle of this provider.

        In the process that made it, the sandbox itself. Elsewhere, both processes must
        use a backend every process reaches by id — ``remote``, a ``rollbox serve`` —
        and this provider's own settings say where the server is and where its token
        comes from. Stopping the handle ends the sandbox; ``AsyncSandbox.disconnect``
        leaves it to its creator.
        """
        sandbox_id = descriptor.get("sandbox_id")
        rollbox_id = descriptor.get("rollbox_id")
        if not isinstance(sandbox_id, str) or not sandbox_id:
            raise UsageError(f"not a rollbox sandbox descriptor: {dict(descriptor)!r}")
        thread, _ = registry()
        box = await thread.call(_find(sandbox_id))
        if box is None and isinstance(rollbox_id, str) and self._reaches(descriptor):
            try:
                box = await thread.call(self._attach_to(thread, rollbox_id, descriptor))
            except SandboxNotFoundError as exc:
                raise SandboxNotFoundError(
                    f"no sandbox {sandbox_id} on the rollbox server at "
                    f"{descriptor.get('server', '?')}: it was stopped, or its idle TTL "
                    f"took it back ({exc.message})", sandbox_id=sandbox_id) from exc
        if box is None:
            raise SandboxLostError(f"no sandbox {sandbox_id} here; {self._why_not(descriptor)}",
                                   sandbox_id=sandbox_id)
        return SandboxHandle(sandbox_id=box.id, provider_name=self.name, raw=box)

    def _reaches(self, descriptor: Mapping[str, Any]) -> bool:
        """Whether this provider's backend reaches the descriptor's sandbox by id."""
        return (descriptor.get("backend") == self.config.backend_name
                and _attaches(self.config.backend_name))

    def _why_not(self, descriptor: Mapping[str, Any]) -> str:
        """Why ``connect`` cannot reach the sandbox of ``descriptor``, and what to
        configure so that it can."""
        made_by = descriptor.get("backend")
        if made_by == "remote":
            return (f"it is on the rollbox server at {descriptor.get('server', '?')}, and this "
                    f"provider uses the {self.config.backend_name} backend: give it "
                    "`backend: remote` with that server's url")
        if (descriptor.get("pid"), descriptor.get("host")) == (os.getpid(), socket.gethostname()):
            return "it was stopped"
        return (f"it is a {made_by} sandbox of process {descriptor.get('pid')} on "
                f"{descriptor.get('host')}, and {made_by} sandboxes live in the process that "
                "made them; to share sandboxes between processes, start `rollbox serve` and "
                "give the providers of both processes `backend: remote` (`backend_options: "
                "{url: ...}` unless the server is at its default socket; the token from "
                "ROLLBOX_TOKEN, ROLLBOX_TOKEN_FILE or the server's token file, never in the "
                "descriptor)")

    # -- internals --------------------------------------------------------------------------

    async def _open(self, thread: LoopThread, mapped: MappedSpec) -> Box:
        shared = await self._attach(thread)
        if mapped.ports and not getattr(shared.backend.capabilities, "ports", False):
            raise SpecNotSupportedError(
                f"SandboxSpec.ports {list(mapped.ports)}: the {shared.backend.name} backend "
                "cannot expose sandbox ports; reach the service with exec instead",
                field="SandboxSpec.ports", backend=shared.backend.name,
            )
        try:
            lease = await shared.pool.acquire(mapped.spec, timeout=mapped.ready_timeout_s)
            box = await Box.open(lease, mapped, shared.backend, self.config.shell, thread)
        except (SandboxError, PoolError) as exc:
            ready = mapped.spec.ready_port
            hint = (f"; a sandbox with an entrypoint is ready once something in it accepts "
                    f"connections on port {ready} (127.0.0.1 or 0.0.0.0): check that the "
                    "entrypoint listens there, or raise ready_timeout_s"
                    if isinstance(exc, AcquireTimeoutError) and ready is not None else "")
            raise RollboxCreateError(
                f"rollbox could not start a sandbox of image {mapped.spec.image!r}: "
                f"{exc.message}{hint}", exc,
            ) from exc
        _boxes[box.id] = box
        self._owned[box.id] = box
        return box

    async def _attach_to(
        self, thread: LoopThread, rollbox_id: str, descriptor: Mapping[str, Any]
    ) -> Box:
        """A sandbox of another process, by its rollbox id (the backend attaches)."""
        fresh = self._shared is None
        shared = await self._attach(thread)
        try:
            sandbox = await shared.backend.attach(rollbox_id)  # type: ignore[attr-defined]
        except BaseException:
            pools = self._registry
            if fresh and pools is not None:  # leave no pool open for a failed connect
                self._thread = self._registry = self._shared = None
                await pools.detach(shared, self.config.keep_warm_s)
            raise
        ports = tuple(int(p) for p in descriptor.get("ports") or ())
        mapped = MappedSpec(spec=sandbox.spec, files={}, ttl_s=None, ready_timeout_s=None,
                            ports=ports)
        box = Box(sandbox, None, mapped, shared.backend, self.config.shell, thread)
        _boxes[box.id] = box
        self._borrowed[box.id] = box
        return box

    async def _attach(self, thread: LoopThread) -> SharedPool:
        if self._shared is None or self._thread is not thread or self._shared.closed:
            current, pools = registry()
            if current is not thread:
                raise SandboxLostError("the rollbox loop was shut down meanwhile; try again")
            self._thread, self._registry = thread, pools
            self._shared = await pools.attach(self.config.backend_name,
                                              self.config.backend_options,
                                              self.config.shared_pool_options)
        return self._shared


async def _close(box: Box) -> None:
    _boxes.pop(box.id, None)
    await box.close()


async def _find(sandbox_id: str) -> Box | None:
    return _boxes.get(sandbox_id)


async def _on(box: Box, coro: Coroutine[Any, Any, T]) -> T:
    if not box.thread.alive:
        coro.close()
        raise SandboxLostError(f"sandbox {box.id} ended with its rollbox loop",
                               sandbox_id=box.id)
    return await box.thread.call(coro)


def _outlived(box: Box) -> SandboxExecResult:
    return SandboxExecResult(stdout=None, stderr=f"sandbox {box.id} ended with its rollbox loop",
                             return_code=125, error_type="sandbox")


@functools.cache
def _attaches(backend: str) -> bool:
    """Whether ``backend``'s sandboxes can be reached by id from any process."""
    return callable(getattr(backend_class(get_plugin_manager(), backend), "attach", None))


def _without_credentials(url: str) -> str:
    """``url`` without a ``user:password@`` part: a descriptor carries no secrets."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def _box(handle: SandboxHandle) -> Box:
    raw = getattr(handle, "raw", None)
    if not isinstance(raw, Box):
        raise UsageError(f"handle {getattr(handle, 'sandbox_id', handle)!r} was not made by "
                         "the rollbox provider")
    return raw
