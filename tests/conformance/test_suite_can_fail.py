"""The conformance suite can fail: every base class, run with ``pytester`` against a
backend that breaks what the class checks, reports failures; run against the intact
fake it reports none (so the failures come from the breakage, not from the setup)."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from rollbox_conformance.limits import CPU_BURN

HERE = Path(__file__).parent

TEMPLATE = """
import pathlib

import broken_host_shells
from broken_backends import {backend}
from rollbox.testing import FakeBackend
from rollbox_conformance import {suite}

broken_host_shells.SCRATCH = pathlib.Path({scratch!r})


class TestUnderTest({suite}):
    backend_factory = {backend}
    timeout_slack_s = 2.0
    scratch_dir = {scratch!r}  # the host-shell backends write here, on the host

    async def kill_sandbox(self, backend, sandbox):
        backend.kill(sandbox.id)

    async def inject_create_failure(self, backend):
        backend.fail_creates = 1

    def owner_script(self, state):
        return {owner!r}
"""

OWNER = """\
import sys
sys.path.insert(0, {here!r})
from broken_backends import {backend} as make_backend
"""


def host_cannot_make_vsock() -> str | None:
    """Why the host-shell backend (commands on this host) cannot show a vsock attack."""
    try:
        socket.socket(40, socket.SOCK_STREAM).close()  # AF_VSOCK
    except OSError as exc:
        return f"this host cannot make AF_VSOCK sockets either ({exc.strerror})"
    return None


def host_cannot_show_a_forger() -> str | None:
    """Why a process on this host cannot ptrace another of the same user here (the
    forger of IntegrityTests then has nothing to show)."""
    if platform.machine() != "x86_64":
        return "the forger speaks x86_64's registers"
    try:
        scope = Path("/proc/sys/kernel/yama/ptrace_scope").read_text().strip()
    except OSError:
        return None
    if scope != "0" and os.geteuid() != 0:
        return f"Yama's ptrace_scope is {scope} on this host"
    return None


def machine_too_busy() -> str | None:
    """Why an ignored CPU quota cannot show here now: the suite's busy loop, run as the
    host-shell backend runs it, gets too little CPU anyway."""
    code = f"import os\nos.nice(-15) if os.geteuid() == 0 else None\n{CPU_BURN}"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    share = float(done.stdout.split()[-1])
    if share <= 0.4:
        return f"this machine gives two busy processes only {share:.2f} CPUs now"
    return None


@dataclass(frozen=True)
class Breakage:
    suite: str
    backend: str
    must_fail: tuple[str, ...]
    """Tests that must fail; the run is narrowed to them (``-k``) to stay fast."""
    only: str = ""
    """A further ``-k`` keyword, for one parameter of a parametrized test."""
    unless: Callable[[], str | None] | None = None
    """Why this machine cannot show the breakage (the test then skips), if it cannot."""

    @property
    def id(self) -> str:
        return "-".join(filter(None, (self.suite, self.backend, self.only)))


BREAKAGES = (
    Breakage("LifecycleTests", "LeaksOnClose",
             ("test_nothing_leaks_after_close", "test_nothing_leaks_after_pool_shutdown",
              "test_backend_aclose_closes_what_is_still_open")),
    Breakage("LifecycleTests", "HostShellBackend",
             ("test_no_process_outlives_close", "test_nothing_outlives_a_killed_owner")),
    Breakage("ExecTests", "IgnoresTimeouts",
             ("test_timeout_raises_in_time", "test_sandbox_usable_after_a_timeout")),
    Breakage("ExecTests", "WrongExitCodes", ("test_exit_codes_of_true_and_false",)),
    Breakage("ExecTests", "TruncatesSilently", ("test_output_over_the_cap_is_cut_and_flagged",)),
    Breakage("ExecTests", "HostShellBackend", ("test_timeout_kills_the_whole_tree",)),
    Breakage("ExecTests", "TimeoutKillsEverything",
             ("test_a_timeout_kills_exactly_the_timed_out_commands_tree",)),
    Breakage("FileTests", "FilesEscape",
             ("test_dot_dot_does_not_climb_out",
              "test_host_files_are_not_readable_through_the_api")),
    Breakage("FileTests", "ReadsDevices", ("test_devices_are_refused",)),
    Breakage("FileTests", "HostPathsBackend",
             ("test_fifos_fail_promptly_and_stall_no_other_sandbox",)),
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
    Breakage("IsolationTests", "HostShellBackend", ("test_attack_is_blocked",), only="vsock",
             unless=host_cannot_make_vsock),
    Breakage("IsolationTests", "LeaksAnFd",
             ("test_commands_start_with_only_stdin_stdout_and_stderr",)),
    Breakage("IsolationTests", "HostPathsBackend",
             ("test_file_api_under_a_symlink_swap_loop",
              "test_snapshots_under_a_symlink_swap_loop")),
    Breakage("LimitsTests", "HostShellBackend",
             ("test_disk_fill_is_contained_by_the_file_size_limit",
              "test_fork_bomb_is_contained_by_the_pids_limit")),
    Breakage("LimitsTests", "ClaimsEveryLimit",
             ("test_memory_of_all_processes_together_is_limited",
              "test_memory_in_dev_shm_is_counted", "test_memory_in_a_memfd_is_counted",
              "test_disk_writes_past_disk_mb_fail", "test_inodes_past_the_limit_fail")),
    Breakage("LimitsTests", "ClaimsEveryLimit", ("test_cpu_quota_holds_a_busy_loop_to_its_share",),
             only="cpu_quota", unless=machine_too_busy),
    Breakage("LimitsTests", "AcceptsEveryLimit",
             ("test_a_limit_the_backend_cannot_enforce_is_refused",)),
    Breakage("ConcurrencyTests", "CrossTalk",
             ("test_concurrent_stdin_is_not_mixed_up",)),
    Breakage("ConcurrencyTests", "SerialExec", ("test_slow_command_does_not_block_a_fast_one",)),
    Breakage("ConcurrencyTests", "LosesSandboxesUnderTimeouts",
             ("test_a_storm_of_concurrent_timeouts_loses_no_sandbox",)),
    Breakage("FailureTests", "LosesSilently",
             ("test_sandbox_killed_mid_command_is_lost", "test_killed_sandbox_refuses_further_work",
              "test_pool_recovers_from_a_lost_sandbox")),
    Breakage("FailureTests", "DiesOfBadCommands",
             ("test_a_callers_mistake_is_a_usage_error_and_keeps_the_sandbox",)),
    Breakage("PortTests", "HostPorts",
             ("test_a_sandbox_without_network_is_reachable_only_through_its_endpoint",)),
    Breakage("IntegrityTests", "ClaimsSealAndIsolation",
             ("test_seal_ends_every_process_and_keeps_the_files",
              "test_a_process_left_running_cannot_forge_a_later_command"),
             unless=host_cannot_show_a_forger),
    Breakage("IntegrityTests", "ClaimsEveryLimit",
             ("test_a_full_disk_is_enospc_and_the_sandbox_goes_on",)),
    Breakage("FailureTests", "WrongImageError",
             ("test_missing_image_raises_image_not_found",
              "test_pool_recovers_from_a_missing_image")),
)


def run_suite(pytester: pytest.Pytester, suite: str, backend: str,
              tests: tuple[str, ...], only: str = "") -> pytest.HookRecorder:
    pytester.syspathinsert(HERE)
    # pytest-asyncio in strict mode (its default): the suite must not rely on auto mode
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    owner = OWNER.format(here=str(HERE), backend=backend)
    pytester.makepyfile(test_under_test=textwrap.dedent(TEMPLATE.format(
        suite=suite, backend=backend, scratch=str(pytester.path), owner=owner)))
    keywords = " or ".join(tests)
    # Only outcomes are read: --tb=no skips formatting the expected failures' sources,
    # where CPython 3.11.7's ast.parse at times raises "AST constructor recursion depth
    # mismatch" inside the in-process run (an INTERNALERROR that loses the outcomes).
    return pytester.inline_run("-p", "no:cacheprovider", "-q", "--tb=no",
                               "-k", f"({keywords}) and {only}" if only else keywords)


def outcomes(recorder: pytest.HookRecorder) -> dict[str, set[str]]:
    """Test names (parameters dropped) by outcome; setup and teardown errors as failed."""
    found: dict[str, set[str]] = {"passed": set(), "skipped": set(), "failed": set()}
    for report in recorder.getreports("pytest_runtest_logreport"):
        if report.when == "call" or report.outcome != "passed":
            found[report.outcome].add(report.nodeid.rsplit("::", 1)[-1].split("[")[0])
    return found


@pytest.mark.parametrize("breakage", BREAKAGES, ids=[b.id for b in BREAKAGES])
def test_suite_fails_on_a_broken_backend(pytester: pytest.Pytester, breakage: Breakage) -> None:
    why_not = breakage.unless() if breakage.unless is not None else None
    if why_not is not None:
        pytest.skip(why_not)
    found = outcomes(run_suite(pytester, breakage.suite, breakage.backend, breakage.must_fail,
                               breakage.only))
    assert found["failed"] == set(breakage.must_fail), found


SUITES = sorted({b.suite for b in BREAKAGES})


@pytest.mark.parametrize("suite", SUITES)
def test_the_same_tests_pass_on_an_intact_fake(pytester: pytest.Pytester, suite: str) -> None:
    """Control: the tests that must fail above pass (or skip by capability) on the fake.

    The fake has no shell, so the tests the host-shell backends fail skip here; the
    local backend's run (tests/local/test_local_conformance.py) is their control (every
    port and integrity test needs a shell).
    """
    tests = tuple(t for b in BREAKAGES if b.suite == suite for t in b.must_fail)
    found = outcomes(run_suite(pytester, suite, "IsolatedFake", tests))
    assert found["failed"] == set(), found
    if suite not in ("PortTests", "IntegrityTests"):
        assert found["passed"], found


def test_every_base_class_is_shown_to_fail() -> None:
    import rollbox_conformance

    classes = {name for name in rollbox_conformance.__all__
               if name.endswith("Tests") and name != "BackendTests"}
    assert classes == set(SUITES)
