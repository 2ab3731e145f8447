"""``rollbox/SWE-v0``: core's synthetic SWE-style tasks as episodes.

Each task is a small git repository at ``/repo`` whose tests fail until ``solution.py``
is fixed (``rollbox.synthetic``). The verifier runs the tests after every action; passing
them ends the episode with reward 1.0, and ``submit`` ends it with whatever they say.

On the local backend the task images (OCI layouts) are built on first use under
``$ROLLBOX_HOME/synthetic-gym`` (see ``rollbox_local``'s state directory), once. On the
fake backend pass ``task_options={"kind": "fake"}`` and ``backend=fake_backend()``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rollbox.paths import default_home
from rollbox.testing import FakeBackend
from rollbox_bench.synthetic import SyntheticSource

from rollbox_gymnasium.core_tasks import CoreTaskSource

PROMPT = (
    "Task {id}. The git repository in {workdir} has a bug: its tests fail. Run them with "
    "`python3 -B test_solution.py`, fix solution.py so that they pass, then run `submit`."
)
DEFAULT_IMAGES = 8


def synthetic_source(
    *,
    n_images: int = DEFAULT_IMAGES,
    seed: int = 0,
    padding_bytes: int = 0,
    kind: str = "local",
    root: str | Path | None = None,
    **options: Any,
) -> CoreTaskSource:
    """The synthetic tasks, their local images built if missing."""
    if kind == "local" and root is None:
        root = default_home() / "synthetic-gym" / f"seed-{seed}-padding-{padding_bytes}"
    source = SyntheticSource(n_images, seed=seed, padding_bytes=padding_bytes, kind=kind,
                             root=root, **options)
    if kind == "local":
        source.build()
    return CoreTaskSource(source, prompt=PROMPT)


def fake_backend(n_images: int = DEFAULT_IMAGES, seed: int = 0, **options: Any) -> FakeBackend:
    """A FakeBackend holding the fake synthetic images (for ``task_options={"kind": "fake"}``
    with the same ``n_images`` and ``seed``)."""
    source = SyntheticSource(n_images, seed=seed, padding_bytes=0, kind="fake")
    return source.fake_backend(**options)
