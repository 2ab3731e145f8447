"""The one class a backend plugin implements, in the spirit of an httpx transport.

A backend makes sandboxes from specs. Everything else (warm pools, pacing, reuse,
retries, metrics) lives in core and works the same on every backend.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from types import TracebackType
from typing import ClassVar

from rollbox.errors import CapabilityNotSupportedError, UnsupportedSpecError
from rollbox.sandbox import Capabilities, Sandbox, Snapshot
from rollbox.spec import DEFAULT_RESOURCES, Network, Resources, SandboxSpec

_AHEAD_OF_NEED: ContextVar[bool] = ContextVar("rollbox_ahead_of_need", default=False)


def ahead_of_need() -> bool:
    """True while the caller creates a sandbox nobody waits for yet (a pool's filler
    warming one up). A backend may then run the work at a lower CPU priority, so that
    commands running now keep the machine."""
    return _AHEAD_OF_NEED.get()


@contextlib.contextmanager
def creating_ahead_of_need() -> Iterator[None]:
    """Mark the creates awaited inside (and tasks started from them) as ahead of need."""
    token = _AHEAD_OF_NEED.set(True)
    try:
        yield
    finally:
        _AHEAD_OF_NEED.reset(token)


@dataclass(frozen=True)
class Diagnostic:
    """One line of ``rollbox doctor``: a check, whether it passed, and the fix if not."""

    check: str
    ok: bool
    detail: str
    fix: str = ""
    required: bool = True


LIMIT_CAPABILITY = {
    "cpus": "cpu_limit", "memory_mb": "memory_limit", "pids": "pids_limit",
    "disk_mb": "disk_limit", "inodes": "inode_limit", "file_size_mb": "file_size_limit",
    "cpu_seconds": "cpu_time_limit",
}
"""Which capability enforces each field of ``Resources``."""


def spec_demands(spec: SandboxSpec) -> dict[str, str]:
    """Capability → the spec field that needs it, for everything ``spec`` asks for."""
    demands = {LIMIT_CAPABILITY[name]: f"resources.{name}={value}"
               for name, value in spec.resources.asked().items()}
    demands["network_host" if spec.network is Network.HOST else "network_none"] = (
        f"network={spec.network.value!r}")
    if spec.reset_command is not None:
        demands["reset_command"] = "reset_command"
    if spec.entrypoint is not None:
        demands["entrypoint"] = "entrypoint"
    return demands


class Backend(ABC):
    """Creates sandboxes. Subclasses set ``name`` and ``capabilities`` and implement
    ``create``; the rest has safe defaults.

    ``capabilities`` is a class attribute, which a backend whose powers depend on the
    machine (cgroups it may write, a kernel feature) replaces per instance."""

    name: ClassVar[str]
    capabilities: Capabilities = Capabilities()
    default_resources: ClassVar[Resources] = DEFAULT_RESOURCES
    """The limits a sandbox gets for every ``Resources`` field left ``None``."""

    @abstractmethod
    async def create(self, spec: SandboxSpec) -> Sandbox:
        """Start a sandbox for ``spec`` and return it ready for its first command.

        Raises CreateFailedError (retryable), ImageError, or InvalidSpecError.
        """

    def check_spec(self, spec: SandboxSpec) -> None:
        """Refuse a spec asking for what this backend cannot honour: a limit it cannot
        enforce (unless ``resources.best_effort``), a network it cannot give, a
        ``reset_command`` it never runs. Backends call it first thing in ``create``.

        Raises UnsupportedSpecError naming the field, the backend and what to do."""
        caps = self.capabilities
        missing = {cap: field for cap, field in spec_demands(spec).items()
                   if not getattr(caps, cap)}
        if spec.resources.best_effort:
            missing = {c: f for c, f in missing.items() if c not in LIMIT_CAPABILITY.values()}
        if not missing:
            return
        cap, field = next(iter(missing.items()))
        why = self.missing_capability_reason(cap)
        limit = cap in LIMIT_CAPABILITY.values()
        advice = ("leave the field out to get the backend's default limit, or set "
                  "resources.best_effort=True to accept it unenforced"
                  if limit else "choose a backend that supports it")
        raise UnsupportedSpecError(
            f"SandboxSpec.{field} cannot be honoured by backend {self.name!r}"
            f"{f' here: {why}' if why else ''}; {advice}", field=field.split("=")[0],
            backend=self.name)

    def missing_capability_reason(self, capability: str) -> str:
        """Why ``capability`` is missing on this machine, and how to get it (for the
        error ``check_spec`` raises); empty when there is nothing to add."""
        return ""

    def resources_for(self, spec: SandboxSpec) -> Resources:
        """The limits a sandbox of ``spec`` runs under: its own, else the defaults."""
        return spec.resources.or_defaults(self.default_resources)

    async def prefetch(self, image: str) -> None:
        """Hydrate ``image`` ahead of need so a later ``create`` does not wait for it."""

    def hint_upcoming(self, images: Sequence[str]) -> None:
        """The images the caller expects to need next, most urgent first (advisory)."""

    def keep_warm(self, spec: SandboxSpec, count: int) -> bool:
        """The pool's policy now wants ``count`` idle sandboxes of ``spec`` ready.

        A backend with warm capacity of its own (a cluster's warm pool, say) may take
        the warming of ``spec`` over: keep about ``count`` sandboxes of it ready on its
        side, hand one out on the next ``create``, and return True. The pool then creates
        no warm sandboxes of ``spec`` itself (it still reuses released ones by reset).
        False, the default, leaves warming to the pool.

        Called by the pool from the event loop each time the target of ``spec`` changes
        (``count`` may be 0: stop keeping any), and with 0 when the pool closes. It must
        be synchronous and cheap: start any remote work in the background and coalesce
        bursts of changes. The answer may differ from call to call; the pool follows the
        latest one.
        """
        return False

    async def fork(self, snapshot: Snapshot) -> Sandbox:
        """A new, independent sandbox starting from ``snapshot``."""
        raise CapabilityNotSupportedError(f"backend {self.name!r} does not support fork")

    async def drop_snapshot(self, snapshot: Snapshot) -> None:
        """Forget a snapshot and free its storage."""

    async def aclose(self) -> None:
        """Close every sandbox this backend still owns and release shared resources."""

    async def leftovers(self) -> list[str]:
        """What this backend still holds: one line per live sandbox, process, mount,
        directory or remote object it created (empty when everything is released).

        The conformance suite calls it after closing every sandbox it made and fails
        if anything new is listed, so a backend that can see its own resources should
        report them here. The default reports nothing.
        """
        return []

    @classmethod
    def doctor(cls) -> list[Diagnostic]:
        """Checks that this backend can run on this machine (``rollbox doctor``)."""
        return []

    @classmethod
    def clean(cls) -> list[str]:
        """Remove what processes of this backend that died without closing it left
        behind (``rollbox doctor --clean``); one line per thing removed. A backend that
        cleans up after dead owners when it starts does the same here."""
        return []

    def __deepcopy__(self, memo: dict[int, object]) -> Backend:
        """A backend is a live resource (its sandboxes, processes, connections): a deep
        copy shares it. ``gymnasium.make`` deep-copies its keyword arguments, a backend
        among them, and a copied backend would lose track of its sandboxes."""
        return self

    async def __aenter__(self) -> Backend:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
