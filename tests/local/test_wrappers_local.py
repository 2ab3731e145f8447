"""Wrapped sandboxes and backends behave as the real ones, on real local sandboxes.

A leased sandbox (``MeteredSandbox``) and a fault-injecting one (``ChaosSandbox``, rates
0) must run commands in the image's environment, as a bare sandbox does; a wrapped
backend reports what the real one holds and checks what the real one checks.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from rollbox import Pool, SandboxSpec
from rollbox_bench.chaos import ChaosBackend
from rollbox_local import LocalBackend
from rollbox_local.oci_build import write_oci_layout

IMAGE_VALUE = "set-by-the-image"


@pytest.fixture
def image_spec(state_dir: Path) -> SandboxSpec:
    """An image whose config sets IMAGE_VAR (and nothing in the spec does)."""
    layout = write_oci_layout(state_dir / "image", {"marker": b"x"}, base_host=True,
                              env={"IMAGE_VAR": IMAGE_VALUE})
    return SandboxSpec(image=str(layout), workdir="/")


async def test_bare_sandbox_sees_the_image_env(backend: LocalBackend,
                                               image_spec: SandboxSpec) -> None:
    async with await backend.create(image_spec) as sandbox:
        assert (await sandbox.exec("echo $IMAGE_VAR")).text.strip() == IMAGE_VALUE


async def test_leased_sandbox_sees_the_image_env(backend: LocalBackend,
                                                 image_spec: SandboxSpec) -> None:
    async with Pool(backend) as pool, pool.lease(image_spec) as sandbox:
        assert (await sandbox.exec("echo $IMAGE_VAR")).text.strip() == IMAGE_VALUE
        assert sandbox.base_env["IMAGE_VAR"] == IMAGE_VALUE


async def test_chaos_sandbox_sees_the_image_env(backend: LocalBackend,
                                                image_spec: SandboxSpec) -> None:
    chaos = ChaosBackend(backend)
    async with await chaos.create(image_spec) as sandbox:
        assert (await sandbox.exec("echo $IMAGE_VAR")).text.strip() == IMAGE_VALUE


async def test_leased_chaos_sandbox_sees_the_image_env(backend: LocalBackend,
                                                       image_spec: SandboxSpec) -> None:
    async with Pool(ChaosBackend(backend)) as pool, pool.lease(image_spec) as sandbox:
        assert (await sandbox.exec("echo $IMAGE_VAR")).text.strip() == IMAGE_VALUE


async def test_chaos_backend_reports_the_real_leftovers_and_checks(
        backend: LocalBackend) -> None:
    chaos = ChaosBackend(backend)
    before = set(await backend.leftovers())
    sandbox = await chaos.create(SandboxSpec(image="host"))
    try:
        held = set(await chaos.leftovers()) - before
        assert held, "a live sandbox is something the backend holds"
        assert held == set(await backend.leftovers()) - before
    finally:
        await sandbox.close()
    assert set(await chaos.leftovers()) <= before
    # doctor() is synchronous and runs its own event loop: call it off this one.
    checks = await asyncio.to_thread(chaos.doctor)
    assert checks and [d.check for d in checks] == [
        d.check for d in await asyncio.to_thread(LocalBackend.doctor)]
    assert chaos.capabilities == backend.capabilities


async def test_preparing_a_chaos_sandbox_starts_the_real_agent(backend: LocalBackend) -> None:
    async with await ChaosBackend(backend).create(SandboxSpec(image="host")) as sandbox:
        generation = sandbox.inner._current  # type: ignore[attr-defined]
        assert generation.agent is None, "create starts no agent: prepare() is what does"
        await sandbox.prepare()
        assert generation.agent is not None, "prepare() did not reach the local sandbox"
