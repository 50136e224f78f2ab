"""What the simulator predicts for candidate TN: WGMMAs that cover a block's valid rows only.

Usage::

    python benchmarks/tail_n_model.py [OUT.json]   # default benchmarks/results/tail_n_model_h200.json

The SM90 kernel runs the GEMM "swap AB" (tokens are WGMMA's N), so a block whose valid rows fall
short of block_m could issue its WGMMAs at N = those rows rounded up to a step
(``megamoe.design_sm90.WGMMA_N_STEP``, :func:`megamoe.design_sm90.wgmma_n`). Kernel v9.11 runs
whole blocks; candidate TN (``benchmarks/device/candidates/TN_s51.patch``) steps by 32 at block_m
128. For V4-Flash, EP1, the H200 figures (``sim/hardware/h200.toml``) and uniform routing, this
simulates each token count with the table as committed (v9.11) and with each step at block_m 128,
and prints the predicted time, its ratio to v9.11's, and the blocks' fill (valid rows over
block_m; the WGMMAs' fill at the step). CPU only; a prediction, not a measurement.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOKENS = (1024, 2048, 2731, 4096, 6144, 8192)
STEPS = (64, 32)


def us(result) -> float:
    """A simulation's makespan (the last rank's end), us."""
    return float(result.rank_end_ns.max()) / 1e3


def rows() -> list[dict]:
    import numpy as np

    from megamoe import design_sm90 as d
    from megamoe.scenario import Scenario
    from sim.engine import simulate

    out = []
    for t in TOKENS:
        sc = Scenario(shape="deepseek-v4-flash", num_ranks=1, tokens_per_rank=t, design="megamoe-sm90")
        base = simulate(sc, "h200")
        bm = base.plan.ranks[0].config.block_m
        tpe = np.asarray(base.plan.ranks[0].tokens_per_expert)
        valid = np.concatenate([np.minimum(bm, n - bm * np.arange(-(-n // bm))) for n in tpe if n])
        row = {"tokens": t, "block_m": bm, "blocks_fill": float(valid.sum() / (len(valid) * bm)),
               "us_v911": us(base), "steps": {}}
        for step in STEPS:
            if bm != 128 or step >= bm:  # the candidate steps the block_m 128 instance only
                continue
            d.WGMMA_N_STEP[bm] = step
            try:
                n = np.array([d.wgmma_n(bm, int(v)) for v in valid])
                r = simulate(sc, "h200")
            finally:
                d.WGMMA_N_STEP.pop(bm)
            row["steps"][step] = {"us": us(r), "ratio": us(r) / us(base),
                                  "wgmma_fill": float(valid.sum() / n.sum())}
        out.append(row)
    return out


def main(argv: list[str]) -> int:
    path = Path(argv[0]) if argv else ROOT / "benchmarks/results/tail_n_model_h200.json"
    rs = rows()
    print(f"{'tokens':>6} {'block_m':>7} {'fill':>5} {'v9.11 us':>9} "
          + " ".join(f"{'step ' + str(s) + ' us':>11} {'ratio':>6} {'fill':>5}" for s in STEPS))
    for r in rs:
        cells = []
        for s in STEPS:
            x = r["steps"].get(s)
            cells.append(f"{x['us']:>11.1f} {x['ratio']:>6.3f} {x['wgmma_fill']:>5.3f}" if x else f"{'-':>11} {'-':>6} {'-':>5}")
        print(f"{r['tokens']:>6} {r['block_m']:>7} {r['blocks_fill']:>5.3f} {r['us_v911']:>9.1f} " + " ".join(cells))
    path.write_text(json.dumps({"source": "benchmarks/tail_n_model.py", "hardware": "h200",
                                "shape": "deepseek-v4-flash", "ranks": 1, "routing": "uniform",
                                "rows": rs}, indent=1) + "\n")
    print(f"-> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
