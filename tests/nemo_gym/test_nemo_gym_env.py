"""The NeMo Gym adapter's tests, run in a Python 3.13 environment of their own.

nemo-gym 0.5-0.7 require Python >= 3.13.14 and bring ray, mlflow and ~160 packages, so
they are never installed next to rollbox (see ``[tool.uv]`` in the root pyproject).
This module makes (once, cached) a 3.13 virtualenv holding the real nemo-gym 0.7.0 and
rollbox's members editable, and runs ``adapters/nemo-gym/tests`` there: NeMo Gym's own
registry, ``AsyncSandbox``, its ``litmus_agent`` resources server and its session
conformance check, against real local sandboxes. CI fails if Python 3.13 is missing;
elsewhere it skips with the reason.
"""

from __future__ import annotations

import pytest
from isolated_env import EnvRecipe, ensure_env, run_pytest_in

RECIPE = EnvRecipe(
    name="nemo-gym",
    python="3.13",
    requirements=("nemo-gym==0.7.0", "mypy==2.4.1"),
    editable=("core", "plugins/local", "plugins/remote", "serve", "bench", "adapters/nemo-gym"),
    # nemo-gym declares Python >= 3.13.14; pyenv's 3.13 may be an older patch release
    # (3.13.0 here), which runs it fine. Resolve as if for 3.13.14.
    install_args=("--python-version", "3.13.14"),
)


@pytest.mark.slow
def test_nemo_gym_adapter_suite() -> None:
    env = ensure_env(RECIPE)
    run_pytest_in(env, ["adapters/nemo-gym/tests"])
