"""Fixtures for the NeMo Gym adapter's tests (run in their own Python 3.13 environment by
tests/nemo_gym/test_nemo_gym_env.py, against the real nemo-gym 0.7.0).

Every test gets a rollbox home of its own and ends with the adapter's rollbox loop shut
down, and fails if a sandbox process of its own is still running then.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import rollbox_nemo_gym
from nemo_gym.sandbox.providers import registry
from ng_support import sandbox_processes


@pytest.fixture(autouse=True)
def rollbox_home(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A rollbox home of the test's own. World-searchable, unlike ``tmp_path`` (0700 as
    root): the sandbox user must reach it."""
    home = Path(tempfile.mkdtemp(prefix="rollbox-nemo-gym-"))
    home.chmod(0o711)
    monkeypatch.setenv("ROLLBOX_HOME", str(home))
    monkeypatch.delenv("ROLLBOX_BACKEND", raising=False)
    try:
        yield home
        rollbox_nemo_gym.shutdown()
        assert sandbox_processes() == [], "sandboxes still run after the rollbox loop stopped"
    finally:
        rollbox_nemo_gym.shutdown()
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(autouse=True)
def fresh_registry() -> Iterator[None]:
    """NeMo Gym caches entry points on first use; look them up afresh in each test."""
    registry._ENTRY_POINT_LOADERS = None
    yield
    registry._ENTRY_POINT_LOADERS = None
