"""A base install (rollbox-core, rollbox-local and rollbox-tools, no extras): what an
extra would add is named with the command that installs it, never a bare ``invalid
choice``."""

from __future__ import annotations

import subprocess

import pytest
from cli_support import cli_env
from isolated_env import EnvRecipe, ensure_env

BASE = EnvRecipe(name="base-install", python="3.11", editable=("core", "plugins/local", "tools"))


@pytest.mark.slow
@pytest.mark.parametrize(("args", "says", "extra"), [
    (["k8s", "render", "--image", "x"], "`rollbox k8s` (the kubernetes commands)",
     "kubernetes"),
    (["k8s", "--help"], "`rollbox k8s` (the kubernetes commands)", "kubernetes"),
    (["run", "--backend", "kubernetes", "--", "true"], "no backend named 'kubernetes'",
     "kubernetes"),
    (["openhands", "--help"], "`rollbox openhands` (the OpenHands commands)", "openhands"),
])
def test_what_an_extra_adds_names_the_extra(args: list[str], says: str, extra: str,
                                           tmp_path: object) -> None:
    env = ensure_env(BASE)
    result = subprocess.run([str(env / "bin" / "rollbox"), *args], capture_output=True,
                            text=True, timeout=60, env=cli_env(tmp_path))  # type: ignore[arg-type]
    assert result.returncode == 2, result.stdout + result.stderr
    assert says in result.stderr, result.stderr
    assert f"uv sync --inexact --extra {extra}" in result.stderr
    assert f'pip install "rollbox[{extra}]"' in result.stderr
    assert "invalid choice" not in result.stderr and "Traceback" not in result.stderr
