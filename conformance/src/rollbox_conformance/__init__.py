"""rollbox's backend conformance suite: typed base test classes, one per concern.

A backend package runs every test in one class::

    from rollbox_conformance import BackendTests

    class TestMine(BackendTests):
        backend_factory = MyBackend          # or override the ``backend`` fixture
        spec = SandboxSpec(image="host")     # the spec the suite's sandboxes use

Each concern is also usable alone (``ExecTests``, ``IsolationTests``, ...). Tests skip
by the backend's declared ``Capabilities``, never by its name; hooks on the class
(``missing_image_ref``, ``kill_sandbox``, ``leak_check``, ``host_secret_paths``) carry
the little backend-specific knowledge the suite needs.
"""

from rollbox_conformance.base import BackendTestBase
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
from rollbox_conformance.suite import BackendTests

__all__ = [
    "BackendTestBase",
    "BackendTests",
    "ConcurrencyTests",
    "ExecTests",
    "FailureTests",
    "FileTests",
    "IntegrityTests",
    "IsolationTests",
    "LifecycleTests",
    "LimitsTests",
    "PortTests",
    "ResetSnapshotTests",
]
