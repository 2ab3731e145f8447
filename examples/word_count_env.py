"""A rollbox environment written once, run under the runner and under Gymnasium.

The environment (docs/writing-an-environment.md): each task writes a file of words into
a fresh sandbox; the agent must write how many words it holds to ``answer.txt``. Reward
1.0 when the answer is right, and the episode ends.

    uv run python examples/word_count_env.py            # real sandboxes (local backend)

Installed as a plugin (an entry point in the ``rollbox`` group naming this module), the
same environment is ``open_task_source("word_count")`` and
``gymnasium.make("rollbox/WordCount-v0")`` without ``register_source``; here the source
object is registered with Gymnasium by hand.
"""

from __future__ import annotations

import argparse
import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rollbox import Pool, SandboxSpec, open_backend
from rollbox.envs import Judgement, StepOutcome, Task
from rollbox.errors import SandboxFileNotFoundError
from rollbox.hookspecs import hookimpl
from rollbox.results import RolloutOutput
from rollbox.runner import run_rollouts
from rollbox.sandbox import Sandbox

SOLUTION = "wc -w < words.txt > answer.txt"
VOCABULARY = ("sandbox", "reward", "rollout", "policy", "verifier", "episode", "image")


@dataclass(frozen=True, kw_only=True)
class WordCount(Task):
    """One task: count the words of ``words.txt``."""

    words: tuple[str, ...]

    async def setup(self, sandbox: Sandbox) -> None:
        await sandbox.write_file("words.txt", " ".join(self.words).encode() + b"\n")

    async def judge(self, sandbox: Sandbox, step: StepOutcome | None) -> Judgement:
        try:
            answer = (await sandbox.read_file("answer.txt")).decode(errors="replace").strip()
        except SandboxFileNotFoundError:
            answer = ""
        right = answer == str(len(self.words))
        return Judgement(1.0 if right else 0.0, terminated=right or step is None,
                         info={"answer": answer[:40]})


class WordCountSource:
    """``count`` seeded tasks of 3 to 12 words each."""

    name = "word_count"

    def __init__(self, count: int = 3, seed: int = 0, image: str = "host") -> None:
        rng = random.Random(seed)
        spec = SandboxSpec(image=image, workdir="/tmp")
        self._tasks = [
            WordCount(id=f"word_count/{i}", spec=spec,
                      prompt="How many words does words.txt hold? Write the number to "
                             "answer.txt.",
                      words=tuple(rng.choices(VOCABULARY, k=rng.randint(3, 12))))
            for i in range(count)
        ]

    def tasks(self) -> list[WordCount]:
        return self._tasks


@hookimpl
def rollbox_register_tasks(register: Callable[[str, object], None]) -> None:
    """What makes the environment findable by name, once this module is an entry point."""
    register(WordCountSource.name, WordCountSource)


# -- under the runner ---------------------------------------------------------------------


async def scripted_agent(sandbox: Sandbox, task: Task, index: int) -> RolloutOutput:
    """A rollout: the runner has run ``task.setup``; act, then take the verdict."""
    outcome = await task.act(sandbox, "cat words.txt")
    if index % 2 == 0:  # every other rollout solves it
        outcome = await task.act(sandbox, SOLUTION)
    verdict = await task.judge(sandbox, outcome)
    return RolloutOutput(verdict.reward, dict(verdict.info))


async def under_the_runner(backend_name: str) -> dict[str, Any]:
    async with open_backend(backend_name) as backend, Pool(backend) as pool:
        report = await run_rollouts(pool, WordCountSource().tasks(), 2, scripted_agent)
    return report.as_dict()


# -- under Gymnasium ----------------------------------------------------------------------


def under_gymnasium(backend_name: str) -> list[tuple[str, float, bool]]:
    import gymnasium
    from gymnasium.utils.env_checker import check_env
    from rollbox_gymnasium import register_source

    env_id = register_source(WordCountSource())  # rollbox/WordCount-v0
    env = gymnasium.make(env_id, backend=backend_name)
    try:
        check_env(env.unwrapped)
        prompt, _ = env.reset(seed=0)
        steps = [(prompt, 0.0, False)]
        for action in ("cat words.txt", SOLUTION):
            observation, reward, terminated, _, _ = env.step(action)
            steps.append((observation, float(reward), terminated))
        return steps
    finally:
        env.close()


def main() -> None:
    parser = argparse.ArgumentParser(description="one environment, two front ends")
    parser.add_argument("--backend", default="local", help="backend name (default: local)")
    args = parser.parse_args()
    report = asyncio.run(under_the_runner(args.backend))
    rollouts = report["rollouts"]
    print(f"runner: {rollouts['succeeded']} rollouts, mean reward {report['mean_reward']:.2f}")
    for observation, reward, terminated in under_gymnasium(args.backend):
        print(f"gymnasium: {observation.strip()[:60]!r} reward={reward} done={terminated}")


if __name__ == "__main__":
    main()
