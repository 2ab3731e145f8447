"""Wrappers that forward the whole ``Sandbox`` and ``Backend`` contracts to what they wrap.

A wrapper adds one behaviour (metering a lease, injecting faults, logging) and must
change nothing else. Forwarding by hand, method by method, drops whatever the author
did not think of: a leased sandbox once lost its image's environment (``base_env``), a
fault-injecting backend forgot ``keep_warm``, ``leftovers`` and ``doctor``. So every
wrapper subclasses one of these two bases and overrides only what it changes:

    class Counting(SandboxWrapper[Sandbox]):
        async def run(self, request: ExecRequest) -> ExecResult:
            self.count += 1
            return await super().run(request)

``SandboxWrapper`` forwards every method a backend implements, and ``base_env``;
``exec``, ``stream`` and ``request`` (``BUILT_ON_TOP``) are not forwarded
but run on the wrapper, so they reach the inner sandbox through the wrapper's own
``run``/``start`` and the wrapper sees every command. Attributes outside the contract
(a backend's extras, e.g. ``LocalSandbox.open_port``) are looked up on the inner object.
``BackendWrapper`` does the same for backends and wraps the sandboxes it hands out
through one method, ``wrap``. ``tests/core/test_wrappers.py`` fails when a method is
added to ``Sandbox`` or ``Backend`` without being forwarded here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from rollbox.backend import Backend
from rollbox.sandbox import Endpoint, ExecRequest, ExecResult, Process, Sandbox, Snapshot
from rollbox.spec import Resources, SandboxSpec

S = TypeVar("S", bound=Sandbox)
B = TypeVar("B", bound=Backend)

BUILT_ON_TOP = frozenset({"request", "exec", "stream"})
"""``Sandbox`` methods built on the forwarded ones: they run on the wrapper itself."""


class SandboxWrapper(Sandbox, Generic[S]):
    """A sandbox that forwards everything to ``inner``; subclasses override what they
    change and call ``super()`` for the rest."""

    def __init__(self, inner: S) -> None:
        super().__init__(inner.id, inner.spec)
        self._wrapped = inner

    @property
    def inner(self) -> S:
        """The wrapped sandbox. Every forwarded call goes through this property, so a
        subclass can guard it (a released lease raises instead of reaching the sandbox)."""
        return self._wrapped

    @property
    def base_env(self) -> Mapping[str, str]:  # type: ignore[override]  # read through
        """The inner sandbox's environment (e.g. its image's ENV), under the spec's."""
        return self.inner.base_env

    async def run(self, request: ExecRequest) -> ExecResult:
        return await self.inner.run(request)

    async def start(self, request: ExecRequest) -> Process:
        return await self.inner.start(request)

    async def read_file(self, path: str) -> bytes:
        return await self.inner.read_file(path)

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        await self.inner.write_file(path, data, mode=mode)

    async def upload(self, local: str | Path, remote: str) -> None:
        await self.inner.upload(local, remote)

    async def download(self, remote: str, local: str | Path) -> None:
        await self.inner.download(remote, local)

    async def reset(self) -> None:
        await self.inner.reset()

    async def snapshot(self) -> Snapshot:
        return await self.inner.snapshot()

    async def seal(self) -> None:
        await self.inner.seal()

    async def endpoint(self, port: int) -> Endpoint:
        return await self.inner.endpoint(port)

    async def prepare(self) -> None:
        await self.inner.prepare()

    async def ping(self) -> bool:
        return await self.inner.ping()

    async def close(self) -> None:
        await self.inner.close()

    if not TYPE_CHECKING:  # typed callers see the Sandbox contract only

        def __getattr__(self, name: str) -> Any:
            if name.startswith("_") or name == "inner":
                raise AttributeError(name)
            return getattr(self.inner, name)


class BackendWrapper(Backend, Generic[B]):
    """A backend that forwards everything to ``inner``, with the same capabilities.

    Sandboxes from ``create`` and ``fork`` pass through ``wrap``; override it to wrap
    them (the default hands them out as they are).
    """

    name = "wrapper"

    def __init__(self, inner: B) -> None:
        self.inner = inner
        self.capabilities = inner.capabilities
        # A backend's default limits (a ClassVar) and checks (classmethods) belong to its
        # class; a wrapper takes its inner backend's, per instance.
        setattr(self, "default_resources", inner.default_resources)  # noqa: B010
        setattr(self, "doctor", inner.doctor)  # noqa: B010
        setattr(self, "clean", inner.clean)  # noqa: B010

    def wrap(self, sandbox: Sandbox) -> Sandbox:
        """The sandbox this wrapper hands out for one of the inner backend's."""
        return sandbox

    async def create(self, spec: SandboxSpec) -> Sandbox:
        return self.wrap(await self.inner.create(spec))

    async def fork(self, snapshot: Snapshot) -> Sandbox:
        return self.wrap(await self.inner.fork(snapshot))

    async def prefetch(self, image: str) -> None:
        await self.inner.prefetch(image)

    def hint_upcoming(self, images: Sequence[str]) -> None:
        self.inner.hint_upcoming(images)

    def keep_warm(self, spec: SandboxSpec, count: int) -> bool:
        return self.inner.keep_warm(spec, count)

    async def drop_snapshot(self, snapshot: Snapshot) -> None:
        await self.inner.drop_snapshot(snapshot)

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def leftovers(self) -> list[str]:
        return await self.inner.leftovers()

    def check_spec(self, spec: SandboxSpec) -> None:
        self.inner.check_spec(spec)

    def missing_capability_reason(self, capability: str) -> str:
        return self.inner.missing_capability_reason(capability)

    def resources_for(self, spec: SandboxSpec) -> Resources:
        return self.inner.resources_for(spec)

    if not TYPE_CHECKING:

        def __getattr__(self, name: str) -> Any:
            if name.startswith("_") or name == "inner":
                raise AttributeError(name)
            return getattr(self.inner, name)
