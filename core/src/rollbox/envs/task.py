"""The environment contract: a task, what an action does in its sandbox, and its verdict.

A ``Task`` is one environment instance. Every way rollbox runs environments goes through
the same four parts of it, so an environment written once runs under the runner, under
Gymnasium and behind any other adapter (a NeMo Gym resources server, an OpenHands
workspace):

* ``spec``: the sandbox it needs (the pool key);
* ``setup(sandbox)``: prepare a clean sandbox of ``spec`` (write files, check out code);
* ``act(sandbox, action)``: what an agent's action does (by default: run it as a shell
  command; a timeout is an outcome the agent sees, not an error);
* ``judge(sandbox, step)``: the verdict after an action (``step``) or at the end
  (``step=None``): a reward, and whether the task is finished.

``prompt`` is what the agent is told; ``meta`` is free-form metadata. A task built from
data passes a ``verifier`` (reward read from the sandbox) and, for scripted rollouts
(the bench), a ``policy``; an environment with its own rules subclasses ``Task`` and
overrides ``setup``/``act``/``judge``.

**The final verdict is out of the rollout's reach** (``verdict``, what ``Session.verify``,
a ``submit`` and the runner take): the sandbox is sealed first (every process the
rollout started is killed, so nothing can watch, signal, trace or race the verdict's
commands), then with ``answer`` only those files go on to a sandbox reset to its image
(a replaced interpreter or an edited test stays behind), then ``judge_files`` (hidden
tests, reference data: never in the sandbox before) are written, then ``judge(sandbox,
None)`` runs. Between actions, ``judge`` sees the live sandbox: on a backend with
``exec_isolation`` nothing a command left running can forge a later command's result,
but the files are the rollout's to change, so keep what decides the reward in
``judge_files`` (the default ``judge`` then waits for the final verdict).

**Failures are attributed.** A ``SandboxError`` raised by ``setup``/``act``/``judge`` is a
sandbox failure, never a zero reward, unless the rollout caused it: a ``WorkloadError``
(the sandbox's own limits, rollbox's helpers killed from inside) or a verdict command
overrunning its timeout is an outcome of the rollout, scored by ``judge_failure`` (0.0 by
default) and never retried.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from rollbox.errors import (
    ExecTimeoutError,
    FileTooLargeError,
    NotRegularFileError,
    PathOutsideSandboxError,
    SandboxError,
    SandboxFileNotFoundError,
    UsageError,
    WorkloadError,
)
from rollbox.results import RolloutOutput
from rollbox.sandbox import ExecResult, Sandbox, resolve_path
from rollbox.spec import SandboxSpec

RolloutFn = Callable[[Sandbox, "Task", int], Awaitable[RolloutOutput]]
"""``rollout_fn(sandbox, task, index) -> RolloutOutput``: one rollout on a leased sandbox
whose ``task.setup`` has run."""

Verifier = Callable[[Sandbox, "Task"], Awaitable[float]]
"""``verifier(sandbox, task) -> reward``: read the reward from the sandbox's state."""

SUBMIT = "submit"
"""The action that ends an episode with the verifier's reward, whatever it is."""


@dataclass(frozen=True)
class StepOutcome:
    """What an action did. ``result`` holds what the command printed (up to its timeout
    when ``timed_out``: exit code -9)."""

    action: str
    result: ExecResult
    timed_out: bool = False


