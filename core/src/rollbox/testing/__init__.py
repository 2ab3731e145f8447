"""Test helpers shipped with core: an in-memory backend for fast tests and third parties."""

from rollbox.testing.fake import FakeBackend, FakeSandbox, builtin_handler

__all__ = ["FakeBackend", "FakeSandbox", "builtin_handler"]
