"""rollbox environments as gymnasium environments: a translation of ``rollbox.envs``.

    import gymnasium
    import rollbox_gymnasium  # registers rollbox/Shell-v0, rollbox/SWE-v0, ...

    env = gymnasium.make("rollbox/Shell-v0")
    obs, info = env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step("ls -la")

See docs/gymnasium.md for spaces, failures, the vector env and the shared event loop.
"""

from __future__ import annotations

from rollbox.envs.bridge import shutdown

from rollbox_gymnasium.env import SandboxEnv
from rollbox_gymnasium.registration import env_id, register_envs, register_source
from rollbox_gymnasium.spaces import SAMPLE_CHARSET, UnicodeText
from rollbox_gymnasium.vector import SandboxVectorEnv

register_envs()

__all__ = [
    "SAMPLE_CHARSET",
    "SandboxEnv",
    "SandboxVectorEnv",
    "UnicodeText",
    "env_id",
    "register_envs",
    "register_source",
    "shutdown",
]
