"""What a sandbox is made of: ``SandboxSpec``, frozen and hashable, the key of a warm pool."""

from __future__ import annotations

import posixpath
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from rollbox.errors import InvalidSpecError

MiB = 1024 * 1024


class FrozenMap(Mapping[str, str]):
    """An immutable, hashable str→str mapping (so a spec holding one stays a dict key)."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, str] | None = None) -> None:
        self._items: tuple[tuple[str, str], ...] = tuple(sorted((items or {}).items()))

    def __getitem__(self, key: str) -> str:
        for k, v in self._items:
            if k == key:
                return v
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return (k for k, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(self._items)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FrozenMap):
            return self._items == other._items
        return isinstance(other, Mapping) and dict(self._items) == dict(other)

    def __repr__(self) -> str:
        return f"FrozenMap({dict(self._items)!r})"


class Network(str, Enum):
    """Network reach of a sandbox. ``none`` (the default) leaves it only a loopback."""

    NONE = "none"
    HOST = "host"


@dataclass(frozen=True)
class Resources:
    """Limits on what one sandbox may consume, each for the sandbox as a whole (all its
    processes; memory counts tmpfs and memfd; disk counts everything writable).

    ``None`` (the default) means the backend's default limit (``DEFAULT_RESOURCES``
    unless the backend says otherwise), enforced where the backend can: ``rollbox
    doctor`` says which are here. A value given is a demand: a backend that cannot
    enforce it refuses the spec (UnsupportedSpecError naming the field), unless
    ``best_effort`` is set, which accepts a limit that may not be enforced.
    """

    cpus: float | None = None
    """CPU time per wall second (1.5 = one and a half cores), as a quota."""
    memory_mb: int | None = None
    pids: int | None = None
    disk_mb: int | None = None
    """Bytes written to the sandbox's filesystems (its writable layer, /tmp, /dev/shm)."""
    inodes: int | None = None
    """Files, directories and links created in those filesystems."""
    file_size_mb: int | None = None
    """The largest single file a command may write, and the file API's cap."""
    cpu_seconds: int | None = None
    """CPU seconds one process may use before it is killed (None: no limit)."""
    best_effort: bool = False

    def __post_init__(self) -> None:
        for name in LIMIT_FIELDS:
            value = getattr(self, name)
            if value is not None:
                _positive(f"resources.{name}", value)
        if not isinstance(self.best_effort, bool):
            raise InvalidSpecError("SandboxSpec.resources.best_effort must be a bool")

    def asked(self) -> dict[str, float]:
        """The limits this spec demands (the fields that are not None)."""
        return {name: value for name in LIMIT_FIELDS
                if (value := getattr(self, name)) is not None}

    def or_defaults(self, defaults: Resources | None = None) -> Resources:
        """These limits with every ``None`` filled from ``defaults`` (DEFAULT_RESOURCES)."""
        base = defaults or DEFAULT_RESOURCES
        return Resources(**{name: getattr(self, name) if getattr(self, name) is not None
                            else getattr(base, name) for name in LIMIT_FIELDS},
                         best_effort=self.best_effort)


LIMIT_FIELDS = ("cpus", "memory_mb", "pids", "disk_mb", "inodes", "file_size_mb", "cpu_seconds")

@dataclass(frozen=True)
class Timeouts:
    """Seconds allowed for each phase. ``exec_s`` is the default when exec gives none."""

    create_s: float = 120.0
    exec_s: float = 600.0
    reset_s: float = 30.0

    def __post_init__(self) -> None:
        _positive("timeouts.create_s", self.create_s)
        _positive("timeouts.exec_s", self.exec_s)
        _positive("timeouts.reset_s", self.reset_s)


