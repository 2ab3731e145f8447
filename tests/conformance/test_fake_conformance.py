"""The conformance suite against core's in-memory fake backend.

The fake runs no real programs (``shell=False``) and is no real boundary
(``isolation=False``), so shell-based and isolation tests skip by capability; what is
left runs in well under a few seconds.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from rollbox import Backend, Sandbox
from rollbox.testing import FakeBackend
from rollbox_conformance import BackendTests


class TestFakeConformance(BackendTests):
    @pytest.fixture
    async def backend(self) -> AsyncIterator[Backend]:
        backend = FakeBackend()
        yield backend
        await backend.aclose()

    async def kill_sandbox(self, backend: Backend, sandbox: Sandbox) -> None:
        assert isinstance(backend, FakeBackend)
        backend.kill(sandbox.id)

    async def inject_create_failure(self, backend: Backend) -> None:
        assert isinstance(backend, FakeBackend)
        backend.fail_creates = 1

    def owner_script(self, state: Path) -> str:
        return "from rollbox.testing import FakeBackend as make_backend\n"
