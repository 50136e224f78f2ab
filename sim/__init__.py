"""The discrete-event simulator of a Mega MoE call (SimPy).

``sim.simulate(scenario)`` builds the plan (:mod:`megamoe.plan`), runs every rank, SM
cluster and warp role as SimPy processes over shared HBM / NVLink / tensor-core resources,
and returns a :class:`sim.engine.SimResult` (trace + summary metrics).
"""

from .engine import SimResult, simulate  # noqa: F401
from .hardware import Hardware, load_hardware  # noqa: F401
