"""Fixtures for tests against the real local backend (bubblewrap on this machine)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from rollbox_local import LocalBackend


@pytest.fixture
def state_dir(searchable_dir: Path) -> Path:
    """A backend's state directory the sandbox user can reach (``searchable_dir``)."""
    return searchable_dir


@pytest.fixture
async def backend(state_dir: Path) -> AsyncIterator[LocalBackend]:
    backend = LocalBackend(state_dir=state_dir)
    try:
        yield backend
    finally:
        await backend.aclose()
