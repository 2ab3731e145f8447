"""What every conformance class shares: the fixtures, the hooks a backend overrides,
and small helpers (capability checks, deadlines, shell snippets).

Hooks, each with a default that is right for most backends:

- ``backend`` fixture, or the ``backend_factory`` class attribute: the backend under test.
- ``spec``: the SandboxSpec the suite's sandboxes are made from.
- ``missing_image_ref``: an image reference that exists nowhere.
- ``scratch_dir``: a writable directory inside the sandbox, for shell tests.
- ``timeout_slack_s``: how long past a timeout a backend may take to kill a command.
- ``kill_sandbox(backend, sandbox)``: kill a sandbox from outside (default: skip).
- ``inject_create_failure(backend)``: make the next create fail (default: skip).
- ``leak_check(backend)``: what the backend still holds (default: ``backend.leftovers()``).
- ``host_secret_paths(tmp_path, rootdir)``: where isolation tests plant host secrets.
- ``owner_script(state)``: how to build the backend in another process, for the test of
  what a killed owner leaves behind (default: skip).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import ClassVar

import pytest
import pytest_asyncio
from rollbox import Backend, Capabilities, ExecResult, Sandbox, SandboxSpec


class BackendTestBase:
    """Fixtures and hooks shared by every conformance class. Not collected on its own."""

    pytestmark: ClassVar[list[pytest.MarkDecorator]] = [pytest.mark.asyncio]

    spec: ClassVar[SandboxSpec] = SandboxSpec(image="host")
    backend_factory: ClassVar[Callable[[], Backend] | None] = None
    missing_image_ref: ClassVar[str] = "rollbox-conformance.invalid/no-such-image:never"
    scratch_dir: ClassVar[str] = "/tmp"
    timeout_slack_s: ClassVar[float] = 10.0

    # -- fixtures ------------------------------------------------------------------------

    @pytest_asyncio.fixture
    async def backend(self) -> AsyncIterator[Backend]:
        """The backend under test. Override this fixture or set ``backend_factory``."""
        factory = type(self).backend_factory
        if factory is None:
            pytest.fail(
                f"{type(self).__name__} must override the `backend` fixture "
                "or set `backend_factory`"
            )
        backend = factory()
        try:
            yield backend
        finally:
            await backend.aclose()

    @pytest_asyncio.fixture
    async def sandbox(self, backend: Backend) -> AsyncIterator[Sandbox]:
        """A fresh sandbox of ``spec``, closed after the test."""
        sandbox = await backend.create(self.spec)
        try:
            yield sandbox
        finally:
            await sandbox.close()

    # -- hooks -----------------------------------------------------------------------------

    async def kill_sandbox(self, backend: Backend, sandbox: Sandbox) -> None:
        """Kill ``sandbox`` from outside, as a crashed node or OOM killer would, and
        return once it is dead (the tests then expect SandboxLostError right away)."""
        pytest.skip("override kill_sandbox() to test how a killed sandbox surfaces")

    async def inject_create_failure(self, backend: Backend) -> None:
        """Make the backend's next ``create`` fail with CreateFailedError."""
        pytest.skip("override inject_create_failure() to test how a failed create surfaces")

    async def leak_check(self, backend: Backend) -> list[str]:
        """Everything the backend still holds, one line each (processes, mounts,
        directories, remote objects). Override to look where the backend cannot."""
        return await backend.leftovers()

    def host_secret_paths(self, tmp_path: Path, rootdir: Path) -> list[Path]:
        """Host files the isolation tests plant a secret in and try to read from inside.

        Default: a temporary directory, the home directory, ``/root`` and the project
        directory; any that cannot be written is left out.
        """
        name = f".rollbox-conformance-secret-{uuid.uuid4().hex}"
        candidates = [tmp_path / "secret.txt", Path.home() / name, Path("/root") / name,
                      rootdir / name]
        return [p for p in dict.fromkeys(candidates) if os.access(p.parent, os.W_OK)]

    def owner_script(self, state: Path) -> str:
        """Python source defining ``make_backend()``: a new backend of the kind under test,
        configured like the one under test, keeping its state in ``state`` (a fresh,
        world-searchable directory).

        The crash test runs it in a fresh interpreter (``sys.executable``) that makes
        sandboxes and is then killed with SIGKILL, and again in this process, for a fresh
        backend that must find nothing left."""
        pytest.skip("override owner_script() to test what a killed owner leaves behind")

    # -- helpers ---------------------------------------------------------------------------

    @staticmethod
    def require(backend: Backend, *flags: str) -> None:
        """Skip unless the backend declares every capability in ``flags``."""
        caps: Capabilities = backend.capabilities
        missing = [flag for flag in flags if not getattr(caps, flag)]
        if missing:
            pytest.skip(f"backend does not declare capabilities: {', '.join(missing)}")

    @contextlib.asynccontextmanager
    async def within(self, seconds: float, what: str) -> AsyncIterator[None]:
        """Fail the test (instead of hanging) if the body runs past ``seconds``."""
        try:
            async with asyncio.timeout(seconds):
                yield
        except TimeoutError:
            pytest.fail(f"{what} did not finish within {seconds:.1f}s")

    async def sh(
        self,
        sandbox: Sandbox,
        script: str,
        *,
        timeout: float = 30.0,
        stdin: bytes | None = None,
        output_limit: int | None = None,
    ) -> ExecResult:
        """Run a shell snippet, guarded so that a hung backend fails the test."""
        async with self.within(timeout + self.timeout_slack_s, f"shell snippet {script!r}"):
            return await sandbox.exec(
                script, timeout=timeout, stdin=stdin, output_limit=output_limit
            )

    def scratch(self, name: str) -> str:
        """A unique path under ``scratch_dir`` inside the sandbox."""
        return f"{self.scratch_dir.rstrip('/')}/rbx-{name}-{uuid.uuid4().hex[:12]}"

    async def open_sandboxes(self, backend: Backend, count: int,
                             spec: SandboxSpec | None = None) -> Sequence[Sandbox]:
        """``count`` sandboxes created concurrently (the caller closes them)."""
        return await asyncio.gather(*(backend.create(spec or self.spec) for _ in range(count)))
