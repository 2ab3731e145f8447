"""A sandbox leased from a pool keeps its image's environment (``base_env``)."""

from __future__ import annotations

from pathlib import Path

from rollbox import Pool, SandboxSpec
from rollbox_local import LocalBackend
from rollbox_local.oci_build import write_oci_layout


async def test_a_leased_sandbox_sees_the_images_env(backend: LocalBackend,
                                                    tmp_path: Path) -> None:
    image = write_oci_layout(tmp_path / "img", {"x": b""}, base_host=True,
                             env={"FROM_IMAGE": "image", "BOTH": "image"})
    spec = SandboxSpec(image=str(image), env={"BOTH": "spec"})
    async with Pool(backend) as pool, pool.lease(spec) as sandbox:
        result = await sandbox.exec('echo "$FROM_IMAGE $BOTH"', timeout=30)
    assert result.text.split() == ["image", "spec"]
