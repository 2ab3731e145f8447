"""The ``rollbox`` command as a user runs it: the real entry point in a subprocess, with
a state directory of its own and no ``ROLLBOX_*`` variable from the caller's shell."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_support import Rollbox, runner


@pytest.fixture
def home() -> Iterator[Path]:
    """A world-searchable state directory (the sandbox user must reach it as root)."""
    path = Path(tempfile.mkdtemp(prefix="rollbox-cli-"))
    path.chmod(0o711)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def rollbox(home: Path) -> Rollbox:
    """The ``rollbox`` console script with ``home`` as its ``ROLLBOX_HOME``."""
    return runner(home)
