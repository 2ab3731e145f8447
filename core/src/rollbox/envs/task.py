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
overrides ``setup``/``act``/``judge``. A ``SandboxError`` raised by any of them is a
sandbox failure, never a zero reward.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from rollbox.errors import ExecTimeoutError, UsageError
from rollbox.results import RolloutOutput
from rollbox.sandbox import ExecResult, Sandbox
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

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise UsageError(f"Task.id must be a non-empty str, got {self.id!r}")
        if not isinstance(self.spec, SandboxSpec):
            raise UsageError(f"Task {self.id!r}: spec must be a SandboxSpec")

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
        score = float(await self.verifier(sandbox, self))
        info = {"verified": True, "score": score, "submitted": submitted}
        if submitted or score >= 1.0:
            return Judgement(score, True, info)
        return Judgement(0.0, False, info)


@runtime_checkable
class TaskSource(Protocol):
    """Anything with a ``name`` that yields ``Task`` objects (an environment's tasks)."""

    name: str

    def tasks(self) -> Iterable[Task]:
        """The tasks, in the order a runner should start them."""
        ...


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
