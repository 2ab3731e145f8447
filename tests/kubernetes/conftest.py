"""Fixtures: an API server emulator on loopback whose pods are real local sandboxes
(``rollbox_local.LocalBackend``: bubblewrap, copy-on-write layers, no network)."""

from __future__ import annotations

import contextlib
import io
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from rollbox.spec import SandboxSpec, Timeouts
from rollbox_kubernetes import KubernetesBackend
from rollbox_kubernetes.testing import ApiServerEmulator, container_runtime
from rollbox_local.oci_build import write_oci_layout

GIT = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]

BackendFactory = Callable[..., KubernetesBackend]


def world_searchable_dir(prefix: str) -> Path:
    """A temporary directory the sandbox user can reach (pytest's base dir is 0700 when
    running as root; see tests/local/conftest.py)."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    path.chmod(0o711)
    return path


def git_task_image(dest: Path) -> Path:
    """An OCI image over the host's system dirs whose ``/work`` is a one-commit git
    checkout (``tracked.txt`` = ``base``), as a SWE-style task image would be."""
    repo = dest / "repo"
    repo.mkdir(parents=True)
    (repo / "tracked.txt").write_text("base\n")
    for args in (["init", "-q"], ["add", "tracked.txt"], ["commit", "-q", "-m", "base"]):
        subprocess.run([*GIT, *args], cwd=repo, check=True, capture_output=True)
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        tar.add(repo, arcname="work")
    return write_oci_layout(dest / "image", {}, layers=[raw.getvalue()], base_host=True,
                            workdir="/work")


@pytest.fixture(scope="session")
def task_image() -> Iterator[str]:
    root = world_searchable_dir("rollbox-k8s-image-")
    try:
        yield str(git_task_image(root))
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def local_state() -> Iterator[Path]:
    path = world_searchable_dir("rollbox-k8s-test-")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def emulator(local_state: Path) -> AsyncIterator[ApiServerEmulator]:
    backing = container_runtime(local_state)
    async with ApiServerEmulator(backing, node_labels={"pool": "sandbox"}) as emu:
        yield emu


@contextlib.asynccontextmanager
async def _backends_on(url: str, **defaults: object) -> AsyncIterator[BackendFactory]:
    """A factory of backends talking to ``url`` (``defaults`` under each call's
    options), every one of them closed at the end."""
    made: list[KubernetesBackend] = []

    def make(**options: object) -> KubernetesBackend:
        backend = KubernetesBackend(host=url, **{**defaults, **options})  # type: ignore[arg-type]
        made.append(backend)
        return backend

    try:
        yield make
    finally:
        for backend in made:
            await backend.aclose()


@pytest.fixture
def backends_on() -> Callable[..., contextlib.AbstractAsyncContextManager[BackendFactory]]:
    return _backends_on


@pytest.fixture
async def make_backend(emulator: ApiServerEmulator) -> AsyncIterator[BackendFactory]:
    async with _backends_on(emulator.url, run_id="test", scale_delay_s=0.05) as make:
        yield make


@pytest.fixture
def spec(task_image: str) -> SandboxSpec:
    return SandboxSpec(image=task_image, workdir="/work", timeouts=Timeouts(create_s=20))
