"""The emulator's object store: resourceVersions, a bounded event history for watches,
merge patches and owner-reference garbage collection."""

from __future__ import annotations

import asyncio
import copy
import itertools
import time
import uuid
from collections.abc import Callable
from typing import Any

Obj = dict[str, Any]
Key = tuple[str, str, str]  # plural, namespace, name
Listener = Callable[[str, str, Obj], None]


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


class Conflict(Exception):
    pass


class Store:
    def __init__(self, history: int = 100_000) -> None:
        self.objects: dict[Key, Obj] = {}
        self.history = history
        self.events: list[tuple[int, str, str, str, Obj]] = []
        self._rv = itertools.count(1)
        self.last_rv = 0
        self._changed: dict[str, asyncio.Event] = {}
        self.listeners: list[Listener] = []

    def oldest_rv(self) -> int:
        return self.events[0][0] if self.events else self.last_rv + 1

    def changed(self, plural: str) -> asyncio.Event:
        """An event set at the next change of ``plural`` objects."""
        return self._changed.setdefault(plural, asyncio.Event())

    def since(self, rv: int) -> list[tuple[int, str, str, str, Obj]]:
        """Events after resourceVersion ``rv`` (rvs are consecutive integers)."""
        if not self.events:
            return []
        start = max(0, rv - self.events[0][0] + 1)
        return self.events[start:]

    def compact(self, keep: int = 0) -> None:
        """Forget history (so older resourceVersions get 410 Gone)."""
        self.events = self.events[len(self.events) - keep:] if keep else []

    def _record(self, kind: str, plural: str, obj: Obj) -> None:
        rv = next(self._rv)
        self.last_rv = rv
        obj["metadata"]["resourceVersion"] = str(rv)
        ns = obj["metadata"].get("namespace", "")
        self.events.append((rv, kind, plural, ns, copy.deepcopy(obj)))
        if len(self.events) > self.history:
            del self.events[: len(self.events) // 2]
        event = self._changed.pop(plural, None)
        if event is not None:
            event.set()
        for listener in list(self.listeners):
            listener(kind, plural, obj)

    def get(self, plural: str, ns: str, name: str) -> Obj | None:
        return self.objects.get((plural, ns, name))

    def list(self, plural: str, ns: str) -> list[Obj]:
        return [o for (p, n, _), o in self.objects.items() if p == plural and n == ns]

    def create(self, plural: str, ns: str, obj: Obj) -> Obj:
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        key = (plural, ns, meta["name"])
        if key in self.objects:
            raise Conflict(meta["name"])
        meta["namespace"] = ns
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        meta["generation"] = 1
        self.objects[key] = obj
        self._record("ADDED", plural, obj)
        return obj

    def patch(self, plural: str, ns: str, name: str, patch: Obj) -> Obj | None:
        key = (plural, ns, name)
        if key not in self.objects:
            return None
        obj = merge_patch(self.objects[key], patch)
        self.objects[key] = obj
        self._record("MODIFIED", plural, obj)
        return self.objects[key]

    def delete(self, plural: str, ns: str, name: str) -> Obj | None:
        obj = self.objects.pop((plural, ns, name), None)
        if obj is None:
            return None
        self._record("DELETED", plural, obj)
        uid = obj["metadata"]["uid"]
        for (p, n, dep_name), dep in list(self.objects.items()):
            refs = dep["metadata"].get("ownerReferences") or []
            if n == ns and any(r.get("uid") == uid for r in refs):
                self.delete(p, n, dep_name)
        return obj
