"""The adapter type-checks (mypy strict, the root pyproject's settings) against the real
nemo_gym, which the workspace's own mypy run cannot see (it is not installed there)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_the_adapter_type_checks_against_nemo_gym() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--python-version", "3.13", "-p", "rollbox_nemo_gym"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
