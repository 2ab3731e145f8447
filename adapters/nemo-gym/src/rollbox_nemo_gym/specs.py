"""NeMo Gym's ``SandboxSpec`` onto rollbox's: every field mapped, or refused by name.

The rollbox spec is the key of the warm pool, so only what decides what a fresh
sandbox looks like goes into it (image, workdir, env, limits, network, labels). What
concerns one sandbox's life — ``files`` written after it is handed out, ``ttl_s``,
``ready_timeout_s``, declared ``ports`` — travels beside it in ``MappedSpec``.

- ``image`` → ``SandboxSpec.image`` (the provider's ``image`` when None), after the
  provider's ``image_rewrites``
- ``workdir`` → ``SandboxSpec.workdir`` (the provider's ``workdir`` when None); absolute
- ``env`` → ``SandboxSpec.env``; ``metadata`` → ``SandboxSpec.labels``
- ``files`` → written into the sandbox by ``create`` (relative paths from ``workdir``)
- ``resources``: ``cpu`` → ``cpus``, ``memory_mib`` → ``memory_mb`` (MiB), ``disk_gib``
  → ``disk_mb`` (times 1024); ``gpu`` and ``gpu_type`` are refused: no GPUs in rollbox
- ``entrypoint`` → ``SandboxSpec.entrypoint``, started in every fresh sandbox and after
  every reset; ``create`` returns once its ``ready_port`` accepts connections:
  ``provider_options.ready_port``, else the first of ``ports``, else no wait
- ``ports`` → the ports ``endpoint`` may expose (``Sandbox.endpoint``); refused by
  ``create`` where the backend cannot expose ports
- ``ttl_s`` → the sandbox is ended that long after ``create`` returned it
- ``ready_timeout_s`` → the longest ``create`` may take, waiting for the pool included
- ``provider_options`` → rollbox fields NeMo Gym has no name for: ``network``,
  ``output_limit_bytes``, ``reset_command``, ``pids``, ``inodes``, ``file_size_mb``,
  ``cpu_seconds``, ``best_effort`` (accept limits the backend may not enforce),
  ``exec_timeout_s``, ``reset_timeout_s``; ``platform``
  (``{os, arch}``, OpenSandbox's key) is checked against this machine for the local
  backend; any other key is refused

Whether a backend can enforce a limit is the backend's to say: it refuses what it
cannot honour when the sandbox is created.
"""

from __future__ import annotations

import dataclasses
import math
import platform
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import rollbox
from nemo_gym.sandbox import SandboxResources
from nemo_gym.sandbox import SandboxSpec as NemoSpec
from rollbox.errors import InvalidSpecError, UnsupportedSpecError
from rollbox.spec import Resources, Timeouts

from rollbox_nemo_gym.config import ProviderConfig, network

PROVIDER_OPTIONS = frozenset({
    "network", "output_limit_bytes", "reset_command", "pids", "file_size_mb", "cpu_seconds",
    "exec_timeout_s", "reset_timeout_s", "platform", "inodes", "best_effort", "ready_port",
})
"""The ``SandboxSpec.provider_options`` keys rollbox understands."""

MAPPED_FIELDS = frozenset({
    "image", "ttl_s", "ready_timeout_s", "workdir", "env", "files", "metadata", "resources",
    "entrypoint", "provider_options", "ports",
})
"""Every NeMo Gym ``SandboxSpec`` field ``map_spec`` reads (a test checks there are no
others, so a field NeMo Gym adds is never silently dropped)."""
MAPPED_RESOURCES = frozenset({"cpu", "memory_mib", "disk_gib", "gpu", "gpu_type"})


class SpecNotSupportedError(UnsupportedSpecError, ValueError):
    """A NeMo Gym SandboxSpec field rollbox cannot honour: rollbox's UnsupportedSpecError
    (``field``, ``backend``), and a ValueError, which is what NeMo Gym's callers expect of
    a value a provider cannot honour."""


@dataclass(frozen=True)
class MappedSpec:
    """A NeMo Gym spec in rollbox's terms."""

    spec: rollbox.SandboxSpec
    """The pool key: what a fresh sandbox looks like."""
    files: Mapping[str, str]
    ttl_s: float | None
    ready_timeout_s: float | None
    ports: tuple[int, ...]


