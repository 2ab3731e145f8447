"""The ``ROLLBOX_*`` environment variables, read through one set of checked readers.

A variable is configuration a person typed, often long ago and far from the command
that reads it, so a malformed one is refused with its name, its value, what is wrong and
what to set instead (``InvalidSettingError``), never a traceback or a silent default. An
empty value counts as unset. Plugins read their own variables with these readers too.

    ROLLBOX_BACKEND             backend of ``open_backend()`` and the CLI (default ``local``)
    ROLLBOX_HOME                state directory (``rollbox.paths.default_home``)
    ROLLBOX_BWRAP               bubblewrap binary of the local backend
    ROLLBOX_SANDBOX_UID         host uid sandboxes run as when rollbox runs as root
    ROLLBOX_IMAGE_CAPACITY_GB   the local image store's capacity
    ROLLBOX_SCRATCH             where the local backend's writable layers live
    ROLLBOX_CGROUPS             whether the local backend limits sandboxes with cgroups
    ROLLBOX_K8S_NAMESPACE       the kubernetes backend's namespace
    ROLLBOX_RUN_ID              the kubernetes backend's ownership label
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Collection
from pathlib import Path

from rollbox.errors import InvalidSettingError


def raw(name: str) -> str | None:
    """The variable's value, or None when it is unset or empty."""
    value = os.environ.get(name)
    return value if value else None


def invalid(name: str, value: str, problem: str, advice: str) -> InvalidSettingError:
    """The error for ``name=value``: ``problem`` says what is wrong, ``advice`` what to
    set instead."""
    return InvalidSettingError(
        f"the environment variable {name}={value!r} {problem}; {advice}, or unset it",
        variable=name,
    )


def text(name: str, default: str) -> str:
    return raw(name) or default


def checked(name: str, default: str, problem_of: Callable[[str], str | None]) -> str:
    """A string that ``problem_of`` accepts (it returns None, or what is wrong with it)."""
    value = raw(name)
    if value is None:
        return default
    problem = problem_of(value)
    if problem is not None:
        raise invalid(name, value, problem, "set a valid one")
    return value


def choice(name: str, choices: Collection[str], default: str) -> str:
    value = raw(name)
    if value is None:
        return default
    if value not in choices:
        raise invalid(name, value, "is not a known value",
                      f"set it to one of {', '.join(sorted(choices))}")
    return value


def integer(name: str, default: int, *, low: int, high: int, what: str) -> int:
    """A whole number in ``[low, high]``; ``what`` says what it counts, for the message."""
    value = raw(name)
    if value is None:
        return default
    try:
        number = int(value.strip())
    except ValueError:
        raise invalid(name, value, "is not a whole number",
                      f"set it to {what} from {low} to {high}") from None
    if not low <= number <= high:
        raise invalid(name, value, "is out of range", f"set it to {what} from {low} to {high}")
    return number


def positive(name: str, default: float, *, what: str) -> float:
    """A finite number above zero."""
    value = raw(name)
    if value is None:
        return default
    try:
        number = float(value.strip())
    except ValueError:
        raise invalid(name, value, "is not a number", f"set it to {what}") from None
    if not 0 < number < math.inf:
        raise invalid(name, value, "must be above zero and finite", f"set it to {what}")
    return number


def path(name: str) -> Path | None:
    """A filesystem path, made absolute (a relative one is taken from the current
    directory once, here, so it does not change meaning later)."""
    value = raw(name)
    if value is None:
        return None
    if value != value.strip():  # " " or a stray space from a shell line: a typo, not a name
        raise invalid(name, value, "begins or ends with white space", "set a path without")
    return Path(value).expanduser().absolute()