@dataclass(frozen=True)
class SandboxSpec:
    """Everything that decides what a fresh sandbox looks like.

    Two sandboxes of equal specs are interchangeable, which is what lets a pool hand a
    warm one to whoever asks for that spec. ``env`` and ``labels`` accept any mapping and
    are frozen on construction.
    """

    image: str = "host"
    workdir: str = "/"
    env: Mapping[str, str] = field(default_factory=FrozenMap)
    resources: Resources = field(default_factory=Resources)
    network: Network = Network.NONE
    timeouts: Timeouts = field(default_factory=Timeouts)
    output_limit_bytes: int = 4 * MiB
    reset_command: str | None = None
    labels: Mapping[str, str] = field(default_factory=FrozenMap)
    """The caller's own tags (a harness name, a task id): part of the pool key, so
    sandboxes of differently labelled specs are never swapped, and acted on by no
    backend (nothing is enforced through them, so no backend refuses them)."""
    entrypoint: tuple[str, ...] | None = None
    """A long-running command (argv) that every fresh sandbox starts before it is handed
    out, and starts again after each reset: a service such as an agent-server. It runs in
    ``workdir`` with the spec's environment, its output discarded (redirect inside it to
    keep logs). It is no command's tree: no timeout kills it; reset and close do."""
    ready_port: int | None = None
    """With ``entrypoint``: the sandbox is handed out (created, reset) only once something
    accepts connections on this port inside it, within ``timeouts.create_s``."""

    def __post_init__(self) -> None:
        if not isinstance(self.image, str) or not self.image.strip():
            raise InvalidSpecError("SandboxSpec.image must be a non-empty image reference")
        if not posixpath.isabs(self.workdir) or "\0" in self.workdir:
            raise InvalidSpecError(
                f"SandboxSpec.workdir must be an absolute path, got {self.workdir!r}"
            )
        object.__setattr__(self, "workdir", posixpath.normpath(self.workdir))
        try:
            object.__setattr__(self, "network", Network(self.network))
        except ValueError:
            choices = ", ".join(n.value for n in Network)
            raise InvalidSpecError(
                f"SandboxSpec.network must be one of {choices}, got {self.network!r}"
            ) from None
        object.__setattr__(self, "env", _frozen("env", self.env))
        object.__setattr__(self, "labels", _frozen("labels", self.labels))
        for key in self.env:
            if not key or "=" in key or "\0" in key:
                raise InvalidSpecError(f"SandboxSpec.env has an invalid variable name {key!r}")
        _positive("output_limit_bytes", self.output_limit_bytes)
        _check_entrypoint(self)

    def __hash__(self) -> int:
        # Specs key every pool and plan lookup; the generated hash would walk all nested
        # fields each time. Cached per object, and never pickled (str hashes differ
        # between processes).
        cached: int | None = self.__dict__.get("_hash")
        if cached is None:
            cached = hash(tuple(getattr(self, name) for name in self.__dataclass_fields__))
            object.__setattr__(self, "_hash", cached)
        return cached

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_hash", None)
        return state

    def replace(self, **changes: Any) -> SandboxSpec:
        """A copy with some fields changed (validated like a new spec)."""
        fields = {name: getattr(self, name) for name in self.__dataclass_fields__}
        fields.update(changes)
        return SandboxSpec(**fields)


def _check_entrypoint(spec: SandboxSpec) -> None:
    if spec.entrypoint is not None:
        if isinstance(spec.entrypoint, str) or not isinstance(spec.entrypoint, Sequence):
            raise InvalidSpecError("SandboxSpec.entrypoint must be an argv: a list of str")
        argv = tuple(spec.entrypoint)
        if not argv or not all(isinstance(a, str) and "\0" not in a for a in argv) \
                or not argv[0]:
            raise InvalidSpecError("SandboxSpec.entrypoint must be a non-empty list of str "
                                   f"without NUL, got {spec.entrypoint!r}")
        object.__setattr__(spec, "entrypoint", argv)
    port = spec.ready_port
    if port is not None:
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise InvalidSpecError(f"SandboxSpec.ready_port must be in 1..65535, got {port!r}")
        if spec.entrypoint is None:
            raise InvalidSpecError("SandboxSpec.ready_port needs an entrypoint to wait for")


def _frozen(name: str, value: Mapping[str, str]) -> FrozenMap:
    if isinstance(value, FrozenMap):
        return value
    if not isinstance(value, Mapping):
        raise InvalidSpecError(f"SandboxSpec.{name} must be a mapping of str to str")
    for k, v in value.items():
        if not isinstance(k, str) or not isinstance(v, str) or "\0" in v:
            raise InvalidSpecError(f"SandboxSpec.{name}[{k!r}] must be a str without NUL")
    return FrozenMap(value)


def _positive(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise InvalidSpecError(f"SandboxSpec.{name} must be a positive number, got {value!r}")


DEFAULT_RESOURCES = Resources(cpus=1.0, memory_mb=2048, pids=512, disk_mb=4096,
                              inodes=262_144, file_size_mb=1024)
"""What a sandbox gets where its spec says nothing (a backend may choose its own)."""
