"""Every field of NeMo Gym's SandboxSpec is mapped onto rollbox's, or refused by name."""

from __future__ import annotations

import dataclasses
import platform

import pytest
from nemo_gym.sandbox import AsyncSandbox, SandboxCreateError, SandboxResources, SandboxSpec
from rollbox.errors import (
    ImageNotFoundError,
    InvalidSpecError,
    UnsupportedSpecError,
    UsageError,
)
from rollbox.spec import Network
from rollbox_nemo_gym import RollboxProvider, SpecNotSupportedError
from rollbox_nemo_gym.config import ProviderConfig
from rollbox_nemo_gym.specs import MAPPED_FIELDS, MAPPED_RESOURCES, map_spec

CONFIG = ProviderConfig.from_options({
    "image_rewrites": [{"from": "docker.io/library/python:", "to": "host-python-"}],
    "resources": {"memory_mib": 1024},
})


def test_no_nemo_gym_field_goes_unread() -> None:
    """A field NeMo Gym adds fails here until the mapping reads it."""
    assert set(SandboxSpec.__dataclass_fields__) == MAPPED_FIELDS
    assert set(SandboxResources.__dataclass_fields__) == MAPPED_RESOURCES


def test_every_field_lands_where_the_mapping_says() -> None:
    mapped = map_spec(SandboxSpec(
        image="docker.io/library/python:3.12-slim",
        ttl_s=60,
        ready_timeout_s=5,
        workdir="/work",
        env={"A": "1"},
        files={"x.txt": "x"},
        metadata={"harness": "t"},
        resources={"cpu": 2, "memory_mib": 512, "disk_gib": 3},
        provider_options={"network": "host", "pids": 64, "output_limit_bytes": 1000,
                          "exec_timeout_s": 30, "reset_command": "true", "inodes": 5000,
                          "best_effort": True},
    ), CONFIG)
    spec = mapped.spec
    assert spec.image == "host-python-3.12-slim"
    assert spec.workdir == "/work"
    assert spec.env == {"A": "1"}
    assert spec.labels == {"harness": "t"}
    assert (spec.resources.cpus, spec.resources.memory_mb, spec.resources.disk_mb) == (
        2.0, 512, 3 * 1024)
    assert (spec.resources.pids, spec.resources.inodes, spec.resources.best_effort) == (
        64, 5000, True)
    assert spec.network is Network.HOST
    assert spec.output_limit_bytes == 1000
    assert spec.timeouts.exec_s == 30
    assert spec.reset_command == "true"
    assert (mapped.files, mapped.ttl_s, mapped.ready_timeout_s) == ({"x.txt": "x"}, 60.0, 5.0)


def test_unset_fields_take_the_providers_defaults() -> None:
    mapped = map_spec(SandboxSpec(), CONFIG)
    assert (mapped.spec.image, mapped.spec.workdir, mapped.spec.network) == ("host", "/",
                                                                              Network.NONE)
    assert mapped.spec.resources.memory_mb == 1024  # the provider's resources default
    assert mapped.spec.resources.cpus is None  # unset: the backend's default
    assert (mapped.ttl_s, mapped.ready_timeout_s, mapped.files) == (None, None, {})


def test_equal_specs_share_a_pool_key() -> None:
    one = map_spec(SandboxSpec(env={"A": "1"}, files={"a": "1"}, ttl_s=5), CONFIG)
    two = map_spec(SandboxSpec(env={"A": "1"}, files={"b": "2"}, ttl_s=9), CONFIG)
    assert one.spec == two.spec and hash(one.spec) == hash(two.spec)


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"resources": {"gpu": 1}}, "GPU provider"),
        ({"resources": {"gpu_type": "H100"}}, "GPU provider"),
        ({"provider_options": {"volumes": ["/data:/data"]}}, "volumes mean nothing"),
        ({"provider_options": {"platform": {"os": "windows"}}}, "run on this machine"),
        ({"provider_options": {"platform": {"arch": "riscv64"}}}, "run on this machine"),
    ],
)
def test_a_field_rollbox_cannot_honour_is_refused(fields: dict[str, object], says: str) -> None:
    with pytest.raises(SpecNotSupportedError, match=says) as caught:
        map_spec(SandboxSpec(**fields), CONFIG)  # type: ignore[arg-type]
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, UsageError)
    assert isinstance(caught.value, UnsupportedSpecError) and caught.value.field


def test_an_entrypoint_waits_for_its_ready_port() -> None:
    server = ["python3", "-m", "http.server", "8000"]
    declared = map_spec(SandboxSpec(entrypoint=server, ports=[8000, 9000]), CONFIG).spec
    assert (declared.entrypoint, declared.ready_port) == (tuple(server), 8000)
    named = map_spec(SandboxSpec(entrypoint=server, ports=[8000],
                                 provider_options={"ready_port": 9000}), CONFIG).spec
    assert named.ready_port == 9000
    assert map_spec(SandboxSpec(entrypoint=server), CONFIG).spec.ready_port is None
    with pytest.raises(InvalidSpecError, match="ready_port needs an entrypoint"):
        map_spec(SandboxSpec(provider_options={"ready_port": 80}), CONFIG)


def test_this_machines_platform_is_accepted() -> None:
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    map_spec(SandboxSpec(provider_options={"platform": {"os": "linux", "arch": arch}}), CONFIG)
    with pytest.raises(SpecNotSupportedError, match="cannot choose a platform"):
        map_spec(SandboxSpec(provider_options={"platform": {"os": "linux"}}),
                 dataclasses.replace(CONFIG, backend="kubernetes"))


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"workdir": "relative/dir"}, "workdir must be an absolute path"),
        ({"ttl_s": 0}, "ttl_s must be a positive number"),
        ({"ready_timeout_s": -1}, "ready_timeout_s must be a positive number"),
        ({"env": {"A": 1}}, r"env\['A'\] must be a str"),
        ({"resources": {"memory_mib": 0}}, "memory_mib must be positive"),
        ({"resources": {"cpu": -1}}, "cpus must be a positive number"),
        ({"provider_options": {"network": "internet"}}, "network must be one of"),
        ({"provider_options": {"pids": "many"}}, "pids must be a positive number"),
        ({"image": " "}, "image"),
    ],
)
def test_a_malformed_field_is_an_invalid_spec(fields: dict[str, object], says: str) -> None:
    with pytest.raises(UsageError, match=says):
        map_spec(SandboxSpec(**fields), CONFIG)  # type: ignore[arg-type]


async def test_create_refuses_before_any_sandbox_starts() -> None:
    provider = RollboxProvider(keep_warm_s=0)
    with pytest.raises(SpecNotSupportedError):
        await provider.create(SandboxSpec(resources={"gpu": 1}))
    await provider.aclose()


async def test_a_missing_image_is_a_create_error_that_says_so() -> None:
    sandbox = AsyncSandbox({"rollbox": {"keep_warm_s": 0}}, SandboxSpec(image="no/such:image"))
    with pytest.raises(SandboxCreateError, match="no/such:image") as caught:
        await sandbox.start()
    assert isinstance(caught.value.cause, ImageNotFoundError)
    assert caught.value.retryable is False
    await sandbox.stop()
