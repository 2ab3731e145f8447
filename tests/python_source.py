"""Parsing rollbox's own modules in tests that read its imports.

CPython 3.11.7's ``ast.parse`` at times raises ``SystemError: AST constructor recursion
depth mismatch`` when a garbage collection runs a finalizer in the middle of the parse (an
earlier test's subprocess transport, say). The parse runs with the collector paused."""

from __future__ import annotations

import ast
import gc
from pathlib import Path


def parse(path: Path) -> ast.Module:
    enabled = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(path.read_text(), str(path))
    finally:
        if enabled:
            gc.enable()
