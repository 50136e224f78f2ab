"""megamoe: understand, predict and run MegaMoE-style fused MoE kernels.

The facts of the design live here (shapes, routing, plan, formats, layouts, reference,
trace); the discrete-event simulator lives in the sibling package ``sim``.
"""

__version__ = "0.1.0"
