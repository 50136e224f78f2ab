"""The block sequence each CTA executes, computed on the host from the per-expert counts.

Same rule as ``csrc/megamoe/scheduler.cuh`` (DeepGEMM's MegaMoEScheduler). This is the
kernel-side oracle used by the trace test; ``megamoe.plan`` owns the project's copy and a test
compares the two when plan.py provides ``per_sm_block_sequence``-style output.
"""

from __future__ import annotations


def block_sequence(counts, block_m: int, num_l1_n: int, num_l2_n: int, experts_per_wave: int,
                   num_sms: int) -> dict[int, list[tuple]]:
    """``{cta: [(phase, expert, m_block, n_block), ...]}`` with phase 1 = L1, 2 = L2."""
    E = len(counts)
    mb = [(int(c) + block_m - 1) // block_m for c in counts]
    out: dict[int, list[tuple]] = {}
    for cta in range(num_sms):
        seq = []
        idx = cta
        expert = 0
        phase = 1
        while expert < E:
            wave_end = min((expert // experts_per_wave + 1) * experts_per_wave, E)
            if phase == 1:
                found = False
                while expert < wave_end:
                    m = idx // num_l1_n
                    if m < mb[expert]:
                        found = True
                        break
                    idx -= mb[expert] * num_l1_n
                    expert += 1
                if found:
                    seq.append((1, expert, m, idx - m * num_l1_n))
                    idx += num_sms
                    continue
                phase = 2
                expert = ((expert - 1) // experts_per_wave) * experts_per_wave
            else:
                found = False
                while expert < wave_end:
                    if idx < mb[expert] * num_l2_n:
                        found = True
                        break
                    idx -= mb[expert] * num_l2_n
                    expert += 1
                if found:
                    m = idx // num_l2_n
                    seq.append((2, expert, m, idx - m * num_l2_n))
                    idx += num_sms
                    continue
                phase = 1
        out[cta] = seq
    return out