def map_spec(spec: NemoSpec, config: ProviderConfig) -> MappedSpec:
    """``spec`` in rollbox's terms, or SpecNotSupportedError / InvalidSpecError naming
    the field."""
    options = dict(spec.provider_options or {})
    unknown = set(options) - PROVIDER_OPTIONS
    if unknown:
        raise SpecNotSupportedError(
            f"SandboxSpec.provider_options {', '.join(sorted(unknown))} mean nothing to the "
            f"rollbox provider; it understands {', '.join(sorted(PROVIDER_OPTIONS))}. Drop "
            "the options another provider's config put there",
            field=f"SandboxSpec.provider_options.{sorted(unknown)[0]}",
            backend=config.backend_name,
        )
    if options.get("platform") is not None:
        _check_platform(options["platform"], config)
    extra: dict[str, Any] = {}
    if spec.entrypoint:
        extra["entrypoint"] = spec.entrypoint
        extra["ready_port"] = options.get("ready_port", spec.ports[0] if spec.ports else None)
    elif options.get("ready_port") is not None:
        raise InvalidSpecError("SandboxSpec.provider_options.ready_port needs an entrypoint")
    if options.get("reset_command") is not None:
        extra["reset_command"] = _text(options["reset_command"], "reset_command")
    if "output_limit_bytes" in options:
        extra["output_limit_bytes"] = options["output_limit_bytes"]
    image = spec.image if spec.image is not None else config.image
    if not isinstance(image, str) or not image.strip():
        raise InvalidSpecError(f"SandboxSpec.image must be an image reference, got {image!r}")
    try:
        mapped = rollbox.SandboxSpec(
            image=config.rewrite(image),
            workdir=spec.workdir if spec.workdir is not None else config.workdir,
            env=_strings(spec.env, "env"),
            labels=_strings(spec.metadata, "metadata"),
            resources=_resources(spec, config, options),
            network=network(options.get("network", config.network),
                            "SandboxSpec.provider_options.network"),
            timeouts=_timeouts(options),
            **extra,
        )
    except TypeError as exc:  # a value of the wrong type in provider_options
        raise InvalidSpecError(f"SandboxSpec.provider_options: {exc}") from None
    return MappedSpec(
        spec=mapped,
        files=_strings(spec.files, "files"),
        ttl_s=_seconds(spec.ttl_s, "ttl_s"),
        ready_timeout_s=_seconds(spec.ready_timeout_s, "ready_timeout_s"),
        ports=tuple(spec.ports),
    )


_ARCH_NAMES = {"amd64": "x86_64", "x86_64": "x86_64", "arm64": "aarch64", "aarch64": "aarch64"}


def _check_platform(wanted: object, config: ProviderConfig) -> None:
    """A platform is honoured where it is this machine's: local sandboxes run here."""
    if not isinstance(wanted, Mapping) or not set(wanted) <= {"os", "arch"}:
        raise InvalidSpecError(f"SandboxSpec.provider_options.platform must be {{os, arch}}, "
                               f"got {wanted!r}")
    if config.backend_name != "local":
        raise SpecNotSupportedError(
            f"SandboxSpec.provider_options.platform: the {config.backend_name} backend cannot "
            "choose a platform; drop it",
            field="SandboxSpec.provider_options.platform", backend=config.backend_name,
        )
    machine = platform.machine().lower()
    here = {"os": platform.system().lower(), "arch": _ARCH_NAMES.get(machine, machine)}
    for key, value in wanted.items():
        value = str(value).lower()
        if _ARCH_NAMES.get(value, value) != here[key]:
            raise SpecNotSupportedError(
                f"SandboxSpec.provider_options.platform {key}={wanted[key]!r}: local sandboxes "
                f"run on this machine ({here['os']}/{here['arch']})",
                field=f"SandboxSpec.provider_options.platform.{key}", backend="local",
            )


def _resources(spec: NemoSpec, config: ProviderConfig, options: Mapping[str, Any]) -> Resources:
    wanted = spec.resources
    if not isinstance(wanted, SandboxResources):  # NeMo Gym converts on construction
        wanted = SandboxResources.from_mapping(wanted)
    if wanted.gpu or wanted.gpu_type:
        raise SpecNotSupportedError(
            f"SandboxSpec.resources gpu={wanted.gpu!r} gpu_type={wanted.gpu_type!r}: rollbox "
            "sandboxes run on CPUs only; use a GPU provider for this environment",
            field="SandboxSpec.resources.gpu", backend=config.backend_name,
        )
    defaults = config.resources
    cpu = wanted.cpu if wanted.cpu is not None else defaults.get("cpu")
    memory_mib = wanted.memory_mib if wanted.memory_mib is not None else defaults.get("memory_mib")
    disk_gib = wanted.disk_gib if wanted.disk_gib is not None else defaults.get("disk_gib")
    limits: dict[str, Any] = {}
    if cpu is not None:
        limits["cpus"] = float(cpu)
    if memory_mib is not None:
        limits["memory_mb"] = _whole(memory_mib, "resources.memory_mib")
    if disk_gib is not None:
        limits["disk_mb"] = _whole(disk_gib * 1024, "resources.disk_gib")
    for name in ("pids", "inodes", "file_size_mb", "cpu_seconds", "best_effort"):
        if options.get(name) is not None:
            limits[name] = options[name]
    return dataclasses.replace(Resources(), **limits)


def _timeouts(options: Mapping[str, Any]) -> Timeouts:
    changes = {}
    if options.get("exec_timeout_s") is not None:
        changes["exec_s"] = options["exec_timeout_s"]
    if options.get("reset_timeout_s") is not None:
        changes["reset_s"] = options["reset_timeout_s"]
    return dataclasses.replace(Timeouts(), **changes)


def _strings(value: Mapping[str, Any] | None, name: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidSpecError(f"SandboxSpec.{name} must be a mapping of str to str")
    for key, item in value.items():
        if not isinstance(key, str) or not isinstance(item, str):
            raise InvalidSpecError(
                f"SandboxSpec.{name}[{key!r}] must be a str, got {type(item).__name__}"
            )
    return dict(value)


def _text(value: object, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidSpecError(f"SandboxSpec.provider_options.{name} must be a non-empty str")
    return value


def _whole(value: float, name: str) -> int:
    if not value > 0 or not math.isfinite(value):
        raise InvalidSpecError(f"SandboxSpec.{name} must be positive, got {value!r}")
    return max(1, math.ceil(value))


def _seconds(value: float | None, name: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0 \
            or not math.isfinite(value):
        raise InvalidSpecError(f"SandboxSpec.{name} must be a positive number of seconds, "
                               f"got {value!r}")
    return float(value)
