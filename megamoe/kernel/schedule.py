"""The block sequence each CTA executes, from the per-expert counts.

A view of :mod:`megamoe.plan`'s scheduler (DeepGEMM's MegaMoEScheduler rule,
``megamoe.policies.WaveScheduler``) keyed the way the kernel's trace is: ``{cta: [(phase,
expert, m_block, n_block), ...]}``.  ``csrc/megamoe/scheduler.cuh`` implements the same rule
on the device; the GPU trace test checks the device's order against this view, and
``tests/test_plan.py`` checks the plan against a literal re-statement of DeepGEMM's state
machine.
"""

from __future__ import annotations

import numpy as np


def block_sequence(counts, block_m: int, num_l1_n: int, num_l2_n: int, experts_per_wave: int,
                   num_sms: int) -> dict[int, list[tuple]]:
    """``{cta: [(phase, expert, m_block, n_block), ...]}`` with phase 1 = L1, 2 = L2."""
    from ..policies import ScheduleContext, WaveScheduler

    m_blocks = -(-np.asarray(counts, dtype=np.int64) // block_m)
    rows = WaveScheduler().block_list(ScheduleContext(m_blocks, num_l1_n, num_l2_n, experts_per_wave, num_sms))
    return {cta: [tuple(r[:4]) for r in rows[cta::num_sms].tolist()] for cta in range(num_sms)}
