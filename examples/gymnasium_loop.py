"""A training loop, shaped like a real one, over rollbox sandboxes (local backend).

The "policy" is a stand-in for an LLM: for each task it has a few candidate commands
and a preference score per candidate, samples one per step, and after each episode
nudges the scores toward commands that earned reward (a tiny REINFORCE-like update).
Swap ``Policy`` for your model; the env loop stays the same.

    uv run python examples/gymnasium_loop.py            # 8 envs, 6 iterations
"""

from __future__ import annotations

import argparse
import math
import random

import gymnasium
import numpy as np
import rollbox_gymnasium  # noqa: F401  (registers the rollbox/... env ids)

CANDIDATES = {
    "shell/hello-file": ["ls", "echo hello world > hello.txt", "echo hello > hello.txt"],
    "shell/count-lines": ["cat words.txt", "wc -l < words.txt > count.txt", "wc -l words.txt"],
    "shell/sorted-copy": ["sort fruits.txt > sorted.txt", "cat fruits.txt > sorted.txt", "ls"],
}


class Policy:
    """Softmax over per-task command preferences."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.prefs: dict[str, list[float]] = {t: [0.0] * len(c) for t, c in CANDIDATES.items()}

    def act(self, task_id: str) -> tuple[str, int]:
        weights = [math.exp(p) for p in self.prefs[task_id]]
        choice = self.rng.choices(range(len(weights)), weights)[0]
        return CANDIDATES[task_id][choice], choice

    def update(self, task_id: str, choices: list[int], ret: float, lr: float = 0.5) -> None:
        prefs = self.prefs[task_id]
        probs = np.exp(prefs) / np.exp(prefs).sum()
        for choice in choices:
            for i in range(len(prefs)):
                prefs[i] += lr * (ret - 0.5) * ((i == choice) - probs[i])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--envs", type=int, default=8)
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--steps", type=int, default=12, help="batch steps per iteration")
    parser.add_argument("--max-episode-steps", type=int, default=4)
    args = parser.parse_args()

    n = args.envs
    policy = Policy(seed=0)
    envs = gymnasium.make_vec("rollbox/Shell-v0", num_envs=n,
                              max_episode_steps=args.max_episode_steps)
    _, info = envs.reset(seed=0)
    task_ids = list(info["task_id"])
    picks: list[list[int]] = [[] for _ in range(n)]
    returns = [0.0] * n
    autoreset = np.zeros(n, dtype=bool)
    for iteration in range(args.iterations):
        episodes: list[tuple[str, list[int], float]] = []
        failures = 0
        for _ in range(args.steps):
            chosen = [policy.act(task_ids[i]) for i in range(n)]
            _, rewards, terminated, truncated, info = envs.step([c for c, _ in chosen])
            for i in range(n):
                if autoreset[i]:  # this step reset sub-env i: a new episode begins
                    task_ids[i], picks[i], returns[i] = info["task_id"][i], [], 0.0
                    continue
                picks[i].append(chosen[i][1])
                returns[i] += float(rewards[i])
                if terminated[i] or truncated[i]:
                    if "_failure_kind" in info and info["_failure_kind"][i]:
                        failures += 1  # a failed sandbox is no zero reward: don't train on it
                    else:
                        episodes.append((task_ids[i], picks[i], returns[i]))
            autoreset = terminated | truncated
        for task_id, episode_picks, ret in episodes:
            policy.update(task_id, episode_picks, ret)
        mean = np.mean([r for _, _, r in episodes]) if episodes else float("nan")
        print(f"iteration {iteration}: {len(episodes)} episodes, mean return {mean:.2f}, "
              f"sandbox failures {failures}")
    envs.close()


if __name__ == "__main__":
    main()
