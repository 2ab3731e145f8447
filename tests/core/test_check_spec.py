"""No silently ignored field: what a backend cannot honour beyond limits (those are the
conformance suite's ``LimitTests``) is refused by name — a network it cannot give, a
``reset_command`` it never runs, an ``entrypoint`` it cannot start — and ``labels``,
which no backend acts on, are accepted and keep sandboxes of different labels apart."""

from __future__ import annotations

import pytest
from rollbox import Network, Pool, SandboxSpec, UnsupportedSpecError
from rollbox.testing.fake import FakeBackend


@pytest.mark.parametrize(("spec", "field"), [
    (SandboxSpec(network=Network.HOST), "network"),
    (SandboxSpec(reset_command="git reset --hard"), "reset_command"),
    (SandboxSpec(entrypoint=("python3", "-m", "http.server")), "entrypoint"),
])
async def test_a_field_the_backend_cannot_honour_is_refused_by_name(
        spec: SandboxSpec, field: str) -> None:
    backend = FakeBackend()
    with pytest.raises(UnsupportedSpecError) as refused:
        await backend.create(spec)
    error = refused.value
    assert (error.field, error.backend) == (field, "fake")
    assert f"SandboxSpec.{field}" in error.message and "'fake'" in error.message
    assert "choose a backend that supports it" in error.message
    assert not error.retryable
    await backend.aclose()


async def test_labels_are_accepted_and_part_of_the_pool_key() -> None:
    async with FakeBackend() as backend, Pool(backend) as pool:
        first, second = SandboxSpec(labels={"task": "a"}), SandboxSpec(labels={"task": "b"})
        async with pool.lease(first) as sandbox:
            held = sandbox.id
        async with pool.lease(second) as sandbox:
            assert sandbox.id != held, "a sandbox was handed to a spec of other labels"
        async with pool.lease(first) as sandbox:
            assert sandbox.id == held
