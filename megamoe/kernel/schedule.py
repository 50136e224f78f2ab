"""The block sequence each CTA executes, from the per-expert counts.

A view of :mod:`megamoe.plan`'s scheduler (DeepGEMM's MegaMoEScheduler rule,
``megamoe.policies.WaveScheduler``) keyed the way the kernel's trace is: ``{cta: [(phase,
expert, m_block, n_block), ...]}``.  ``csrc/megamoe/scheduler.cuh`` implements the same rule
on the device; the GPU trace test checks the device's order against this view, and
``tests/test_plan.py`` checks the plan against a literal re-statement of DeepGEMM's state
machine. At two CTAs per SM (kernel v9.3) the CTAs take the list's rows by ticket instead, in the
wave-lag order since v9.4: :func:`block_list` and :func:`ticket_order_violation`.
"""

from __future__ import annotations

import numpy as np


def block_sequence(counts, block_m: int, num_l1_n: int, num_l2_n: int, experts_per_wave: int,
                   num_sms: int, wave_lag: bool = False) -> dict[int, list[tuple]]:
    """``{cta: [(phase, expert, m_block, n_block), ...]}`` with phase 1 = L1, 2 = L2: the static
    deal of :func:`block_list` (CTA ``c`` runs rows ``c, c + num_sms, ..``)."""
    rows = block_list(counts, block_m, num_l1_n, num_l2_n, experts_per_wave, num_sms, wave_lag)
    return {cta: rows[cta::num_sms] for cta in range(num_sms)}


def block_list(counts, block_m: int, num_l1_n: int, num_l2_n: int, experts_per_wave: int,
               num_sms: int, wave_lag: bool = False) -> list[tuple]:
    """The whole block list ``[(phase, expert, m_block, n_block), ...]`` in the plan's order: the
    order of the tickets at two CTAs per SM (kernel v9.3, :func:`megamoe.design_sm90.block_tickets`),
    where CTA ``c`` runs whichever rows it takes rather than ``c, c + C, ..``; ``wave_lag``: in the
    wave-lag order (kernel v9.4, :func:`megamoe.design_sm90.wave_lag`)."""
    from ..policies import ScheduleContext, WaveLagScheduler, WaveScheduler

    m_blocks = -(-np.asarray(counts, dtype=np.int64) // block_m)
    order = WaveLagScheduler() if wave_lag else WaveScheduler()
    rows = order.block_list(ScheduleContext(m_blocks, num_l1_n, num_l2_n, experts_per_wave, num_sms))
    return [tuple(r[:4]) for r in rows.tolist()]


def ticket_order_violation(order: dict[int, list[tuple]], rows: list[tuple]) -> str | None:
    """Whether ``order`` (per CTA, the blocks it ran, in the order it ran them; e.g.
    :func:`megamoe.kernel.trace.block_order`) is a run of the block list ``rows`` by ticket: every
    row run exactly once, and each CTA's rows at increasing list positions (a CTA's tickets only
    grow). The static deal is one such run.

    Returns:
        None, or what is wrong first, in one line.
    """
    pos = {r: i for i, r in enumerate(rows)}
    if len(pos) != len(rows):
        return "the block list repeats a block"
    seen = 0
    for cta, seq in sorted(order.items()):
        last = -1
        for b in seq:
            p = pos.get(tuple(b))
            if p is None:
                return f"CTA {cta} ran {tuple(b)}, which is not in the block list"
            if p <= last:
                return f"CTA {cta} ran {tuple(b)} (list position {p}) after position {last}"
            last = p
        seen += len(seq)
    run = {tuple(b) for seq in order.values() for b in seq}
    if seen != len(run):
        return f"{seen - len(run)} block(s) run more than once"
    if len(run) != len(rows):
        missing = next(r for r in rows if r not in run)
        return f"{len(rows) - len(run)} block(s) never run, e.g. {missing}"
    return None
