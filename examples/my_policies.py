"""An example plug-in policy for ``megamoe simulate --policy examples/my_policies.py:MyWaves``.

A wave policy is any class with ``experts_per_wave(ctx)``; the simulator and the plan call it
once per rank with a :class:`megamoe.policies.WaveContext` and check what it returns (an int in
[1, local experts], at most ``ctx.max_experts_per_wave``).
"""

from megamoe.policies import WaveContext


class MyWaves:
    """Waves of a quarter of the local experts (at least one, at most what the pool holds)."""

    name = "my-waves"

    def experts_per_wave(self, ctx: WaveContext) -> int:
        cap = ctx.max_experts_per_wave or ctx.experts_per_rank
        return max(1, min(cap, ctx.experts_per_rank // 4))
