"""rollbox-sim: a simulated cluster in virtual time (the ``sim`` backend) and
``rollbox simulate``, which replays a training run's sandbox burst on it with rollbox's
real pool, policies and runner (docs/simulate.md)."""

from rollbox_sim.backend import SimBackend, SimSandbox
from rollbox_sim.clock import run_virtual
from rollbox_sim.model import PRESETS, ClusterModel, Scenario, Spread, WorkloadModel

__all__ = ["PRESETS", "ClusterModel", "Scenario", "SimBackend", "SimSandbox", "Spread",
           "WorkloadModel", "run_virtual"]
