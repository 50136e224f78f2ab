"""Entry points for ``megamoe build`` and ``megamoe run`` (the CLI parser lives in megamoe/cli.py).

``build_main(arch, strict)`` compiles with nvcc (no GPU needed) and prints ptxas resources;
``run_main(...)`` runs one EP=1 scenario on the GPU with random MXFP4 weights, checks it
against the SM90 quantized reference, prints timings and optionally writes the trace.
Both return a process exit code.
"""

from __future__ import annotations

import json
import sys


def build_main(arch: str = "sm_90a", strict: bool = False, force: bool = False) -> int:
    from .build import BuildSetupError, KernelBuildError, build
    try:
        r = build(arch, force=force, strict=strict, verbose=True)
    except BuildSetupError as e:  # a missing tool or source: the setup's, one line like the CLI's errors (2)
        print(f"megamoe: error: {e}", file=sys.stderr)
        return 2
    except KernelBuildError as e:  # a failed compile or strict check: the code's (1), with the compiler's log
        print(f"megamoe build: {e}", file=sys.stderr)
        return 1
    print(f"{r.path} ({'cached' if r.cached else 'built'})")
    return 0


def run_main(num_experts: int = 256, topk: int = 6, hidden: int = 4096, inter: int = 2048, tokens: int = 64,
             routing: str = "uniform", clamp: float | None = None, reps: int = 10, trace_path: str | None = None,
             check: bool = True, seed: int = 0) -> int:
    import statistics

    import torch

    from .check import REL_L2_TOL, compare, make_inputs, make_weights, reference_sm90
    from .runtime import KernelError, MegaMoEKernel, cuda_available, prepare_weights
    from .timing import cuda_steady_us, cuda_times_us
    from .trace import to_chrome
    if not cuda_available():
        print("megamoe: error: device: expected a CUDA GPU with compute capability 9.0 (sm_90a) or 10.0 (sm_100a), "
              "got none",
              file=sys.stderr)
        return 2
    w = make_weights(num_experts, hidden, inter, "cuda", seed=seed)
    k = MegaMoEKernel(num_experts, topk, hidden, inter, max(tokens, 1), prepare_weights(*w), clamp=clamp)
    x, xs, idx, tw = make_inputs(tokens, num_experts, topk, hidden, "cuda", seed=seed + 1, routing=routing)
    try:
        y = k(x, xs, idx, tw)
        k.check()
        ts = cuda_times_us(lambda: k(x, xs, idx, tw), reps)
        steady = statistics.median(cuda_steady_us(lambda: k(x, xs, idx, tw), reps, rounds=3))
        k.check()
        graph = None
        if tokens > 0:  # the same call as a CUDA graph (no host work per call)
            g = k.capture(tokens)
            g.fill(x, xs, idx, tw)
            same = bool(torch.equal(g.replay().view(torch.int16), y.view(torch.int16)))
            graph = (statistics.median(cuda_steady_us(g.replay, reps, rounds=3)), same)
            g.check()
    except KernelError as e:
        print(f"megamoe run: {e}", file=sys.stderr)
        return 1
    recv = int((idx >= 0).sum())
    us = statistics.median(ts)
    print(f"design {k.last_design}")
    flop = 2 * recv * hidden * inter * 3
    print(f"tokens {tokens}: {us:.1f} us per call from an idle GPU (median of {reps}), {flop / us / 1e6:.1f} TFLOP/s; "
          f"{steady:.1f} us back to back ({reps} calls per round, median of 3; the host runs ahead), "
          f"{flop / steady / 1e6:.1f} TFLOP/s")
    if graph is not None:
        print(f"as a CUDA graph (MegaMoEKernel.capture): {graph[0]:.1f} us back to back, {flop / graph[0] / 1e6:.1f} "
              f"TFLOP/s; output bitwise equal to the eager call's: {graph[1]}")
    rc = 0
    if check:
        bm = k.last_design.block_m  # sets the L1 fold (design_sm90.L1_X_FOLD_K)
        c = compare(y, reference_sm90(x, xs, idx, tw, *w, clamp=clamp, block_m=bm))
        ok = c["nan"] == 0 and c["rel_l2"] <= REL_L2_TOL
        print(f"check vs reference (Numerics.sm90_kernel(block_m={bm}), exact partial sums, rel L2 <= {REL_L2_TOL:g} for the "
              f"FP8 WGMMA accumulation): {c} -> {'OK' if ok else 'FAIL'}")
        rc = 0 if ok else 1
        ref = reference_sm90(x, xs, idx, tw, *w, clamp=clamp, mma="h200_wgmma", block_m=bm)
        same = (y.view(torch.int16) == ref.view(torch.int16)).double().mean().item() if y.numel() else 1.0
        print(f"check vs reference with the H200's WGMMA accumulation modelled (Numerics.sm90_kernel("
              f"mma='h200_wgmma', block_m={bm}); bit for bit on the H200): {100 * same:.4f}% of outputs bitwise equal")
    if trace_path:
        _, recs = k(x, xs, idx, tw, trace=True)
        with open(trace_path, "w") as f:
            json.dump(to_chrome(recs), f)
        print(f"trace: {len(recs)} records -> {trace_path}")
    return rc
