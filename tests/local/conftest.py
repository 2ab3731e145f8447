"""Fixtures for tests against the real local backend (bubblewrap on this machine)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from rollbox_local import LocalBackend


@pytest.fixture
def state_dir() -> Iterator[Path]:
    """Like ``tmp_path``, but world-searchable: pytest's own base directory is private
    (0700) when running as root, and the sandbox user must reach the state directory."""
    path = Path(tempfile.mkdtemp(prefix="rollbox-test-"))
    path.chmod(0o711)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def backend(state_dir: Path) -> AsyncIterator[LocalBackend]:
    backend = LocalBackend(state_dir=state_dir)
    try:
        yield backend
    finally:
        await backend.aclose()
