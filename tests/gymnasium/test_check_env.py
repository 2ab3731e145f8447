"""gymnasium's own checker on the registered envs (fake backend here; see test_local)."""

from __future__ import annotations

import warnings

import gymnasium
from gymnasium.utils.env_checker import check_env
from rollbox.testing import FakeBackend


def checked(id_: str, **kwargs: object) -> None:
    env = gymnasium.make(id_, **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a checker warning is a failure here
        check_env(env.unwrapped)
    env.close()


def test_shell_env_passes_check_env(fake_backend: FakeBackend) -> None:
    checked("rollbox/Shell-v0", backend=fake_backend)


def test_plugin_env_passes_check_env(task_plugin: str, fake_backend: FakeBackend) -> None:
    from rollbox_gymnasium import register_envs

    register_envs()
    checked(task_plugin, backend=fake_backend)
