"""rollbox for NVIDIA NeMo Gym: warm, isolated sandboxes as a NeMo Gym sandbox provider.

``pip install "rollbox[nemo-gym]"`` registers the provider ``rollbox`` in NeMo Gym's
entry-point group ``nemo_gym.sandbox_providers``; select it in YAML (see
``configs/rollbox.yaml`` in this package and docs/nemo-gym.md)::

    sandbox:
      rollbox: {backend: local}
"""

from __future__ import annotations

from pathlib import Path

from rollbox.envs.bridge import shutdown
from rollbox.errors import MissingExtraError

try:
    import nemo_gym.sandbox  # noqa: F401
except ImportError as exc:  # pragma: no cover - the extra pulls it in
    raise MissingExtraError("the NeMo Gym adapter (nemo-gym needs Python >= 3.13.14)",
                            "nemo-gym") from exc

from rollbox_nemo_gym.provider import RollboxCreateError, RollboxProvider
from rollbox_nemo_gym.specs import SpecNotSupportedError

CONFIG = Path(__file__).parent / "configs" / "rollbox.yaml"
"""The provider's YAML block, to add to NeMo Gym's ``config_paths``."""

CONFIG_REMOTE = Path(__file__).parent / "configs" / "rollbox_remote.yaml"
"""The same on the ``remote`` backend: sandboxes of a ``rollbox serve``, shared by every
process (``serialize`` in one, ``connect`` in another)."""

GYM_ROOT = Path(__file__).parent / "gym"
"""A NeMo Gym component root (for ``NEMO_GYM_EXTRA_ROOTS``) holding the resources server
``rollbox_env``: any rollbox environment, served by ``rollbox_nemo_gym.server``."""

__all__ = [
    "CONFIG",
    "CONFIG_REMOTE",
    "GYM_ROOT",
    "RollboxCreateError",
    "RollboxProvider",
    "SpecNotSupportedError",
    "shutdown",
]
