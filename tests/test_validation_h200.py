"""The simulator against the committed H200 kernel traces (issue 7), on any CPU.

The traces (benchmarks/traces) were measured on the lent H200s on 2026-11-30 with the FP8
WGMMA kernel with the ballot scheduler (commit 5e20694); the H200 model's SM90 figures are
fitted to the EP1 traces at 64, 512 and 4096 tokens (``python -m sim.calibrate``, sources in
sim/hardware/h200.toml); the EP1 trace at 1 token and the EP2 traces (2 x H200, 64/512/2048
tokens per rank) were not used in the fit.  Asserted here, the issue's targets: makespan
within 10% and median per-kind duration error within 15% at every token count of the kernel
benchmark, EP1 and EP2; the kernel's block order per CTA equal to the plan's; the simulator
ordering two plan choices like the kernel whenever the kernel's times differ by more than 5%
(closer pairs are not asserted).  The plan-choice times
(results/kernel_plan_choices_h200.json) were measured on the FP8 WGMMA kernel before the
ballot scheduler: at 512 and 4096 tokens nearly every expert has tokens, so the scheduler
change (which only steps over empty experts faster; same block order) moves those times by a
few percent (the default-plan EP1 traces of the two kernels: +2.3% at 512 tokens, +4.6% at
4096), far less than the 22% and 30% that separate the asserted pairs.
"""

import json
from pathlib import Path

import numpy as np
import pytest

from megamoe.trace import KIND, Trace
from sim.compare import compare_file, scenario_from_meta

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / "benchmarks" / "traces"


@pytest.mark.parametrize("trace", ["ep1_t1", "ep1_t64", "ep1_t512", "ep1_t4096", "ep2_t64", "ep2_t512", "ep2_t2048"])
def test_makespan_and_kind_errors(trace):
    r, _, _ = compare_file(str(TRACES / f"kernel_flash_{trace}.npz"))
    assert abs(r["makespan_error"]) <= 0.10, r["makespan_error"]
    assert r["median_kind_error"] <= 0.15, r["median_kind_error"]
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
    asserted = 0
    for a, b in zip(meas[::2], meas[1::2]):  # pairs: block_m, then experts per wave, at 512 and 4096 tokens
        if abs(a["kernel_us"] / b["kernel_us"] - 1) <= 0.05:
            continue  # the kernel does not tell them apart: no order to match
        sim = [simulate(Scenario(shape="deepseek-v4-flash", num_ranks=1, tokens_per_rank=m["tokens"],
                                 max_tokens_per_rank=4096, design="megamoe-sm90", hardware="h200",
                                 **m["override"])).trace.makespan_ns for m in (a, b)]
        assert (a["kernel_us"] < b["kernel_us"]) == (sim[0] < sim[1]), (a, b, sim)
        asserted += 1
    assert asserted >= 2  # block_m 16 vs 64 at 512 tokens, 64 vs 128 at 4096 (22% and 30% apart)
