"""``BackendTests``: every concern of the suite in one base class."""

from __future__ import annotations

from rollbox_conformance.concurrency import ConcurrencyTests
from rollbox_conformance.execution import ExecTests
from rollbox_conformance.failure import FailureTests
from rollbox_conformance.files import FileTests
from rollbox_conformance.integrity import IntegrityTests
from rollbox_conformance.isolation import IsolationTests
from rollbox_conformance.lifecycle import LifecycleTests
from rollbox_conformance.limits import LimitsTests
from rollbox_conformance.ports import PortTests
from rollbox_conformance.reset import ResetSnapshotTests


class BackendTests(
    LifecycleTests,
    ExecTests,
    FileTests,
    ResetSnapshotTests,
    IsolationTests,
    LimitsTests,
    ConcurrencyTests,
    FailureTests,
    PortTests,
    IntegrityTests,
):
    """The whole conformance suite. Subclass as ``TestMyBackend`` and set
    ``backend_factory`` (or override the ``backend`` fixture)."""
