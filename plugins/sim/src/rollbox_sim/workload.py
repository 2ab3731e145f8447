"""The simulated corpus: task images with seeded sizes, and what each rollout does.

A rollout's actions are drawn per (task, rollout) from ``WorkloadModel``: its first
command runs at once (what TTFC times), then the policy's turns and the commands
alternate. The sandbox sees only their sums (one wait for the thinking, one command for
the commands): the time it is held is the same, for a tenth of the events.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass

from rollbox.envs import Task
from rollbox.results import RolloutOutput
from rollbox.sandbox import Sandbox
from rollbox.spec import SandboxSpec

from rollbox_sim.model import GB, WorkloadModel


@dataclass(frozen=True)
class RolloutPlan:
    think_s: float
    """The GPU's turns, in total."""
    command_s: float
    """The sandbox's commands, in total."""

    @property
    def work_s(self) -> float:
        """How long the rollout takes with its sandbox ready at once."""
        return self.think_s + self.command_s


class Corpus:
    """``images`` tasks, task ``i`` on image ``sim/task-i``."""

    def __init__(self, model: WorkloadModel) -> None:
        self.model = model
        self._plans: dict[tuple[str, int], RolloutPlan] = {}
        rng = random.Random(f"rollbox-sim-corpus:{model.seed}")
        self.tasks = [Task(id=f"task-{i}", spec=SandboxSpec(image=f"sim/task-{i}",
                                                            workdir="/repo"))
                      for i in range(model.images)]
        self.sizes = {task.spec.image: int(rng.uniform(model.image_gb_min,
                                                       model.image_gb_max) * GB)
                      for task in self.tasks}

    @property
    def total_bytes(self) -> int:
        return sum(self.sizes.values())

    def plan(self, task_id: str, index: int) -> RolloutPlan:
        """What rollout ``index`` of ``task_id`` does (the same every time it is asked)."""
        key = (task_id, index)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._draw(task_id, index)
        return plan

    def _draw(self, task_id: str, index: int) -> RolloutPlan:
        m = self.model
        rng = random.Random(f"rollbox-sim-rollout:{m.seed}:{task_id}:{index}")
        actions = rng.randint(m.actions_min, m.actions_max)
        return RolloutPlan(think_s=sum(m.think.draw(rng) for _ in range(actions)),
                           command_s=sum(m.command.draw(rng) for _ in range(actions)))

    def steps(self) -> list[list[Task]]:
        """The tasks of each synchronous RL step, in order."""
        size = self.model.tasks_per_step
        return [self.tasks[i:i + size] for i in range(0, len(self.tasks), size)]

    async def rollout(self, sandbox: Sandbox, task: Task, index: int) -> RolloutOutput:
        """The rollout function: a first command, then the policy's turns and the
        commands."""
        plan = self.plan(task.id, index)
        await sandbox.exec(["cat", "README.md"])
        await asyncio.sleep(plan.think_s)
        await sandbox.exec(["sleep", f"{plan.command_s:.6f}"], timeout=plan.command_s + 600)
        return RolloutOutput(reward=0.0)
