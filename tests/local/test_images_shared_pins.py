"""An image a sandbox uses is safe from every process sharing the store: ``rollbox images
rm`` refuses it and eviction passes it over, whichever process holds the sandbox."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from rollbox_local.oci_build import write_oci_layout

HOLDER = textwrap.dedent("""
    import asyncio, sys
    from rollbox import SandboxSpec
    from rollbox_local import LocalBackend

    async def main():
        async with LocalBackend() as backend:
            sandbox = await backend.create(SandboxSpec(image=sys.argv[1]))
            print("ready", flush=True)
            while (line := await asyncio.to_thread(sys.stdin.readline)).strip():
                result = await sandbox.exec(["cat", "/marker"])
                print(result.exit_code, result.stdout.decode().strip(), flush=True)
            await sandbox.close()

    asyncio.run(main())
""")


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLBOX_")}
    return {**env, "ROLLBOX_HOME": str(home), **extra}


def rollbox(*args: str, home: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rollbox", *args], capture_output=True,
                          text=True, timeout=120, env=_env(home, **extra))


class Holder:
    """Another process with a sandbox of ``image`` open, reading /marker on demand."""

    def __init__(self, home: Path, image: str, **extra: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", HOLDER, image], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(home, **extra))
        assert self.process.stdout is not None
        assert self.process.stdout.readline() == "ready\n", self.process.stderr

    def read_marker(self) -> str:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write("cat\n")
        self.process.stdin.flush()
        return self.process.stdout.readline().strip()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.communicate(input="\n", timeout=60)


@pytest.fixture
def image_dir(tmp_path: Path) -> Iterator[Path]:
    tmp_path.chmod(0o755)
    yield tmp_path


def _image(root: Path, name: str, size: int = 0) -> Path:
    files = {"marker": name.encode(), "padding": os.urandom(size)}
    return write_oci_layout(root / name, files, base_host=True)


def test_rm_refuses_an_image_another_process_uses(state_dir: Path, image_dir: Path) -> None:
    assert rollbox("images", "import", str(_image(image_dir, "one")), "--name", "task:1",
                   home=state_dir).returncode == 0
    holder = Holder(state_dir, "task:1")
    try:
        removed = rollbox("images", "rm", "task:1", home=state_dir)
        assert removed.returncode == 2, removed.stdout
        assert "in use by a sandbox in another process" in removed.stderr
        assert holder.read_marker() == "0 one"  # its files are all still there
        assert "task:1" in rollbox("images", "ls", home=state_dir).stdout
    finally:
        holder.close()
    assert holder.process.returncode == 0, holder.process.stderr.read()  # type: ignore[union-attr]
    assert rollbox("images", "rm", "task:1", home=state_dir).returncode == 0


def test_eviction_passes_over_an_image_another_process_uses(state_dir: Path,
                                                            image_dir: Path) -> None:
    capacity = {"ROLLBOX_IMAGE_CAPACITY_GB": str(3 / 1024)}  # 3 MiB: one 2 MiB image fits
    big = _image(image_dir, "big", 2 * 1024 * 1024)
    assert rollbox("images", "import", str(big), "--name", "big", home=state_dir,
                   **capacity).returncode == 0
    holder = Holder(state_dir, "big", **capacity)
    try:
        other = rollbox("images", "import", str(_image(image_dir, "other", 2 * 1024 * 1024)),
                        home=state_dir, **capacity)
        assert other.returncode == 2 and "image store full" in other.stderr, other.stderr
        assert holder.read_marker() == "0 big"
    finally:
        holder.close()
    again = rollbox("images", "import", str(_image(image_dir, "third", 2 * 1024 * 1024)),
                    home=state_dir, **capacity)
    assert again.returncode == 0, again.stderr  # unused now: evicted to make room
