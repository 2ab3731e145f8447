"""``import rollbox`` gives what the README uses; the error tree is complete; core stands
alone (no module of it imports a backend, an adapter or the bench)."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import rollbox
from python_source import parse
from rollbox import errors
from rollbox.plugins import get_plugin_manager, pool_policies

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "core" / "src" / "rollbox"


def error_classes() -> list[type[BaseException]]:
    return [cls for _, cls in inspect.getmembers(errors, inspect.isclass)
            if issubclass(cls, errors.RollboxError) and cls.__module__ == errors.__name__]


def test_every_error_is_exported_and_drawn_in_the_tree() -> None:
    doc = errors.__doc__ or ""
    for cls in error_classes():
        assert getattr(rollbox, cls.__name__) is cls, f"rollbox.{cls.__name__} is missing"
        assert re.search(rf"\b{cls.__name__}\b", doc), f"{cls.__name__} not in the tree"
    assert "SANDBOX_SOUND_AFTER" in doc and rollbox.SANDBOX_SOUND_AFTER is \
        errors.SANDBOX_SOUND_AFTER


def test_every_registered_policy_is_exported() -> None:
    for cls in pool_policies(get_plugin_manager(load_entrypoints=False)).values():
        assert getattr(rollbox, cls.__name__) is cls


def test_what_the_readme_names_exists() -> None:
    readme = (ROOT / "README.md").read_text()
    named = set(re.findall(r"\brollbox\.(\w+)", readme))
    assert {"open_backend", "Pool", "SandboxSpec", "runner", "errors"} <= named
    missing = sorted(n for n in named if not hasattr(rollbox, n))
    assert not missing, missing
    for name in ("Task", "RetryPolicy", "run_rollouts", "Session", "SandboxWrapper"):
        assert name in rollbox.__all__


def test_no_core_module_imports_a_plugin_an_adapter_or_the_bench() -> None:
    found = []
    for path in CORE.rglob("*.py"):
        for node in ast.walk(parse(path)):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.relative_to(CORE)}: {n}" for n in names
                      if n.split(".")[0].startswith("rollbox_")]
    assert not found, found
