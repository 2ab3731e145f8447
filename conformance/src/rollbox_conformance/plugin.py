"""The pytest plugin (entry point ``pytest11``): registers the suite's markers.

Loaded automatically wherever ``rollbox-conformance`` is installed; it only registers
markers, so it costs nothing to projects that do not subclass the suite.
"""

from __future__ import annotations

import pytest

MARKERS = (
    "conformance: a test of the rollbox backend conformance suite",
    "escape: an escape attempt from a sandbox; it must fail inside the sandbox",
    "slow: long end-to-end or benchmark runs (deselect with -m 'not slow')",
)


def pytest_configure(config: pytest.Config) -> None:
    for line in MARKERS:
        config.addinivalue_line("markers", line)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every suite test ``conformance``, and the isolation ones ``escape`` too."""
    for item in items:
        function = getattr(item, "function", None)
        module = getattr(function, "__module__", "") or ""
        if not module.startswith("rollbox_conformance."):
            continue
        item.add_marker(pytest.mark.conformance)
        if module == "rollbox_conformance.isolation":
            item.add_marker(pytest.mark.escape)
