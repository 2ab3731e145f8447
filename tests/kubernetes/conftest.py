"""Fixtures: an API server emulator on loopback whose pods run real commands."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest
from rollbox.spec import SandboxSpec, Timeouts
from rollbox_kubernetes import KubernetesBackend
from rollbox_kubernetes.testing import ApiServerEmulator, ShellBackend

GIT_INIT = ("git init -q && echo base > tracked.txt && git add tracked.txt && "
            "git -c user.email=t@t -c user.name=t commit -q -m base")

BackendFactory = Callable[..., KubernetesBackend]


def backing_backend() -> ShellBackend:
    """What runs each emulated pod (switch to rollbox_local.LocalBackend once it lands)."""
    return ShellBackend(missing={"registry.invalid/nope:1"}, init_script=GIT_INIT)


@pytest.fixture
async def emulator() -> AsyncIterator[ApiServerEmulator]:
    async with ApiServerEmulator(backing_backend(), node_labels={"pool": "sandbox"}) as emu:
        yield emu


@pytest.fixture
async def make_backend(emulator: ApiServerEmulator) -> AsyncIterator[BackendFactory]:
    made: list[KubernetesBackend] = []

    def make(**options: object) -> KubernetesBackend:
        options.setdefault("run_id", "test")
        options.setdefault("warm_replicas", 1)
        backend = KubernetesBackend(host=emulator.url, **options)  # type: ignore[arg-type]
        made.append(backend)
        return backend

    yield make
    for backend in made:
        await backend.aclose()


@pytest.fixture
def spec() -> SandboxSpec:
    return SandboxSpec(image="ubuntu:24.04", workdir="/work", timeouts=Timeouts(create_s=10))
