"""The discrete-event simulator of a Mega MoE call (SimPy).

``sim.simulate(scenario)`` builds the plan (:mod:`megamoe.plan`), runs every rank, SM
cluster and warp role as SimPy processes over shared HBM / NVLink / tensor-core resources,
and returns a :class:`sim.engine.SimResult` (trace + summary metrics).  Submodules that do
not simulate (``sim.hardware``, ``sim.calibrate``) import without SimPy.
"""

__all__ = ["simulate", "SimResult", "Hardware", "load_hardware"]


def __getattr__(name):
    if name in ("simulate", "SimResult"):
        from . import engine

        return getattr(engine, name)
    if name in ("Hardware", "load_hardware"):
        from . import hardware

        return getattr(hardware, name)
    raise AttributeError(name)
