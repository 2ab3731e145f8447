"""The conformance suite can fail: every base class, run with ``pytester`` against a
backend that breaks what the class checks, reports failures; run against the intact
fake it reports none (so the failures come from the breakage, not from the setup)."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

HERE = Path(__file__).parent

TEMPLATE = """
from broken_backends import {backend}
from rollbox.testing import FakeBackend
from rollbox_conformance import {suite}


class TestUnderTest({suite}):
    backend_factory = {backend}
    timeout_slack_s = 2.0
    scratch_dir = {scratch!r}  # the host-shell backend writes here, on the host

    async def kill_sandbox(self, backend, sandbox):
        backend.kill(sandbox.id)

    async def inject_create_failure(self, backend):
        backend.fail_creates = 1
"""


@dataclass(frozen=True)
class Breakage:
    suite: str
    backend: str
    must_fail: tuple[str, ...]
    """Tests that must fail; the run is narrowed to them (``-k``) to stay fast."""

    @property
    def id(self) -> str:
        return f"{self.suite}-{self.backend}"


BREAKAGES = (
    Breakage("LifecycleTests", "LeaksOnClose",
             ("test_nothing_leaks_after_close", "test_nothing_leaks_after_pool_shutdown",
              "test_backend_aclose_closes_what_is_still_open")),
    Breakage("LifecycleTests", "HostShellBackend", ("test_no_process_outlives_close",)),
    Breakage("ExecTests", "IgnoresTimeouts",
             ("test_timeout_raises_in_time", "test_sandbox_usable_after_a_timeout")),
    Breakage("ExecTests", "WrongExitCodes", ("test_exit_codes_of_true_and_false",)),
    Breakage("ExecTests", "TruncatesSilently", ("test_output_over_the_cap_is_cut_and_flagged",)),
    Breakage("ExecTests", "HostShellBackend", ("test_timeout_kills_the_whole_tree",)),
    Breakage("FileTests", "FilesEscape",
             ("test_dot_dot_does_not_climb_out",
              "test_host_files_are_not_readable_through_the_api")),
    Breakage("ResetSnapshotTests", "ResetKeepsFiles",
             ("test_reset_drops_files_written_through_the_api",)),
    Breakage("ResetSnapshotTests", "SharedSnapshots",
             ("test_fork_and_original_are_independent",)),
    Breakage("IsolationTests", "LeaksHostEnv", ("test_host_env_is_not_inherited",)),
    Breakage("IsolationTests", "SharedFiles", ("test_sandboxes_do_not_share_files",)),
    Breakage("IsolationTests", "HostShellBackend",
             ("test_host_secret_files_are_unreadable", "test_host_processes_are_invisible",
              "test_host_process_cannot_be_signalled",
              "test_sandboxes_do_not_see_each_others_processes")),
    Breakage("LimitsTests", "HostShellBackend",
             ("test_disk_fill_is_contained_by_the_file_size_limit",
              "test_fork_bomb_is_contained_by_the_pids_limit")),
    Breakage("ConcurrencyTests", "CrossTalk",
             ("test_concurrent_stdin_is_not_mixed_up",)),
    Breakage("ConcurrencyTests", "SerialExec", ("test_slow_command_does_not_block_a_fast_one",)),
    Breakage("FailureTests", "LosesSilently",
             ("test_sandbox_killed_mid_command_is_lost", "test_killed_sandbox_refuses_further_work",
              "test_pool_recovers_from_a_lost_sandbox")),
    Breakage("PortTests", "HostPorts",
             ("test_a_sandbox_without_network_is_reachable_only_through_its_endpoint",)),
    Breakage("FailureTests", "WrongImageError",
             ("test_missing_image_raises_image_not_found",
              "test_pool_recovers_from_a_missing_image")),
)


def run_suite(pytester: pytest.Pytester, suite: str, backend: str,
              tests: tuple[str, ...]) -> pytest.HookRecorder:
    pytester.syspathinsert(HERE)
    # pytest-asyncio in strict mode (its default): the suite must not rely on auto mode
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    pytester.makepyfile(test_under_test=textwrap.dedent(
        TEMPLATE.format(suite=suite, backend=backend, scratch=str(pytester.path))))
    # Only outcomes are read: --tb=no skips formatting the expected failures' sources,
    # where CPython 3.11.7's ast.parse at times raises "AST constructor recursion depth
    # mismatch" inside the in-process run (an INTERNALERROR that loses the outcomes).
    return pytester.inline_run("-p", "no:cacheprovider", "-q", "--tb=no",
                               "-k", " or ".join(tests))


def outcomes(recorder: pytest.HookRecorder) -> dict[str, set[str]]:
    """Test names (parameters dropped) by outcome; setup and teardown errors as failed."""
    found: dict[str, set[str]] = {"passed": set(), "skipped": set(), "failed": set()}
    for report in recorder.getreports("pytest_runtest_logreport"):
        if report.when == "call" or report.outcome != "passed":
            found[report.outcome].add(report.nodeid.rsplit("::", 1)[-1].split("[")[0])
    return found


@pytest.mark.parametrize("breakage", BREAKAGES, ids=[b.id for b in BREAKAGES])
def test_suite_fails_on_a_broken_backend(pytester: pytest.Pytester, breakage: Breakage) -> None:
    found = outcomes(run_suite(pytester, breakage.suite, breakage.backend, breakage.must_fail))
    assert found["failed"] == set(breakage.must_fail), found


SUITES = sorted({b.suite for b in BREAKAGES})


@pytest.mark.parametrize("suite", SUITES)
def test_the_same_tests_pass_on_an_intact_fake(pytester: pytest.Pytester, suite: str) -> None:
    """Control: the tests that must fail above pass (or skip by capability) on the fake.

    The fake has no shell, so the tests the host-shell backend fails skip here; the
    local backend's run (tests/local/test_local_conformance.py) is their control.
    """
    tests = tuple(t for b in BREAKAGES if b.suite == suite for t in b.must_fail)
    found = outcomes(run_suite(pytester, suite, "IsolatedFake", tests))
    assert found["failed"] == set(), found
    if suite not in ("LimitsTests", "PortTests"):  # each of their tests needs a shell
        assert found["passed"], found


def test_every_base_class_is_shown_to_fail() -> None:
    import rollbox_conformance

    classes = {name for name in rollbox_conformance.__all__
               if name.endswith("Tests") and name != "BackendTests"}
    assert classes == set(SUITES)