@dataclass(frozen=True)
class Judgement:
    """A task's verdict: the reward, whether the task is finished, and what the
    verifier reported."""

    reward: float
    terminated: bool
    info: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Task:
    """One environment instance. ``id`` must be unique within its source and a run."""

    id: str
    spec: SandboxSpec
    prompt: str = ""
    policy: RolloutFn | None = None
    verifier: Verifier | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)
    judge_files: Mapping[str, bytes] = field(default_factory=dict)
    """Files only the final verdict brings into the sandbox (path, relative to the
    workdir, to bytes): hidden tests, reference data. Written after the seal, so no
    process of the rollout ever sees them."""
    answer: tuple[str, ...] | None = None
    """The files that are the rollout's answer (paths relative to the workdir). Given,
    the final verdict runs on the sandbox reset to its image with only these files
    carried over; None judges the sandbox as the rollout left it (after the seal)."""

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise UsageError(f"Task.id must be a non-empty str, got {self.id!r}")
        if not isinstance(self.spec, SandboxSpec):
            raise UsageError(f"Task {self.id!r}: spec must be a SandboxSpec")
        for path, data in self.judge_files.items():
            if not isinstance(path, str) or not isinstance(data, bytes):
                raise UsageError(f"Task {self.id!r}: judge_files maps str paths to bytes")
        if self.answer is not None and (
                isinstance(self.answer, str) or not all(isinstance(p, str) for p in self.answer)):
            raise UsageError(f"Task {self.id!r}: answer is a tuple of paths (str), or None")

    @property
    def judged(self) -> bool:
        """Whether the task gives a verdict of its own (a verifier, or its own
        ``judge``): the runner then takes the reward from ``verdict``, not from what
        the rollout function says."""
        return self.verifier is not None or type(self).judge is not Task.judge

    @property
    def instruction(self) -> str:
        """``prompt``, or a generic one naming the working directory and ``submit``."""
        return self.prompt or (
            f"Task {self.id}. Work in the shell (working directory {self.spec.workdir}); "
            f"run `{SUBMIT}` when you are done."
        )

    async def setup(self, sandbox: Sandbox) -> None:
        """Prepare a clean sandbox of ``spec`` for an episode; the default does nothing
        (the image and spec are the whole starting state)."""

    async def act(self, sandbox: Sandbox, action: str, *,
                  timeout: float | None = None) -> StepOutcome:
        """Run ``action`` as a shell command; past ``timeout`` its tree is killed and
        the agent sees what it printed (``timed_out``)."""
        try:
            result = await sandbox.exec(action, timeout=timeout)
        except ExecTimeoutError as exc:
            return StepOutcome(action, ExecResult(-9, exc.stdout, exc.stderr, exc.timeout_s),
                               timed_out=True)
        return StepOutcome(action, result)

    async def judge(self, sandbox: Sandbox, step: StepOutcome | None) -> Judgement:
        """The verifier's verdict. After an action: a score of at least 1.0 ends the
        episode as solved with that reward, ``submit`` ends it with whatever the score
        is, anything else pays 0.0 (the reward is paid once, at the end). At the end
        (``step`` None): the score, finished. Without a verifier: 0.0, never finished."""
        if self.verifier is None:
            return Judgement(0.0, step is None, {"verified": False})
        submitted = step is None or step.action.strip() == SUBMIT
        if not submitted and self.judge_files:  # what it needs comes with the verdict
            return Judgement(0.0, False, {"verified": False})
        score = float(await self.verifier(sandbox, self))
        info = {"verified": True, "score": score, "submitted": submitted}
        if submitted or score >= 1.0:
            return Judgement(score, True, info)
        return Judgement(0.0, False, info)

    async def verdict(self, sandbox: Sandbox, *, canary: bool = False) -> Judgement:
        """The final verdict, out of the rollout's reach (see the module docstring):
        seal, carry ``answer`` over to a reset sandbox, write ``judge_files``, then
        ``judge(sandbox, None)``. Afterwards the sandbox holds the verdict's state: give
        it back to be reset.

        ``canary`` (with ``answer`` only): judge the same answer a second time, on the
        sandbox reset to its image again, and put that reward in the verdict's info as
        ``canary_reward``: a judge that gives the same answer two rewards (a flaky test,
        the clock, randomness) makes its rewards noise, and the run report says so.

        Raises CapabilityNotSupportedError on a backend that cannot seal, and the
        SandboxErrors of the sandbox's own calls: a lost sandbox is no verdict, and one
        of ``WORKLOAD_OUTCOMES`` (a verdict command past its timeout) is for the caller
        to score with ``judge_failure`` (``Session`` and the runner do)."""
        await sandbox.seal()
        info: dict[str, Any] = {}
        carried: dict[str, bytes] = {}
        if self.answer is not None:
            carried, missing = await _read_answer(sandbox, self.answer)
            if missing:
                info["answer_missing"] = missing
        judgement = await self._judge_afresh(sandbox, carried)
        if canary and self.answer is not None:
            again = await self._judge_afresh(sandbox, carried)
            info["canary_reward"] = float(again.reward)
        if not info:
            return judgement
        return Judgement(judgement.reward, judgement.terminated, {**judgement.info, **info})

    async def _judge_afresh(self, sandbox: Sandbox, carried: Mapping[str, bytes]
                            ) -> Judgement:
        """``judge`` on ``carried`` in the sandbox reset to its image (with ``answer``;
        without, on the sandbox as it is), ``judge_files`` written first."""
        if self.answer is not None:
            await sandbox.reset()
            for path, data in carried.items():
                await sandbox.write_file(path, data)
        for path, data in self.judge_files.items():
            await sandbox.write_file(path, data)
        return await self.judge(sandbox, None)

    def judge_failure(self, error: SandboxError) -> Judgement:
        """The verdict on an episode its own workload broke (a ``WorkloadError``, a
        verdict command past its timeout): 0.0, finished. Override to score it another
        way; never raise (it is an outcome, not an error)."""
        return Judgement(0.0, True, {"workload_failure": error.kind,
                                     "cause": getattr(error, "cause", error.kind),
                                     "message": error.message[:300]})


@runtime_checkable
class TaskSource(Protocol):
    """Anything with a ``name`` that yields ``Task`` objects (an environment's tasks)."""

    name: str

    def tasks(self) -> Iterable[Task]:
        """The tasks, in the order a runner should start them."""
        ...


WORKLOAD_OUTCOMES: tuple[type[SandboxError], ...] = (WorkloadError, ExecTimeoutError)
"""Sandbox errors that are an outcome of the rollout (scored by ``Task.judge_failure``),
not a failure of the sandbox: the workload broke its own sandbox, or overran a command's
timeout where no ``act`` turned that into what the agent sees."""


async def _read_answer(sandbox: Sandbox, paths: tuple[str, ...]
                       ) -> tuple[dict[str, bytes], list[str]]:
    """The answer files that are there (path → bytes), and the paths that are not: a
    path that is no regular file, too large, or missing is no answer."""
    carried: dict[str, bytes] = {}
    missing: list[str] = []
    for path in paths:
        full = resolve_path(path, sandbox.spec.workdir)
        try:
            carried[full] = await sandbox.read_file(full)
        except (SandboxFileNotFoundError, NotRegularFileError, FileTooLargeError,
                PathOutsideSandboxError):
            missing.append(path)
    return carried, missing


def is_sandbox_text(value: str) -> bool:
    """True when ``value`` can be passed to and shown from a sandbox unchanged: no NUL
    (it cannot cross an argv) and encodable as UTF-8 (no lone surrogates)."""
    if "\0" in value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
