"""The image store's disk budget, and which images make room when it is spent.

The bytes of stored images plus those reserved by hydrations in flight never exceed
``capacity_bytes``. Room is made by evicting the least recently used unpinned image; a
pinned one never is, and images hinted as wanted soon go only as a last resort. This
module decides and accounts; the store moves the chosen images out.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Protocol

from rollbox import settings
from rollbox.errors import ImageStoreFullError, UsageError

from rollbox_local.image_plans import Plan

GiB = 1024**3
DEFAULT_CAPACITY_GB = 20.0
RAISE_CAPACITY = ("raise the image store's capacity ($ROLLBOX_IMAGE_CAPACITY_GB, or the "
                  "backend's image_capacity_bytes)")


class Stored(Protocol):
    """What the budget needs to know of a stored image."""

    digest: str
    size_bytes: int
    last_used: float


def capacity_from_env() -> int:
    """``$ROLLBOX_IMAGE_CAPACITY_GB`` (default 20) in bytes; InvalidSettingError (a
    UsageError) naming the variable if malformed."""
    gb = settings.positive("ROLLBOX_IMAGE_CAPACITY_GB", DEFAULT_CAPACITY_GB,
                           what="the image store's capacity in GiB, e.g. 20")
    return max(1, int(gb * GiB))


def mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


class Capacity:
    """``capacity_bytes`` over the store's images (``stored``, by digest) and their pins,
    both the store's own, read live; ``reserved`` holds the bytes of hydrations in flight,
    by plan key."""

    def __init__(self, capacity_bytes: int, stored: Mapping[str, Stored],
                 pins: Mapping[str, int]) -> None:
        if capacity_bytes <= 0:
            raise UsageError(f"image store capacity must be positive, not {capacity_bytes}")
        self.capacity_bytes = capacity_bytes
        self.reserved: dict[str, int] = {}
        self._stored = stored
        self._pins = pins

    def used(self, excluding: str) -> int:
        reserved = sum(n for k, n in self.reserved.items() if k != excluding)
        return sum(e.size_bytes for e in self._stored.values()) + reserved

    def reserve(self, plan: Plan, *, spare: Collection[str] | None, hinted: Sequence[str],
                need: int | None = None,
                evictable: Callable[[str], bool] = lambda digest: True) -> list[str]:
        """Reserve ``need`` bytes (default: the plan's estimate) for ``plan``; returns the
        digests to evict first, least recently used first.

        ``spare``: images to keep; None keeps the ``hinted`` ones unless nothing else
        makes room (then the latest hinted go first). Raises UsageError when the image is
        larger than the store, ImageStoreFullError when pins leave no room.
        ``evictable(digest)`` may pass an unpinned image over (another process pins it)."""
        need = plan.probe.estimate_bytes if need is None and plan.probe else (need or 0)
        if need > self.capacity_bytes:
            raise UsageError(
                f"image {plan.ref!r} needs {mb(need)}, more than the image store's whole "
                f"capacity of {mb(self.capacity_bytes)}; {RAISE_CAPACITY}"
            )
        used = self.used(excluding=plan.key)
        victims: list[str] = []
        if used + need > self.capacity_bytes:
            keep = set(hinted) if spare is None else set(spare)
            unpinned = [e for e in self._stored.values() if not self._pins.get(e.digest)]
            order = sorted((e for e in unpinned if e.digest not in keep),
                           key=lambda e: e.last_used)
            if spare is None:  # last resort: hinted ones, wanted latest first
                rank = {d: i for i, d in enumerate(hinted)}
                order += sorted((e for e in unpinned if e.digest in keep),
                                key=lambda e: -rank.get(e.digest, 0))
            if used - sum(e.size_bytes for e in order) + need > self.capacity_bytes:
                raise self._full_error(plan, need)
            for entry in order:
                if used + need <= self.capacity_bytes:
                    break
                if evictable(entry.digest):
                    used -= entry.size_bytes
                    victims.append(entry.digest)
            if used + need > self.capacity_bytes:
                raise self._full_error(plan, need)
        self.reserved[plan.key] = need
        return victims

    def release(self, key: str) -> None:
        """The hydration ``key`` ended: its reservation is no longer held."""
        self.reserved.pop(key, None)

    def _full_error(self, plan: Plan, need: int) -> ImageStoreFullError:
        pinned = [e for e in self._stored.values() if self._pins.get(e.digest)]
        in_flight = sum(n for k, n in self.reserved.items() if k != plan.key)
        return ImageStoreFullError(
            f"image store full: {plan.ref!r} needs {mb(need)} but of the "
            f"{mb(self.capacity_bytes)} capacity {mb(sum(e.size_bytes for e in pinned))} "
            f"is pinned by {len(pinned)} image(s) in use and {mb(in_flight)} is reserved by "
            "hydrations in flight; retry when sandboxes finish, run fewer distinct images "
            f"at once, or {RAISE_CAPACITY}"
        )
