"""Core ``rollbox.tasks.Task`` objects as env tasks.

A core task names its sandbox (``spec``) and, optionally, a ``verifier`` that reads a
reward from the sandbox. An episode over it works like this:

- the prompt is ``task.meta["prompt"]`` (or ``["instruction"]``), else the source's
  ``prompt`` template (``{id}`` and ``{workdir}`` filled in), else a generic one;
- after every action the verifier runs (unless ``verify_each_step=False``); a reward of
  at least ``success_reward`` ends the episode as solved, with that reward;
- the action ``submit`` (``submit_action``) ends the episode with the verifier's reward,
  whatever it is;
- otherwise the step's reward is 0.0: the reward is paid once, when the episode ends, so
  partial credit is not summed over every step of a long episode.

A task without a verifier pays 0.0 and ends only by truncation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rollbox.sandbox import Sandbox
from rollbox.spec import SandboxSpec
from rollbox.tasks import Task, TaskSource

from rollbox_gymnasium.tasks import Judgement, StepOutcome

DEFAULT_SUBMIT_ACTION = "submit"


@dataclass(frozen=True)
class CoreTask:
    """An ``EnvTask`` over a core ``Task``."""

    task: Task
    submit_action: str = DEFAULT_SUBMIT_ACTION
    success_reward: float = 1.0
    verify_each_step: bool = True
    prompt_template: str | None = None

    @property
    def id(self) -> str:
        return self.task.id

    @property
    def spec(self) -> SandboxSpec:
        return self.task.spec

    @property
    def prompt(self) -> str:
        meta = self.task.meta
        text = meta.get("prompt") or meta.get("instruction")
        if text:
            return text
        if self.prompt_template is not None:
            return self.prompt_template.format(id=self.task.id, workdir=self.task.spec.workdir)
        return (
            f"Task {self.task.id}. Work in the shell (working directory "
            f"{self.task.spec.workdir}); run `{self.submit_action}` when you are done."
        )

    async def setup(self, sandbox: Sandbox) -> None:
        """Nothing to do: a core task's image and spec are its whole starting state."""

    async def judge(self, sandbox: Sandbox, step: StepOutcome) -> Judgement:
        submitted = step.action.strip() == self.submit_action
        if self.task.verifier is None:
            return Judgement(0.0, False, {"verified": False})
        if not (submitted or self.verify_each_step):
            return Judgement(0.0, False, {"verified": False})
        score = float(await self.task.verifier(sandbox, self.task))
        solved = score >= self.success_reward
        if submitted or solved:
            return Judgement(score, True, {"verified": True, "score": score,
                                           "submitted": submitted})
        return Judgement(0.0, False, {"verified": True, "score": score, "submitted": False})


class CoreTaskSource:
    """An ``EnvTaskSource`` over a core ``TaskSource`` (its tasks, materialised once)."""

    def __init__(
        self,
        source: TaskSource,
        *,
        submit_action: str = DEFAULT_SUBMIT_ACTION,
        success_reward: float = 1.0,
        verify_each_step: bool = True,
        prompt: str | None = None,
    ) -> None:
        self.name = source.name
        self.source = source
        self._tasks = [
            CoreTask(task, submit_action, success_reward, verify_each_step, prompt)
            for task in source.tasks()
        ]

    def tasks(self) -> Sequence[CoreTask]:
        return self._tasks
