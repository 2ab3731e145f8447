"""Tests never touch the user's store: the session's ``ROLLBOX_HOME`` (tests/conftest.py)
is a fresh directory, whatever the user's environment says."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from rollbox_local.oci_build import write_oci_layout

CONFTEST = Path(__file__).with_name("conftest.py")


def test_a_backend_opened_with_defaults_leaves_the_users_store_alone(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    users_store = tmp_path / "users-store"
    monkeypatch.setenv("ROLLBOX_HOME", str(users_store))
    image = write_oci_layout(tmp_path / "image", {"marker": b"from the image\n"},
                             base_host=True)
    tmp_path.chmod(0o755)
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(test_defaults=textwrap.dedent(f"""
        import os
        from rollbox import SandboxSpec
        from rollbox.paths import default_home
        from rollbox_local import LocalBackend
        from rollbox_local.images import ImageStore


        async def test_defaults():
            assert default_home() != {str(users_store)!r}
            async with LocalBackend() as backend:
                sandbox = await backend.create(SandboxSpec(image={str(image)!r}))
                async with sandbox:
                    assert (await sandbox.exec(["cat", "/marker"])).ok
            assert ImageStore.default().list()  # the image went to the session's store
    """))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q",
                                           "-o", "asyncio_mode=auto")
    result.assert_outcomes(passed=1)
    assert not users_store.exists()
