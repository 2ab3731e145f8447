"""The sandboxes and snapshots a server holds for its clients, by handle.

A handle (``rbx-`` and 128 random bits) names one sandbox for one holder: a sandbox
the pool takes back and hands out again gets a new handle, so an old handle never
reaches the next client's sandbox. Handles are owned (a label the client chose, for
``rollbox ps``), touched by every request, and reaped after the idle TTL unless busy.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from rollbox.errors import SandboxNotFoundError
from rollbox.pool import Lease
from rollbox.sandbox import Endpoint, Sandbox, Snapshot
from rollbox.spec import SandboxSpec
from rollbox_remote.protocol import spec_to_json


@dataclass(eq=False)
class Held:
    """One sandbox a client holds: from the pool (``lease``) or a fork (closed for good
    when released: a fork is not its spec's image, so no pool may reuse it)."""

    id: str
    owner: str
    spec: SandboxSpec
    sandbox: Sandbox
    lease: Lease | None
    client: str = ""
    """The client (one remote backend) that made it: its ``leftovers`` ask by this."""
    created_at: float = field(default_factory=time.time)
    last_used: float = 0.0
    busy: int = 0
    endpoints: dict[int, Endpoint] = field(default_factory=dict)
    _spec_json: dict[str, object] | None = None

    def info(self, now: float) -> dict[str, object]:
        if self._spec_json is None:
            self._spec_json = spec_to_json(self.spec)
        return {
            "id": self.id, "owner": self.owner, "client": self.client,
            "spec": self._spec_json,
            "base_env": dict(self.sandbox.base_env), "image": self.spec.image,
            "created_at": self.created_at, "idle_s": 0.0 if self.busy else now - self.last_used,
            "busy": self.busy, "origin": "pool" if self.lease is not None else "fork",
        }


class Registry:
    def __init__(self) -> None:
        self.held: dict[str, Held] = {}
        self.snapshots: dict[str, Snapshot] = {}

    @staticmethod
    def now() -> float:
        return asyncio.get_running_loop().time()

    def add(self, owner: str, spec: SandboxSpec, sandbox: Sandbox, lease: Lease | None, *,
            client: str = "") -> Held:
        held = Held(f"rbx-{secrets.token_hex(16)}", owner, spec, sandbox, lease, client,
                    last_used=self.now())
        self.held[held.id] = held
        return held

    def get(self, sandbox_id: str) -> Held:
        held = self.held.get(sandbox_id)
        if held is None:
            raise SandboxNotFoundError(
                f"the server holds no sandbox {sandbox_id!r} (closed, reaped after its idle "
                "TTL, or never made here)", sandbox_id=sandbox_id)
        return held

    def pop(self, sandbox_id: str) -> Held:
        held = self.get(sandbox_id)
        del self.held[sandbox_id]
        return held

    @contextlib.contextmanager
    def using(self, held: Held) -> Iterator[Held]:
        """Mark ``held`` busy (never reaped) while a request works on it."""
        held.busy += 1
        try:
            yield held
        finally:
            held.busy -= 1
            held.last_used = self.now()

    def idle_past(self, ttl_s: float) -> list[Held]:
        now = self.now()
        return [h for h in self.held.values() if not h.busy and now - h.last_used > ttl_s]

    def add_snapshot(self, snapshot: Snapshot) -> str:
        handle = f"rbs-{secrets.token_hex(16)}"
        self.snapshots[handle] = snapshot
        return handle

    def snapshot(self, handle: str) -> Snapshot:
        found = self.snapshots.get(handle)
        if found is None:
            raise SandboxNotFoundError(f"the server holds no snapshot {handle!r}")
        return found
