"""The SM90 kernel's L2-to-SM traffic at large token counts, from the plan (CPU arithmetic).

Usage::

    python benchmarks/l2_traffic.py [OUT.json]   # default benchmarks/results/l2_traffic_h200.json

For each token count of the committed H200 benchmark from 256 tokens up (V4-Flash, EP1), the plan's
``block_m`` and the m blocks the benchmark's kind of routing makes (``megamoe.kernel.check.make_inputs``
on the CPU, seed 100 + T as the benchmark seeds its GPU draw: the same distribution, not the same
draw), the K blocks every m block runs (L1: 2I/128 n blocks x H/128 K blocks; L2: H/128 x I/128) and
the bytes each K block's stage brings into shared memory (``design_sm90.stage_copy_bytes``: the
token tile, the packed weights, their scales, the token scales). Their product
over the benchmark's back-to-back time is the rate the SMs read from the L2 cache (weights and
tokens are read by many blocks each, so nearly all of it is L2 hits, not HBM). Also the m blocks'
fill (routed rows / (m blocks x block_m)): the WGMMAs and the token-tile loads run whole blocks.
Prints a table and writes JSON.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def rows() -> list[dict]:
    import torch

    from megamoe import design_sm90 as d
    from megamoe.kernel.check import make_inputs

    bench = json.loads((ROOT / "benchmarks/results/kernel_h200_ep1_wgmma.json").read_text())
    sh = bench["shape"]
    E, K, H, I = sh["E"], sh["K"], sh["H"], sh["I"]
    out = []
    for r in bench["rows"]:
        T = r["tokens"]
        if r["impl"] != "megamoe_sm90" or T < 256:
            continue
        _, _, idx, _ = make_inputs(T, E, K, H, "cpu", seed=100 + T)
        counts = torch.bincount(idx[idx >= 0].long(), minlength=E)
        bm = d.design_for(T, H, I, E, K, num_sms=132).block_m
        m_blocks = int(((counts + bm - 1) // bm).sum())
        k_blocks = m_blocks * ((2 * I // d.BLOCK_K) * (H // d.BLOCK_K) + (H // d.BLOCK_K) * (I // d.BLOCK_K))
        per_k = d.stage_copy_bytes(bm)
        moved = k_blocks * per_k
        out.append({"tokens": T, "block_m": bm, "m_blocks": m_blocks, "fill": int(counts.sum()) / (m_blocks * bm),
                    "k_blocks": k_blocks, "bytes_per_k_block": per_k, "l2_to_sm_gb": moved / 1e9,
                    "us_steady": r["us_steady"], "l2_to_sm_tbs": moved / (r["us_steady"] * 1e6),
                    "flop_per_byte": r["tflops_steady"] * r["us_steady"] * 1e6 / moved})
    return out


def main(argv: list[str]) -> int:
    path = Path(argv[0]) if argv else ROOT / "benchmarks/results/l2_traffic_h200.json"
    rs = rows()
    print(f"{'tokens':>6} {'block_m':>7} {'m blocks':>8} {'fill':>5} {'K blocks':>9} {'B/K block':>9} "
          f"{'L2->SM GB':>9} {'us':>8} {'TB/s':>5} {'FLOP/B':>6}")
    for r in rs:
        print(f"{r['tokens']:>6} {r['block_m']:>7} {r['m_blocks']:>8} {r['fill']:>5.3f} {r['k_blocks']:>9} "
              f"{r['bytes_per_k_block']:>9} {r['l2_to_sm_gb']:>9.2f} {r['us_steady']:>8.1f} "
              f"{r['l2_to_sm_tbs']:>5.2f} {r['flop_per_byte']:>6.1f}")
    path.write_text(json.dumps({"source": "benchmarks/l2_traffic.py", "benchmark":
                                "benchmarks/results/kernel_h200_ep1_wgmma.json", "rows": rs}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
