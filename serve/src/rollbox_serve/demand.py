"""What the server's clients ask to keep warm and expect next, added up.

Each client (one ``RemoteBackend``) sends its whole state: warm targets per spec (what
its own pool's policy wants, through ``Backend.keep_warm``) and the images it expects
next (``hint_upcoming``). The server's pool warms the sum of every client's targets and
its backend hydrates the clients' images interleaved, the most urgent of each first.
A client that is silent for the idle TTL is forgotten.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from rollbox.pool import PoolPolicy
from rollbox.spec import SandboxSpec


@dataclass
class ClientState:
    owner: str
    wishes: dict[SandboxSpec, int] = field(default_factory=dict)
    images: list[str] = field(default_factory=list)
    seen: float = 0.0


class SharedPolicy(PoolPolicy):
    """The server pool's policy: warm what the clients ask for, keep released
    sandboxes (reset) for whoever asks next, up to ``max_idle`` per spec."""

    name = "shared"
    reuse = True

    def __init__(self, max_idle: int = 4, max_warm: int = 256) -> None:
        self.keep_idle = max_idle
        self.max_warm = max_warm
        self.clients: dict[str, ClientState] = {}
        self._targets: dict[SandboxSpec, int] = {}

    def update(self, client: str, state: ClientState) -> None:
        self.clients[client] = state
        self._sum()

    def forget(self, client: str) -> ClientState | None:
        state = self.clients.pop(client, None)
        self._sum()
        return state

    def _sum(self) -> None:
        targets: dict[SandboxSpec, int] = {}
        for state in self.clients.values():
            for spec, count in state.wishes.items():
                targets[spec] = targets.get(spec, 0) + count
        self._targets = {s: min(n, self.max_warm) for s, n in targets.items()}

    @property
    def specs(self) -> list[SandboxSpec]:
        return list(self._targets)

    def warm_target(self, spec: SandboxSpec) -> int:
        return self._targets.get(spec, 0)

    def max_idle(self, spec: SandboxSpec) -> int:
        return max(self.keep_idle, self._targets.get(spec, 0))

    def images(self) -> list[str]:
        """Every client's upcoming images, round robin, duplicates dropped."""
        lists: Sequence[list[str]] = [c.images for c in self.clients.values()]
        merged = itertools.chain.from_iterable(itertools.zip_longest(*lists))
        return list(dict.fromkeys(i for i in merged if i is not None))
