"""Running the ``rollbox`` console script as a user would, for the CLI tests."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

Rollbox = Callable[..., subprocess.CompletedProcess[str]]
SCRIPT = Path(sys.executable).with_name("rollbox")
"""The console script of the environment the tests run in."""


def cli_env(home: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment without any ``ROLLBOX_*`` variable, ``home`` as the
    state directory, and ``extra`` on top."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLBOX_")}
    env["ROLLBOX_HOME"] = str(home)
    env.update(extra or {})
    return env


def runner(home: Path) -> Rollbox:
    """``run(*args, env={...}, input=..., timeout=..., **subprocess_options)``."""

    def run(*args: str, env: dict[str, str] | None = None, timeout: float = 60,
            **kwargs: object) -> subprocess.CompletedProcess[str]:
        if "input" not in kwargs:
            kwargs.setdefault("stdin", subprocess.DEVNULL)
        return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True,
                              timeout=timeout, env=cli_env(home, env), **kwargs)  # type: ignore[call-overload]

    return run
