"""Can any schedule of the SM90 kernel's blocks meet issue 5's weight-streaming target at few
tokens? The committed H200 kernel traces against the time the target allows (any CPU).

The target: at up to 64 tokens the call streams the weights at 70% or more of the measured copy
bandwidth, i.e. it takes at most ``t70 = bytes / (0.7 x copy)``, bytes by the anchors' formula
(``shared/anchors/README.md``, :func:`sim.metrics.published_metrics`; the copy bandwidth is the
benchmark's back-to-back figure, ``kernel_h200_ep1_wgmma.json`` ``copy_gbs_steady``). For each EP1
trace up to 64 tokens (``benchmarks/traces/kernel_flash_ep1_t*.npz``, two CTAs per SM from 3
tokens) the consumers' time is split by :func:`sim.metrics.balanced_time`: their first record's
start (the count, the pull and the ring's first fill), their work per CTA had the blocks been
spread evenly over the CTAs (the K loops and epilogues at the traced costs), and the tail after
their last record (the grid sync and the combine). Where ``work`` alone exceeds ``t70`` no
schedule meets the target with this K loop; where ``balanced`` (start + work + tail) does, none
does with this start and tail either; below it, the rest of the gap is the blocks' imbalance and
the consumers' idle time between blocks. ``work_ns_per_k_block_per_sm`` is the work's pace: the
consumers' work per CTA times the SMs over the K blocks (128 deep) of the trace's MMA records. The traces and the benchmark were recorded with the
same build (kernel v9.12, ``349f5e1e``, session 52), one H200.

Prints a table and writes ``benchmarks/results/streaming_bound_h200.json``.
"""

from __future__ import annotations

import glob
import json
import os
import re

import numpy as np

from megamoe.design_sm90 import BLOCK_K
from megamoe.trace import KIND, Trace
from sim.compare import recorded_units
from sim.metrics import balanced_time, published_metrics

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(HERE, "results", "kernel_h200_ep1_wgmma.json")
OUT = os.path.join(HERE, "results", "streaming_bound_h200.json")
TARGET = 0.70  # issue 5: >= 70% of the measured copy bandwidth at <= 64 tokens
MAX_TOKENS = 64


def rows() -> tuple[list[dict], dict]:
    bench = json.load(open(BENCH))
    copy = bench["copy_gbs_steady"]
    ours = {r["tokens"]: r for r in bench["rows"] if r["impl"] == "megamoe_sm90"}
    out = []
    for path in glob.glob(os.path.join(HERE, "traces", "kernel_flash_ep1_t*.npz")):
        T = int(re.search(r"_t(\d+)\.npz$", path).group(1))
        if T > MAX_TOKENS:
            continue
        tr = Trace.load(path)
        m = tr.meta
        idx = tr.topk_idx[0]
        valid = idx[idx >= 0]
        pm = published_metrics(int(valid.size), int(np.unique(valid).size), T, 1.0, m["hidden"],
                               m["intermediate"], m["top_k"])
        units = recorded_units(tr, 0)
        # K blocks of design_sm90.BLOCK_K: an L1 block's K is the hidden size, an L2 block's
        # the intermediate size
        n_kb = (int((tr["kind"] == KIND["l1_mma"]).sum()) * m["hidden"]
                + int((tr["kind"] == KIND["l2_mma"]).sum()) * m["intermediate"]) // BLOCK_K
        b = {k: v / 1e3 for k, v in balanced_time(tr, units).items()}  # us
        t70 = pm["hbm_bytes"] / (TARGET * copy * 1e9) * 1e6
        bench_row = ours.get(T, {})
        out.append({"tokens": T, "trace": os.path.basename(path), "ctas": units,
                    "kernel_build": m.get("kernel_build"), "hbm_bytes": pm["hbm_bytes"],
                    "t70_us": t70, "start_us": b["start_ns"], "work_us": b["work_ns"], "tail_us": b["tail_ns"],
                    "balanced_us": b["balanced_ns"], "traced_makespan_us": b["makespan_ns"],
                    "k_blocks": n_kb, "work_ns_per_k_block_per_sm": b["work_ns"] * 1e3 * m["num_sms"] / n_kb,
                    "bench_kernel_us": bench_row.get("us_kernel"), "bench_steady_us": bench_row.get("us_steady"),
                    "work_over_t70": b["work_ns"] / t70, "balanced_over_t70": b["balanced_ns"] / t70,
                    "verdict": ("the work alone exceeds t70" if b["work_ns"] > t70 else
                                "start + work + tail exceed t70" if b["balanced_ns"] > t70 else
                                "reachable by a better schedule" if b["makespan_ns"] > t70 else
                                "met in the trace")})
    out.sort(key=lambda r: r["tokens"])
    meta = {"benchmark": os.path.relpath(BENCH, os.path.dirname(HERE)), "benchmark_build": bench.get("build"),
            "benchmark_date": bench.get("date"), "device": bench.get("device"), "copy_gbs_steady": copy,
            "target_fraction_of_copy": TARGET,
            "method": "sim.metrics.balanced_time on the consumers of each committed EP1 trace (benchmarks/"
                      "streaming_bound.py docstring)"}
    return out, meta


def main() -> None:
    out, meta = rows()
    print(f"copy {meta['copy_gbs_steady']:.0f} GB/s (back to back, {meta['benchmark_date']}); t70 = bytes / "
          f"({TARGET:.2f} x copy); us")
    print(f"{'tokens':>6} {'CTAs':>4} {'t70':>7} {'start':>6} {'work':>7} {'tail':>5} {'balanced':>8} "
          f"{'traced':>7} {'bench':>7} {'ns/K block/SM':>13}  verdict")
    for r in out:
        print(f"{r['tokens']:6d} {r['ctas']:4d} {r['t70_us']:7.1f} {r['start_us']:6.1f} {r['work_us']:7.1f} "
              f"{r['tail_us']:5.1f} {r['balanced_us']:8.1f} {r['traced_makespan_us']:7.1f} "
              f"{r['bench_steady_us'] or float('nan'):7.1f} {r['work_ns_per_k_block_per_sm']:13.0f}  {r['verdict']}")
    with open(OUT, "w") as f:
        json.dump({"meta": meta, "rows": out}, f, indent=1)
    print(f"wrote {os.path.relpath(OUT)}")


if __name__ == "__main__":
    main()
