"""What core registers through its own hook spec: the fake backend and the pool
policies. (Its commands come from plugins: ``rollbox run`` and ``doctor`` from
rollbox-tools.)"""

from __future__ import annotations

from collections.abc import Callable

from rollbox.hookspecs import BackendRef, hookimpl
from rollbox.policies import LookaheadPolicy
from rollbox.pool import NoPoolPolicy, StaticPoolPolicy
from rollbox.testing.fake import FakeBackend


@hookimpl
def rollbox_register_backends(register: Callable[[str, BackendRef], None]) -> None:
    register("fake", FakeBackend)


@hookimpl
def rollbox_register_pool_policies(register: Callable[[str, type[object]], None]) -> None:
    register(NoPoolPolicy.name, NoPoolPolicy)
    register(StaticPoolPolicy.name, StaticPoolPolicy)
    register(LookaheadPolicy.name, LookaheadPolicy)

