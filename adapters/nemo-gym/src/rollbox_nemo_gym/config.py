"""The provider's settings: the keyword arguments of ``RollboxProvider``, i.e. its YAML block.

Every key is checked when the provider is made, so a typo fails at configuration time
with the list of known keys, never later inside a rollout.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import rollbox
from rollbox.envs.pools import pool_kwargs
from rollbox.errors import UsageError
from rollbox.spec import Network

SHELLS = ("auto", "bash", "sh")

RESOURCE_KEYS = frozenset({"cpu", "memory_mib", "disk_gib"})
"""NeMo Gym ``SandboxResources`` fields the provider maps onto rollbox's limits."""


@dataclass(frozen=True)
class ImageRewrite:
    """NeMo Gym's own image-rewrite rule: a reference starting with ``prefix`` gets
    ``replacement`` instead of it."""

    prefix: str
    replacement: str


@dataclass(frozen=True)
class ProviderConfig:
    """What a ``rollbox:`` block in NeMo Gym's YAML may say."""

    backend: str | None = None
    """A registered rollbox backend: ``local`` (default: ``$ROLLBOX_BACKEND`` or local),
    ``kubernetes``, ``remote`` (a ``rollbox serve``), or a plugin's."""
    backend_options: Mapping[str, Any] = field(default_factory=dict)
    pool_options: Mapping[str, Any] = field(default_factory=dict)
    keep_warm_s: float = 300.0
    """How long a shared pool stays warm after its last provider closed."""
    image: str = "host"
    """The image of a SandboxSpec that names none."""
    image_rewrites: tuple[ImageRewrite, ...] = ()
    workdir: str = "/"
    """The working directory of a SandboxSpec that names none."""
    network: Network = Network.NONE
    """The network of every sandbox unless its provider_options say otherwise."""
    resources: Mapping[str, float] = field(default_factory=dict)
    """Defaults for the SandboxResources fields a spec leaves unset."""
    shell: str = "auto"
    """What runs a command string: ``bash``, ``sh``, or ``auto`` (bash where the image
    has it, else sh)."""
    default_timeout_s: float = 180.0

    @property
    def backend_name(self) -> str:
        """The backend ``rollbox.open_backend`` will open for this config."""
        return self.backend or os.environ.get("ROLLBOX_BACKEND") or rollbox.DEFAULT_BACKEND

    @property
    def shared_pool_options(self) -> dict[str, Any]:
        """The pool options the shared pool is made with."""
        options = dict(self.pool_options)
        if self.backend_name == "remote":
            options.setdefault("policy", "none")  # see _check_remote_pool
        return options

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> ProviderConfig:
        known = set(cls.__dataclass_fields__)
        unknown = set(options) - known
        if unknown:
            raise UsageError(
                f"unknown rollbox provider settings: {', '.join(sorted(unknown))}; known: "
                f"{', '.join(sorted(known))} (see docs/nemo-gym.md)"
            )
        values = dict(options)
        for name in ("backend_options", "pool_options", "resources"):
            value = values.get(name)
            if value is None:
                values.pop(name, None)
            elif not isinstance(value, Mapping):
                raise UsageError(f"rollbox provider setting {name} must be a mapping")
            else:
                values[name] = dict(value)
        if "pool_options" in values:
            pool_kwargs(values["pool_options"])  # refuses unknown options now
        if "image_rewrites" in values:
            values["image_rewrites"] = _rewrites(values["image_rewrites"])
        if "network" in values:
            values["network"] = network(values["network"], "network")
        if "resources" in values:
            values["resources"] = _resources(values["resources"])
        for name in ("keep_warm_s", "default_timeout_s"):
            if name in values:
                values[name] = _seconds(values[name], name, allow_zero=name == "keep_warm_s")
        for name in ("image", "workdir"):
            if name in values and (not isinstance(values[name], str) or not values[name]):
                raise UsageError(f"rollbox provider setting {name} must be a non-empty string")
        if values.get("shell", "auto") not in SHELLS:
            raise UsageError(f"rollbox provider setting shell must be one of {', '.join(SHELLS)}")
        if values.get("backend") is not None and not isinstance(values["backend"], str):
            raise UsageError("rollbox provider setting backend must be a backend name")
        made = cls(**values)
        _check_remote_pool(made)
        return made

    def rewrite(self, image: str) -> str:
        for rule in self.image_rewrites:
            if image.startswith(rule.prefix):
                return rule.replacement + image[len(rule.prefix):]
        return image


def _check_remote_pool(config: ProviderConfig) -> None:
    """With ``backend: remote`` the server pools: it keeps released sandboxes warm and
    resets them, and gives each hand-out a new id. A pool here that reused sandboxes
    would give one id to several sessions, and a descriptor (``serialize``) of an ended
    session would reach the next one's sandbox."""
    if config.backend_name != "remote":
        return
    policy = pool_kwargs(config.pool_options).get("policy")
    if policy is not None and policy.reuse:
        raise UsageError(
            f"pool_options.policy {policy.name!r} reuses sandboxes in this process; with "
            "backend: remote the server keeps them warm and resets them: drop the policy "
            "(or use none) and size the server's pool (rollbox serve --max-idle)"
        )


def network(value: object, where: str) -> Network:
    try:
        return Network(value)
    except ValueError:
        choices = ", ".join(n.value for n in Network)
        raise UsageError(f"{where} must be one of {choices}, got {value!r}") from None


def _rewrites(value: object) -> tuple[ImageRewrite, ...]:
    """NeMo Gym's format: a list of ``{from: PREFIX, to: REPLACEMENT}``."""
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise UsageError("rollbox provider setting image_rewrites must be a list of "
                         "{from: PREFIX, to: REPLACEMENT}")
    rules = []
    for item in value:
        if (not isinstance(item, Mapping) or set(item) != {"from", "to"}
                or not all(isinstance(v, str) for v in item.values())):
            raise UsageError(f"image_rewrites entry {item!r} must be {{from: PREFIX, to: "
                             "REPLACEMENT}")
        rules.append(ImageRewrite(item["from"], item["to"]))
    return tuple(rules)


def _resources(value: Mapping[str, Any]) -> dict[str, float]:
    unknown = set(value) - RESOURCE_KEYS
    if unknown:
        raise UsageError(f"rollbox provider setting resources has unknown keys "
                         f"{', '.join(sorted(unknown))}; known: {', '.join(sorted(RESOURCE_KEYS))}")
    return {k: _positive(v, f"resources.{k}") for k, v in value.items() if v is not None}


def _seconds(value: object, name: str, *, allow_zero: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise UsageError(f"rollbox provider setting {name} must be a number of seconds")
    if value < 0 or (value == 0 and not allow_zero):
        raise UsageError(f"rollbox provider setting {name} must be positive, got {value}")
    return float(value)


def _positive(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise UsageError(f"{name} must be a positive number, got {value!r}")
    return float(value)
