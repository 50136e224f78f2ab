"""Numerics error table: the kernel's quantized forward vs exact math (issue 3).

For DeepSeek-V4-Flash and V4-Pro shapes, several token counts, and two input kinds
(``random``: N(0,1) activations and N(0,1/K) weights; ``outliers``: 1% of activation channels
x64 and 1/256 of weight entries x32), it measures the relative L2 error
``||y - y_ref|| / ||y_ref||`` of:

* ``sm100``: :func:`megamoe.reference.moe_reference_quantized` with ``Numerics.sm100()`` vs
  :func:`megamoe.reference.moe_reference` on the *same* FP8/FP4 inputs -- the error the
  kernel adds (BF16 gate/up, FP8 re-quantization of the SwiGLU output, BF16 L2 rows and
  output, FP32 accumulation);
* ``sm90 fold128``: the same with ``Numerics.sm90(128)`` (scales folded into E4M3 operands
  per 128-wide K group);
* ``sm90 fold128 vs sm100``: how far the two quantized forwards are from each other;
* ``vs float``: ``sm100`` vs an exact float64 forward on the *unquantized* inputs (BF16 x,
  float32 weights) -- adds the input quantization (FP8 x, MXFP4 weights);
* ``max token``: the largest per-token relative error of ``sm100`` vs exact.

Cost control (CPU): the weights are 8 distinct random experts and routing ids (top-k of
random scores over all E experts) are taken modulo 8 -- which expert a row meets does not
change the statistics of its error; clamp = 10 (DeepGEMM's test default).

Prints a table, writes ``benchmarks/results/numerics.json`` and
``docs/numerics_error_table.md``.  ``--quick`` runs a small subset (a minute).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import torch

from megamoe.reference import (
    Numerics, SyntheticWeights, mega_moe_pre_dispatch, moe_reference, moe_reference_quantized,
)

SHAPES = {  # name: (experts, top-k, hidden, intermediate) -- DeepGEMM test defaults / PR #316
    "deepseek-v4-flash": (256, 6, 4096, 2048),
    "deepseek-v4-pro": (384, 6, 7168, 3072),
}
DISTINCT = 8
CLAMP = 10.0
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


def one(shape: str, tokens: int, kind: str, seed: int = 0) -> dict:
    e, k, h, i = SHAPES[shape]
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((tokens, h), generator=g)
    if kind == "outliers":
        ch = torch.randperm(h, generator=g)[: max(1, h // 100)]
        x[:, ch] *= 64.0
    x = x.to(torch.bfloat16)
    scores = torch.randn((tokens, e), generator=g)
    w, idx = torch.topk(scores.softmax(-1), k, dim=-1)
    idx = idx % DISTINCT
    wq = SyntheticWeights(DISTINCT, h, i, seed=seed + 1, outliers=kind == "outliers",
                          distinct=DISTINCT)
    wf = SyntheticWeights(DISTINCT, h, i, seed=seed + 1, outliers=kind == "outliers",
                          distinct=DISTINCT, mode="float")
    xq, xsf, idx, w = mega_moe_pre_dispatch(x, idx, w)
    t0 = time.perf_counter()
    y100 = moe_reference_quantized(xq, xsf, idx, w, wq, activation_clamp=CLAMP)
    y90 = moe_reference_quantized(xq, xsf, idx, w, wq, activation_clamp=CLAMP,
                                  numerics=Numerics.sm90(128))
    ex = moe_reference(xq, xsf, idx, w, wq, activation_clamp=CLAMP)
    fl = moe_reference(x, None, idx, w, wf, activation_clamp=CLAMP)
    per_tok = ((y100.double() - ex).norm(dim=1) / ex.norm(dim=1)).max().item()
    return {"shape": shape, "tokens": tokens, "inputs": kind,
            "sm100_vs_exact": rel(y100, ex), "sm90_fold128_vs_exact": rel(y90, ex),
            "sm90_fold128_vs_sm100": rel(y90, y100),
            "sm100_vs_float": rel(y100, fl), "max_token_sm100_vs_exact": per_tok,
            "exact_vs_float": rel(ex, fl), "wall_s": time.perf_counter() - t0}


def markdown(rows: list[dict]) -> str:
    out = [
        "| model | tokens | inputs | sm100 vs exact | max token (sm100) | sm90 fold128 vs exact "
        "| sm90 fold128 vs sm100 | sm100 vs unquantized float |",
        "|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        out.append(f"| {r['shape']} | {r['tokens']} | {r['inputs']} | "
                   f"{r['sm100_vs_exact']:.3e} | {r['max_token_sm100_vs_exact']:.3e} | "
                   f"{r['sm90_fold128_vs_exact']:.3e} | {r['sm90_fold128_vs_sm100']:.2e} | "
                   f"{r['sm100_vs_float']:.3e} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small subset")
    ap.add_argument("--json", default=os.path.join(HERE, "results", "numerics.json"))
    ap.add_argument("--md", default=os.path.join(ROOT, "docs", "numerics_error_table.md"))
    args = ap.parse_args(argv)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    if args.quick:
        grid = [("deepseek-v4-flash", 8, "random"), ("deepseek-v4-flash", 8, "outliers")]
    else:
        grid = [(s, t, kind) for s in SHAPES for t in (1, 16, 64) for kind in ("random", "outliers")]
    rows = []
    for s, t, kind in grid:
        r = one(s, t, kind)
        rows.append(r)
        print(f"{s:18s} {t:5d} {kind:9s} sm100 {r['sm100_vs_exact']:.3e}  "
              f"sm90/128 {r['sm90_fold128_vs_exact']:.3e} (vs sm100 {r['sm90_fold128_vs_sm100']:.1e})  "
              f"max-token {r['max_token_sm100_vs_exact']:.2e}  "
              f"vs-float {r['sm100_vs_float']:.2e}  ({r['wall_s']:.1f} s)", flush=True)
    md = ("<!-- generated by benchmarks/numerics.py; do not edit -->\n"
          "Relative L2 error `||y - y_ref|| / ||y_ref||` of the quantized forward "
          "(`megamoe.reference.moe_reference_quantized`, clamp 10) against exact float64 math "
          "on the same FP8/FP4 inputs (`moe_reference`), and against float64 math on the "
          "unquantized BF16/float32 inputs. `random`: N(0,1) activations, N(0,1/K) weights; "
          "`outliers`: 1% of activation channels x64, 1/256 of weight entries x32. "
          f"Weights: {DISTINCT} distinct random experts (routing ids mod {DISTINCT}).\n\n"
          + markdown(rows))
    print()
    print(markdown(rows))
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"benchmark": "numerics", "torch": torch.__version__,
                   "machine": platform.machine(), "clamp": CLAMP, "distinct_experts": DISTINCT,
                   "quick": args.quick, "rows": rows}, f, indent=2)
    if not args.quick:
        os.makedirs(os.path.dirname(args.md), exist_ok=True)
        with open(args.md, "w") as f:
            f.write(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
