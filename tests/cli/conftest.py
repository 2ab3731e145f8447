"""The ``rollbox`` command as a user runs it: the real entry point in a subprocess, with
a state directory of its own and no ``ROLLBOX_*`` variable from the caller's shell."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_support import Rollbox, runner


@pytest.fixture
def home(searchable_dir: Path) -> Path:
    """``ROLLBOX_HOME`` for the console script, reachable by the sandbox user."""
    return searchable_dir


@pytest.fixture
def rollbox(home: Path) -> Rollbox:
    """The ``rollbox`` console script with ``home`` as its ``ROLLBOX_HOME``."""
    return runner(home)
