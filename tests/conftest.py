"""Shared test configuration for the cross-package tests.

Every test session gets a state directory of its own: ``ROLLBOX_HOME`` points at a fresh
temporary directory from the start of the session to its end, whatever it was before.
A test that opens the local backend or the image store with their defaults then never
touches the user's store (images imported from pytest's temporary directories used to
stay listed in ``rollbox images ls`` after a run). Tests that need a directory of their
own still make one (``state_dir``, ``tmp_path``).

The tests of tests/cluster run last: their control plane (a session fixture) then runs
only while they do, not beside every later test, and on a fresh machine its Go build
(started in the background by .ci/run) has the rest of the suite's time to finish.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# pytester: the conformance suite is itself tested against broken backends
# (tests/conformance/test_suite_can_fail.py).
# k8s_cluster: a real Kubernetes control plane for tests/cluster (built from Go modules).
pytest_plugins = ["pytester", "rollbox_kubernetes.testing.fixtures"]

_SESSION_HOME_KEY = pytest.StashKey[str]()


def pytest_configure(config: pytest.Config) -> None:
    home = tempfile.mkdtemp(prefix="rollbox-test-home-")
    os.chmod(home, 0o711)  # run as root, sandboxes run as another user who must reach it
    config.stash[_SESSION_HOME_KEY] = home
    os.environ["ROLLBOX_HOME"] = home


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    cluster = config.rootpath / "tests" / "cluster"
    items.sort(key=lambda item: item.path.is_relative_to(cluster))  # stable: order kept


def pytest_unconfigure(config: pytest.Config) -> None:
    home = config.stash.get(_SESSION_HOME_KEY, None)
    if home is not None:
        shutil.rmtree(home, ignore_errors=True)


def _directory(prefix: str, mode: int) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix=prefix))
    path.chmod(mode)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def searchable_dir() -> Iterator[Path]:
    """Like ``tmp_path``, but world-searchable: pytest's own base directory is private
    (0700) when running as root, and the sandbox user must reach a backend's state."""
    yield from _directory("rollbox-test-", 0o711)


@pytest.fixture
def private_dir() -> Iterator[Path]:
    """A directory only its owner (root) may enter, as /root is."""
    yield from _directory("rollbox-private-", 0o700)
