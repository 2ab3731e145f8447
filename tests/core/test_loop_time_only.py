"""Core reads time only from the running event loop, so the same pool, policies, limiter
and runner run in virtual time (rollbox-sim) as they do for real."""

from __future__ import annotations

import ast
from pathlib import Path

import rollbox
from python_source import parse

CLOCKS = {"time", "datetime", "timeit"}
"""Modules whose use means a wall or process clock."""


def test_no_module_of_core_reads_a_clock_of_its_own() -> None:
    root = Path(rollbox.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(parse(path)):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module.split(".")[0]]
            found += [f"{path.relative_to(root)}:{node.lineno} imports {name}"
                      for name in names if name in CLOCKS]
    assert found == [], "core must use loop.time() and asyncio.sleep: " + "; ".join(found)
