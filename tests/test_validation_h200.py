"""The simulator against the committed H200 kernel traces (issue 7), on any CPU.

Measured on an H200 on 2026-11-30 (benchmarks/traces, results/kernel_plan_choices_h200.json).
Asserted here: what the model achieves today (makespan within 10% and median per-kind
duration error within 15% at 64 and 4096 tokens, within 10% / 25% at 512), the kernel's
block order per CTA equal to the plan's, and the plan-choice pairs the model ranks like the
kernel.  Known misses (reported in benchmarks/NOTES.md, not hidden): 1 token (-33%), and
block_m 64 vs 128 at 4096 tokens (the kernel's block_m 128 spills registers).
"""

import json
from pathlib import Path

import numpy as np
import pytest

from megamoe.trace import KIND, Trace
from sim.compare import compare_file, scenario_from_meta

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / "benchmarks" / "traces"


@pytest.mark.parametrize("tokens,makespan,kind", [(64, 0.10, 0.15), (512, 0.10, 0.25), (4096, 0.10, 0.15)])
def test_makespan_and_kind_errors(tokens, makespan, kind):
    r, _, _ = compare_file(str(TRACES / f"kernel_flash_ep1_t{tokens}.npz"))
    assert abs(r["makespan_error"]) <= makespan, r["makespan_error"]
    assert r["median_kind_error"] <= kind, r["median_kind_error"]
    assert r["unmatched_simulated"] < 0.01 * r["matched_intervals"]


@pytest.mark.parametrize("tokens", [1, 64, 512, 4096])
def test_kernel_block_order_equals_the_plan(tokens):
    t = Trace.load(str(TRACES / f"kernel_flash_ep1_t{tokens}.npz"))
    rp = scenario_from_meta(t).plan(t.meta["num_sms"], 232448).ranks[0]
    mma = (t["kind"] == KIND["l1_mma"]) | (t["kind"] == KIND["l2_mma"])
    for cta in range(t.meta["num_sms"]):
        sel = np.nonzero(mma & (t["sm"] == cta))[0]
        sel = sel[np.argsort(t["t_start_ns"][sel])]
        got = [(1 if t["kind"][i] == KIND["l1_mma"] else 2, int(t["expert"][i]), int(t["m_block"][i]),
                int(t["n_block"][i])) for i in sel]
        assert got == [tuple(b[:4]) for b in rp.sm_blocks(cta).tolist()]


def test_plan_choices_ranked_like_the_kernel():
    from megamoe.scenario import Scenario
    from sim import simulate

    meas = json.loads((ROOT / "benchmarks" / "results" / "kernel_plan_choices_h200.json").read_text())
    sim = {}
    for m in meas[:4]:  # the 512-token pairs: block_m 16 vs 64, experts per wave 4 vs 32
        sc = Scenario(shape="deepseek-v4-flash", num_ranks=1, tokens_per_rank=m["tokens"], max_tokens_per_rank=4096,
                      design="megamoe-sm90", hardware="h200", **m["override"])
        sim[json.dumps(m["override"])] = (m["kernel_us"], simulate(sc).trace.makespan_ns / 1e3)
    for a, b in (('{"block_m": 16}', '{"block_m": 64}'), ('{"experts_per_wave": 4}', '{"experts_per_wave": 32}')):
        (ka, sa), (kb, sb) = sim[a], sim[b]
        assert abs(ka / kb - 1) > 0.05  # the kernel tells them apart
        assert (ka < kb) == (sa < sb)
