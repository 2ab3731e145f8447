"""Shared test configuration for the cross-package tests."""

# pytester: the conformance suite is itself tested against broken backends
# (tests/conformance/test_suite_can_fail.py).
pytest_plugins = ["pytester"]
