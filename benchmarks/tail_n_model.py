"""What the simulator predicts for WGMMAs that cover a block's valid rows (kernel v9.12, candidate TN8).

Usage::

    python benchmarks/tail_n_model.py [OUT.json]   # default benchmarks/results/tail_n_model_h200.json

The SM90 kernel runs the GEMM "swap AB" (tokens are WGMMA's N), so a block whose valid rows fall
short of block_m could issue its WGMMAs at N = those rows rounded up to a step
(``megamoe.design_sm90.WGMMA_N_STEP``, :func:`megamoe.design_sm90.wgmma_n`). Kernel v9.11 ran
whole blocks; v9.12 (candidates TN / TN2 of session 51, landed in 52) steps by 32 at block_m 128,
TN8 (dropped after its H100 A/B, session 51) also by 8 at block_m 16. For V4-Flash, EP1, the H200 figures
(``sim/hardware/h200.toml``) and uniform routing, this simulates each token count with whole blocks
(v9.11: the scenario's ``wgmma_n_step`` what-if at 128) and with each step table at the call's
block_m, and prints the predicted time, its ratio to the whole blocks', the blocks' fill (valid
rows over block_m) and the WGMMAs' (valid rows over N). CPU only: a prediction from the model's
per-row K-block line, not a measurement.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOKENS = (1, 3, 12, 64, 256, 512, 1024, 2048, 2731, 4096, 6144, 8192)
#: Each step table (megamoe.design_sm90.WGMMA_N_STEP: v9.12's, and candidate TN8's patch).
CANDIDATES = {"v9.12": {128: 32}, "TN8": {16: 8, 128: 32}}


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
        kw = dict(shape="deepseek-v4-flash", num_ranks=1, tokens_per_rank=t, design="megamoe-sm90", hardware="h200")
        base = simulate(Scenario(**kw, wgmma_n_step=128), "h200")  # whole blocks, as v9.11 ran them
        bm = base.plan.ranks[0].config.block_m
        tpe = np.asarray(base.plan.ranks[0].tokens_per_expert)
        valid = np.concatenate([np.minimum(bm, n - bm * np.arange(-(-n // bm))) for n in tpe if n])
        row = {"tokens": t, "block_m": bm, "blocks_fill": float(valid.sum() / (len(valid) * bm)),
               "us_whole": us(base), "candidates": {}}
        for name, table in CANDIDATES.items():
            step = table.get(bm, bm)  # the candidate's step at this call's block_m (the what-if's)
            r = simulate(Scenario(**kw, wgmma_n_step=step), "h200") if step < bm else base
            n = np.array([d.wgmma_n(bm, int(v), step) for v in valid])
            row["candidates"][name] = {"wgmma_n_step": step, "us": us(r), "ratio": us(r) / us(base),
                                       "wgmma_fill": float(valid.sum() / n.sum())}
        out.append(row)
    return out


def main(argv: list[str]) -> int:
    path = Path(argv[0]) if argv else ROOT / "benchmarks/results/tail_n_model_h200.json"
    rs = rows()
    print(f"{'tokens':>6} {'block_m':>7} {'fill':>5} {'whole us':>9} "
          + " ".join(f"{name + ' us':>9} {'ratio':>6} {'fill':>5}" for name in CANDIDATES))
    for r in rs:
        cells = [f"{x['us']:>9.1f} {x['ratio']:>6.3f} {x['wgmma_fill']:>5.3f}" for x in r["candidates"].values()]
        print(f"{r['tokens']:>6} {r['block_m']:>7} {r['blocks_fill']:>5.3f} {r['us_whole']:>9.1f} " + " ".join(cells))
    path.write_text(json.dumps({"source": "benchmarks/tail_n_model.py", "hardware": "h200",
                                "shape": "deepseek-v4-flash", "ranks": 1, "routing": "uniform",
                                "candidates": CANDIDATES, "rows": rs}, indent=1) + "\n")
    print(f"-> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
