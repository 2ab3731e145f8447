"""Shared test configuration for the cross-package tests.

Every test session gets a state directory of its own: ``ROLLBOX_HOME`` points at a fresh
temporary directory from the start of the session to its end, whatever it was before.
A test that opens the local backend or the image store with their defaults then never
touches the user's store (images imported from pytest's temporary directories used to
stay listed in ``rollbox images ls`` after a run). Tests that need a directory of their
own still make one (``state_dir``, ``tmp_path``). Under pytest-xdist each worker is a
session of its own, with a home of its own.

Two suites in one command (CONTRIBUTING.md):

* ``uv run pytest`` is the fast loop: tests marked ``slow`` (end-to-end runs, benchmarks,
  the real control plane of tests/cluster, the adapters' own environments) are left out
  unless asked for: by ``--full``, by a ``-m`` expression, or by naming test paths.
* ``pytest --full`` (the README's command, what CI runs) runs everything.

Tests run on four pytest-xdist workers (``-n auto``: ``pytest_xdist_auto_num_workers``)
because much of their time is spent waiting on sandboxes. The tests of tests/cluster share
one control plane (a session fixture on fixed loopback addresses), so they are one xdist
group, run by one worker, and handed out last: the control plane (API server, etcd,
controllers, node agents) then runs only while they do, not beside the other workers' tests,
whose time bounds (a conformance test's "within 120 s") a 2-core machine could not keep
under both loads (a full run with them first failed two such bounds). On a fresh machine
the control plane's Go build (started in the background by .ci/run) has the rest of the
suite's time to finish; the first cluster test waits for it before its clock starts.
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


WORKERS = 4
"""Waiting tests overlap: four workers keep two cores busy."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--full", action="store_true", default=False,
                     help="run every suite, the slow ones included (what CI runs)")


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    return WORKERS


def _runs_slow_tests(config: pytest.Config) -> bool:
    named = config.args_source is not pytest.Config.ArgsSource.TESTPATHS
    return bool(config.getoption("--full") or config.getoption("-m") or named)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not _runs_slow_tests(config):
        slow = [item for item in items if item.get_closest_marker("slow")]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [item for item in items if not item.get_closest_marker("slow")]
    cluster = config.rootpath / "tests" / "cluster"
    for item in items:
        if item.path.is_relative_to(cluster):
            item.add_marker(pytest.mark.xdist_group("cluster"))
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
