"""The wrapper bases forward the whole contract, and every wrapper built on them does.

The structural tests fail as soon as a method is added to ``Sandbox`` or ``Backend``
without a forwarding method in ``rollbox.wrappers``; the behavioural ones send every
call through each wrapper in rollbox (a lease's ``MeteredSandbox``, the bench's
``ChaosSandbox``/``ChaosBackend``) and check that it reached the wrapped object.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest
from rollbox import Pool
from rollbox.backend import Backend, Diagnostic
from rollbox.sandbox import (
    Capabilities,
    ExecRequest,
    ExecResult,
    OutputChunk,
    Process,
    Sandbox,
    Snapshot,
)
from rollbox.spec import SandboxSpec
from rollbox.wrappers import BUILT_ON_TOP, BackendWrapper, SandboxWrapper
from rollbox_bench.chaos import ChaosBackend

SPEC = SandboxSpec(image="recorded", env={"SPEC_VAR": "spec"})
PER_INSTANCE = {"capabilities", "doctor", "clean", "default_resources"}  # see BackendWrapper
OWN = {"name"}  # a wrapper's own identity


def contract(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")}


def test_sandbox_wrapper_forwards_every_method_and_attribute() -> None:
    missing = contract(Sandbox) - BUILT_ON_TOP - set(vars(SandboxWrapper))
    assert not missing, f"SandboxWrapper does not forward Sandbox.{sorted(missing)}"


def test_backend_wrapper_forwards_every_method_and_attribute() -> None:
    missing = contract(Backend) - PER_INSTANCE - OWN - set(vars(BackendWrapper))
    assert not missing, f"BackendWrapper does not forward Backend.{sorted(missing)}"


def test_wrappers_in_rollbox_build_on_the_bases() -> None:
    from rollbox.pool import MeteredSandbox
    from rollbox_bench.chaos import ChaosSandbox

    for cls in (MeteredSandbox, ChaosSandbox):
        assert issubclass(cls, SandboxWrapper), cls
    assert issubclass(ChaosBackend, BackendWrapper)


# -- every call reaches the wrapped object ---------------------------------------------


class _Done(Process):
    def __aiter__(self) -> AsyncIterator[OutputChunk]:
        return self._none()

    async def _none(self) -> AsyncIterator[OutputChunk]:
        return
        yield  # an async generator with nothing in it

    async def write_stdin(self, data: bytes) -> None: ...

    async def close_stdin(self) -> None: ...

    async def send_signal(self, signum: int) -> None: ...

    async def wait(self) -> int:
        return 0


class Recorder(Sandbox):
    """Records every call by name; commands print the environment they were given."""

    base_env: ClassVar[dict[str, str]] = {"IMAGE_VAR": "image"}  # type: ignore[misc]
    extra = "a backend's own attribute"

    def __init__(self, spec: SandboxSpec) -> None:
        super().__init__("recorder-1", spec)
        self.calls: list[str] = []
        self.envs: list[dict[str, str]] = []

    async def run(self, request: ExecRequest) -> ExecResult:
        self.calls.append("run")
        self.envs.append(dict(request.env))
        return ExecResult(0, stdout=request.env.get("IMAGE_VAR", "").encode())

    async def start(self, request: ExecRequest) -> Process:
        self.calls.append("start")
        self.envs.append(dict(request.env))
        return _Done()

    async def read_file(self, path: str) -> bytes:
        self.calls.append("read_file")
        return b"data"

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        self.calls.append("write_file")

    async def upload(self, local: str | Path, remote: str) -> None:
        self.calls.append("upload")

    async def download(self, remote: str, local: str | Path) -> None:
        self.calls.append("download")

    async def reset(self) -> None:
        self.calls.append("reset")

    async def snapshot(self) -> Snapshot:
        self.calls.append("snapshot")
        return Snapshot("snap-1", self.spec, "recording")

    async def prepare(self) -> None:
        self.calls.append("prepare")

    async def ping(self) -> bool:
        self.calls.append("ping")
        return True

    async def close(self) -> None:
        self.calls.append("close")


class RecordingBackend(Backend):
    name = "recording"
    capabilities: ClassVar[Capabilities] = Capabilities(snapshot=True, fork=True,
                                                        streaming=True)

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.sandboxes: list[Recorder] = []
        self.images = "a backend's own attribute"

    async def create(self, spec: SandboxSpec) -> Sandbox:
        self.calls.append("create")
        self.sandboxes.append(Recorder(spec))
        return self.sandboxes[-1]

    async def fork(self, snapshot: Snapshot) -> Sandbox:
        self.calls.append("fork")
        return await self.create(snapshot.spec)

    async def prefetch(self, image: str) -> None:
        self.calls.append("prefetch")

    def hint_upcoming(self, images: Sequence[str]) -> None:
        self.calls.append("hint_upcoming")

    def keep_warm(self, spec: SandboxSpec, count: int) -> bool:
        self.calls.append("keep_warm")
        return True

    async def drop_snapshot(self, snapshot: Snapshot) -> None:
        self.calls.append("drop_snapshot")

    async def aclose(self) -> None:
        self.calls.append("aclose")

    async def leftovers(self) -> list[str]:
        self.calls.append("leftovers")
        return ["something held"]

    @classmethod
    def doctor(cls) -> list[Diagnostic]:
        return [Diagnostic("recording", True, "checked by the wrapped backend")]


async def exercise_sandbox(sandbox: Sandbox, tmp_path: Path) -> None:
    """Every Sandbox method, once (close excepted: the caller decides how it ends)."""
    assert (await sandbox.exec("echo $IMAGE_VAR")).text == "image"
    await sandbox.stream("sleep 1")
    assert await sandbox.read_file("f") == b"data"
    await sandbox.write_file("f", b"x")
    await sandbox.upload(tmp_path / "local", "remote")
    await sandbox.download("remote", tmp_path / "local")
    await sandbox.snapshot()
    await sandbox.prepare()
    assert await sandbox.ping()
    await sandbox.reset()
    assert sandbox.base_env == {"IMAGE_VAR": "image"}
    assert getattr(sandbox, "extra") == Recorder.extra  # noqa: B009  (not in the contract)


SANDBOX_CALLS = ["run", "start", "read_file", "write_file", "upload", "download",
                 "snapshot", "prepare", "ping", "reset"]


def check_envs(recorder: Recorder) -> None:
    for env in recorder.envs:
        assert env["IMAGE_VAR"] == "image" and env["SPEC_VAR"] == "spec"


WRAPPERS: dict[str, Callable[[Backend], Backend]] = {
    "BackendWrapper": BackendWrapper,
    "ChaosBackend": lambda inner: ChaosBackend(inner, seed=1),
}


@pytest.mark.parametrize("wrap", list(WRAPPERS.values()), ids=list(WRAPPERS))
async def test_a_wrapped_backend_forwards_every_call(wrap: Callable[[Backend], Backend],
                                                     tmp_path: Path) -> None:
    inner = RecordingBackend()
    backend = wrap(inner)
    sandbox = await backend.create(SPEC)
    await exercise_sandbox(sandbox, tmp_path)
    await sandbox.close()
    assert inner.sandboxes[0].calls == [*SANDBOX_CALLS, "close"]
    check_envs(inner.sandboxes[0])

    forked = await backend.fork(Snapshot("snap-1", SPEC, "recording"))
    assert type(forked) is type(sandbox)  # wrapped like a created one
    await backend.prefetch("img")
    backend.hint_upcoming(["img"])
    assert backend.keep_warm(SPEC, 2) is True
    await backend.drop_snapshot(Snapshot("snap-1", SPEC, "recording"))
    assert await backend.leftovers() == ["something held"]
    await backend.aclose()
    assert inner.calls == ["create", "fork", "create", "prefetch", "hint_upcoming",
                           "keep_warm", "drop_snapshot", "leftovers", "aclose"]
    assert backend.capabilities == RecordingBackend.capabilities
    assert [d.check for d in backend.doctor()] == ["recording"]
    assert getattr(backend, "images") == inner.images  # noqa: B009


@pytest.mark.parametrize("wrap", [lambda b: b, *WRAPPERS.values()],
                         ids=["bare", *WRAPPERS])
async def test_a_leased_sandbox_forwards_every_call(wrap: Callable[[Backend], Backend],
                                                    tmp_path: Path) -> None:
    inner = RecordingBackend()
    async with Pool(wrap(inner), health_check=False, prepare=False) as pool:
        lease = await pool.acquire(SPEC)
        await exercise_sandbox(lease.sandbox, tmp_path)
        await lease.release()
        assert lease.sandbox is not lease.raw
    calls = inner.sandboxes[0].calls
    assert calls[: len(SANDBOX_CALLS)] == SANDBOX_CALLS
    check_envs(inner.sandboxes[0])
    assert pool.metrics.counters["resets"] == 1 and calls.count("reset") == 2


def test_wrapper_getattr_does_not_recurse_before_init() -> None:
    wrapper: Any = SandboxWrapper.__new__(SandboxWrapper)
    with pytest.raises(AttributeError):
        _ = wrapper.inner
