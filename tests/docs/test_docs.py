"""Every code block of the documentation that can run here runs, and passes (the
convention is in ``doc_blocks.py`` and CONTRIBUTING.md)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from doc_blocks import (
    REPO,
    Block,
    DocumentError,
    blocks,
    console_script,
    documents,
    missing_from,
)

BLOCK_TIMEOUT_S = 900
LINKED = ("examples", "benchmarks")
"""Checkout directories a block may name by a relative path, as from the checkout root."""


def _param(document: Path) -> object:
    try:
        slow = any(block.slow and block.runs for block in blocks(document))
    except DocumentError:
        slow = False  # test_blocks_follow_the_convention reports it
    name = str(document.relative_to(REPO))
    return pytest.param(document, id=name, marks=[pytest.mark.slow] if slow else [])


DOCUMENTS = [_param(document) for document in documents()]


@pytest.mark.parametrize("document", [d for d in documents()],
                         ids=[str(d.relative_to(REPO)) for d in documents()])
def test_blocks_follow_the_convention(document: Path) -> None:
    """Every fence names a language; every directive is known; a skip says why."""
    blocks(document)


@pytest.mark.parametrize("document", [d for d in documents()],
                         ids=[str(d.relative_to(REPO)) for d in documents()])
def test_excerpts_quote_their_file(document: Path) -> None:
    """A block marked as an excerpt of a checkout file says only what that file says."""
    for block in blocks(document):
        if block.excerpt is not None:
            missing = missing_from(block.code, (REPO / block.excerpt).read_text())
            assert missing is None, f"{block.where}: not in {block.excerpt}: {missing!r}"


def test_the_convention_finds_the_documents() -> None:
    names = {str(d.relative_to(REPO)) for d in documents()}
    assert {"README.md", "CONTRIBUTING.md", "docs/local-backend.md"} <= names


@pytest.fixture
def scratch() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="rollbox-doc-"))
    path.chmod(0o755)  # images written here are read by the sandbox user when root
    for name in LINKED:
        (path / name).symlink_to(REPO / name)
    home = path / ".rollbox-home"
    home.mkdir(mode=0o711)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("document", DOCUMENTS)
def test_document_blocks_run(document: Path, scratch: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLBOX_")}
    venv_bin = str(Path(sys.executable).parent)
    env.update(ROLLBOX_HOME=str(scratch / ".rollbox-home"), VIRTUAL_ENV=str(Path(venv_bin).parent),
               PATH=os.pathsep.join([venv_bin, env.get("PATH", "")]))
    ran = 0
    for block in blocks(document):
        if block.file is not None:
            target = scratch / block.file
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.code)
        elif block.runs:
            _run(block, scratch, env)
            ran += 1
    if ran == 0:
        pytest.skip("no block of this document runs here")


def _run(block: Block, scratch: Path, env: dict[str, str]) -> None:
    if block.language == "python":
        script = scratch / f"block_{block.line}.py"
        script.write_text(block.code)
        command = [sys.executable, str(script)]
    else:
        code = console_script(block.code) if block.language == "console" else block.code
        command = ["bash", "-c", "set -euo pipefail\n" + code]
    # Output goes to files, not pipes: a block's background job (`rollbox serve &`) must not
    # hold the test until it ends; whatever of the block's session is left is killed after.
    out, err = scratch / f"block_{block.line}.out", scratch / f"block_{block.line}.err"
    with out.open("w") as stdout, err.open("w") as stderr:
        process = subprocess.Popen(command, cwd=scratch, env=env, stdout=stdout, stderr=stderr,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            code = process.wait(timeout=BLOCK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            _wait_session_gone(process.pid)
    if code is None:
        pytest.fail(f"{block.where}: still running after {BLOCK_TIMEOUT_S}s", pytrace=False)
    result = subprocess.CompletedProcess(command, code, out.read_text(errors="replace"),
                                         err.read_text(errors="replace"))
    if result.returncode != 0:
        pytest.fail(f"{block.where}: the {block.language} block exited {result.returncode}\n"
                    f"--- block\n{block.code}--- stdout\n{result.stdout[-4000:]}\n"
                    f"--- stderr\n{result.stderr[-4000:]}", pytrace=False)


def _wait_session_gone(session: int, patience_s: float = 10.0) -> None:
    """Until no live process of ``session`` remains (the next block may start a server
    on the same state directory)."""
    deadline = time.monotonic() + patience_s
    while time.monotonic() < deadline:
        alive = False
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = stat.read_text().rsplit(")", 1)[1].split()
                alive |= fields[0] != "Z" and int(fields[3]) == session
        if not alive:
            return
        time.sleep(0.05)
