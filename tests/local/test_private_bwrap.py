"""Root installs often live under a private home (/root/.venv): the sandbox user, who
runs bwrap, cannot reach that. The backend then runs a copy from its state directory."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from rollbox import SandboxSpec
from rollbox_local import LocalBackend
from rollbox_local.bwrap import find_bwrap

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="only root maps sandboxes to "
                                "another uid; an unprivileged user runs its own bwrap")


async def test_bwrap_under_a_private_directory_is_run_from_a_public_copy(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = Path(find_bwrap().path)
    private = Path(tempfile.mkdtemp(prefix="rollbox-private-"))  # mode 0700
    try:
        site = private / "site"
        shutil.copytree(real.parents[1], site / real.parents[1].name)
        for libs in real.parents[2].glob(f"{real.parents[1].name}*.libs"):
            shutil.copytree(libs, site / libs.name)
        hidden = site / real.relative_to(real.parents[2])
        hidden.chmod(0o755)
        monkeypatch.setenv("ROLLBOX_BWRAP", str(hidden))
        find_bwrap.cache_clear()
        backend = LocalBackend(state_dir=state_dir)
        try:
            assert Path(backend.bwrap.path).is_relative_to(state_dir)
            sandbox = await backend.create(SandboxSpec())
            async with sandbox:
                assert (await sandbox.exec(["echo", "ok"])).stdout == b"ok\n"
        finally:
            await backend.aclose()
    finally:
        find_bwrap.cache_clear()
        shutil.rmtree(private)
