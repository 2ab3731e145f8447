"""How often a booting sandbox is checked for readiness (``instance._next_poll``)."""

from __future__ import annotations

import pytest
from rollbox_local.instance import READY_POLL_S, _next_poll

MS = 1e-3


def checks_until_seen(boot_s: float, *, background: bool) -> tuple[int, float]:
    """Checks made, and how late the last one comes, for a boot that takes ``boot_s``."""
    elapsed, checks = 0.0, 1
    while elapsed < boot_s:
        elapsed += _next_poll(elapsed, background=background)
        checks += 1
    return checks, elapsed - boot_s


@pytest.mark.parametrize("boot_ms", [0.3, 3.0, 4.6, 8.5, 13.0, 40.0])
def test_a_background_boot_is_seen_at_most_a_quarter_of_its_length_late(
    boot_ms: float,
) -> None:
    _, late = checks_until_seen(boot_ms * MS, background=True)
    assert late <= max(boot_ms * MS / 4, READY_POLL_S) + 1e-9


def test_a_background_boot_that_takes_long_is_checked_rarely() -> None:
    checks, late = checks_until_seen(2.0, background=True)  # a boot under heavy load
    assert checks < 270  # about every 8 ms once it is old: not every millisecond
    assert late <= 8 * MS


@pytest.mark.parametrize("boot_ms", [0.2, 2.0, 9.0])
def test_a_boot_somebody_waits_for_is_seen_within_a_millisecond(boot_ms: float) -> None:
    _, late = checks_until_seen(boot_ms * MS, background=False)
    assert late <= 2 * READY_POLL_S + 1e-9
