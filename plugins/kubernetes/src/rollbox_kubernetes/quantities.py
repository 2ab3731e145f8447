"""Kubernetes resource quantities (``512Mi``, ``20G``, ``500m``, ``1e9``) as numbers."""

from __future__ import annotations

import re

_QUANTITY = re.compile(r"^([0-9.]+(?:[eE][0-9]+)?)([KMGTPE]i?|[kmu]?)$")
_FACTORS = {"": 1, "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
            "P": 10**15, "E": 10**18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
            "Pi": 2**50, "Ei": 2**60, "m": 10**-3, "u": 10**-6}
MIB = 2**20


def quantity(text: str) -> float:
    """``text`` in base units (bytes, cores); ValueError if it is no quantity."""
    match = _QUANTITY.match(text.strip())
    if match is None:
        raise ValueError(f"not a Kubernetes quantity: {text!r}")
    return float(match.group(1)) * _FACTORS[match.group(2)]
