"""``rollbox doctor`` agrees with ``rollbox run``: it passes exactly the setups run works
in, and a failed check names the setting to change."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from cli_support import Rollbox

SETUPS = {
    "as installed": ({}, None),
    "bwrap is not bubblewrap": ({"ROLLBOX_BWRAP": "/bin/true"}, "ROLLBOX_BWRAP"),
    "bwrap does not exist": ({"ROLLBOX_BWRAP": "/nonexistent"}, "ROLLBOX_BWRAP"),
    "scratch is not a place": ({"ROLLBOX_SCRATCH": "bogus"}, "ROLLBOX_SCRATCH"),
    "capacity is zero": ({"ROLLBOX_IMAGE_CAPACITY_GB": "0"}, "ROLLBOX_IMAGE_CAPACITY_GB"),
    "home is a file": ({"ROLLBOX_HOME": "/etc/hostname/rollbox"}, "ROLLBOX_HOME"),
}


@pytest.mark.parametrize("setup", list(SETUPS), ids=list(SETUPS))
def test_doctor_passes_exactly_when_run_works(rollbox: Rollbox, setup: str) -> None:
    env, named = SETUPS[setup]
    _agree(rollbox, env, named)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root's sandboxes run as another user")
def test_a_home_the_sandbox_user_cannot_reach_fails_doctor(rollbox: Rollbox,
                                                          private_dir: Path) -> None:
    _agree(rollbox, {"ROLLBOX_HOME": str(private_dir / "home")}, "ROLLBOX_HOME")


@pytest.mark.skipif(os.geteuid() != 0, reason="only root reads ROLLBOX_SANDBOX_UID")
def test_a_root_sandbox_uid_fails_doctor(rollbox: Rollbox) -> None:
    _agree(rollbox, {"ROLLBOX_SANDBOX_UID": "0"}, "ROLLBOX_SANDBOX_UID")


def _agree(rollbox: Rollbox, env: dict[str, str], named: str | None) -> None:
    doctor = rollbox("doctor", env=env, timeout=120)
    run = rollbox("run", "--timeout", "20", "--", "true", env=env, timeout=120)
    assert "Traceback" not in doctor.stderr + run.stderr, doctor.stderr + run.stderr
    if named is None:
        assert (doctor.returncode, run.returncode) == (0, 0), doctor.stdout + run.stderr
        assert "FAIL" not in doctor.stdout and "can run here" in doctor.stdout
        return
    assert run.returncode == 2 and named in run.stderr, run.stderr
    assert doctor.returncode == 1, doctor.stdout
    failed = [line for line in doctor.stdout.splitlines() if line.startswith("[FAIL]")]
    assert failed and named in failed[0], doctor.stdout
    assert "cannot run here" in doctor.stdout
    if "fix the failed checks above" in doctor.stdout:  # only ever after a failed check
        first_fix = doctor.stdout.index("fix the failed checks above")
        assert doctor.stdout.index("[FAIL]") < first_fix
