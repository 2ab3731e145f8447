"""Virtual environments of their own for adapters whose packages cannot share rollbox's.

NeMo Gym needs Python 3.13 and pulls ray and mlflow; OpenHands needs Python 3.12 and
about 200 packages. Installing them next to rollbox would slow every other test and
pin rollbox's own dependencies, so each such adapter's tests run inside an environment
made for them: created once per recipe with uv, cached under ``$ROLLBOX_TEST_ENVS``
(default ``~/.cache/rollbox-test-envs``), and driven from the main suite as a pytest
subprocess. One test command (the README's) still runs everything.

A test module in the main suite uses it like this::

    RECIPE = EnvRecipe(name="nemo-gym", python="3.13", requirements=("nemo-gym==0.7.0",),
                       editable=("core", "plugins/local", "adapters/nemo-gym"))

    def test_adapter_suite() -> None:
        env = ensure_env(RECIPE)           # skips on a laptop without 3.13; fails in CI
        run_pytest_in(env, ["adapters/nemo-gym/tests"])

Where the Python a recipe needs is missing, the test skips with the reason, except
under CI (``CI`` set to a true value), where it fails: CI never skips these.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TEST_TOOLS = ("pytest>=8", "pytest-asyncio>=0.24")
"""Installed in every environment: its tests run under pytest."""


@dataclass(frozen=True)
class EnvRecipe:
    """What one environment holds. Any change to it makes a new environment."""

    name: str
    python: str
    """A version prefix ("3.13", "3.12.1") looked up in pyenv and on PATH, or a path."""
    requirements: tuple[str, ...] = ()
    """Packages from PyPI, pinned (``pkg==1.2.3``) so the cache key means something."""
    editable: tuple[str, ...] = ()
    """Workspace members installed editable, relative to the repository root."""
    install_args: tuple[str, ...] = ()
    """Extra ``uv pip install`` arguments, e.g. ``("--python-version", "3.13.14")`` to
    resolve for a newer patch release than the interpreter (nemo-gym declares 3.13.14)."""


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def cache_root() -> Path:
    configured = os.environ.get("ROLLBOX_TEST_ENVS")
    if configured:
        return Path(configured)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rollbox-test-envs"


def find_python(wanted: str) -> Path | None:
    """The interpreter for ``wanted``: a path, else pyenv's newest matching version, else
    ``pythonX.Y`` on PATH."""
    if os.sep in wanted:
        return Path(wanted) if os.access(wanted, os.X_OK) else None
    pyenv_root = os.environ.get("PYENV_ROOT") or str(Path.home() / ".pyenv")
    versions = Path(pyenv_root) / "versions"
    if versions.is_dir():
        matches = sorted(
            (p for p in versions.iterdir() if p.name == wanted or p.name.startswith(wanted + ".")),
            key=lambda p: [int(x) if x.isdigit() else 0 for x in p.name.split(".")],
        )
        for candidate in reversed(matches):
            binary = candidate / "bin" / "python3"
            if os.access(binary, os.X_OK):
                return binary
    on_path = shutil.which(f"python{wanted}")
    return Path(on_path) if on_path else None


def _uv() -> str:
    found = shutil.which("uv")
    if found is None:
        pytest.fail("uv is not on PATH: python3 -m pip install uv")
    return found


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One creator at a time (parallel test sessions may want the same environment)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_env(recipe: EnvRecipe) -> Path:
    """The environment's directory, created on first use (minutes) and reused after.

    Skips (fails in CI) when the recipe's Python is not on this machine."""
    python = find_python(recipe.python)
    if python is None:
        reason = (f"the {recipe.name} adapter's tests need Python {recipe.python} "
                  f"(pyenv install it, or put python{recipe.python} on PATH)")
        if in_ci():
            pytest.fail(reason + "; CI must run them")
        pytest.skip(reason)
    # The checkout is part of the key: editable installs point into it.
    key_source = json.dumps({**asdict(recipe), "interpreter": str(python), "repo": str(REPO)},
                            sort_keys=True)
    key = hashlib.sha256(key_source.encode()).hexdigest()[:16]
    env = cache_root() / f"{recipe.name}-{key}"
    done = env / ".rollbox-complete"
    if done.exists():
        return env
    with _locked(cache_root() / f".{recipe.name}-{key}.lock"):
        if done.exists():
            return env
        # Made in place (a venv's scripts name its own path), marked complete at the end;
        # an incomplete one from an interrupted run is made again.
        shutil.rmtree(env, ignore_errors=True)
        uv = _uv()
        # --no-config: the repository's own uv settings (its workspace overrides) are
        # not this environment's.
        _check([uv, "venv", "--quiet", "--no-config", "--python", str(python), str(env)])
        editable = [arg for path in recipe.editable for arg in ("-e", str(REPO / path))]
        _check([uv, "pip", "install", "--quiet", "--no-config",
                "--python", str(env / "bin" / "python"),
                *recipe.install_args, *TEST_TOOLS, *recipe.requirements, *editable])
        done.write_text(key_source)
    return env


def run_pytest_in(env: Path, args: Sequence[str], *, timeout_s: float = 3600) -> None:
    """Run pytest inside ``env`` from the repository root; fail with its output if it fails."""
    # The repository's addopts put the main suite on pytest-xdist workers; an environment
    # of its own has no xdist and runs its tests in one process.
    command = [str(env / "bin" / "python"), "-m", "pytest", "-p", "no:cacheprovider",
               "-o", "addopts=--strict-markers", "-q", "-rfEs", *args]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True,
                            timeout=timeout_s, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    sys.stdout.write(result.stdout[-20000:])
    if result.returncode != 0:
        pytest.fail(f"{' '.join(command)} exited {result.returncode}:\n"
                    f"{result.stdout[-8000:]}\n{result.stderr[-4000:]}", pytrace=False)


def _check(command: list[str]) -> None:
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        pytest.fail(f"{' '.join(command)} failed ({result.returncode}):\n"
                    f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}", pytrace=False)
