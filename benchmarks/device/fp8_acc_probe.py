"""Probe the H200's FP8 tensor-core accumulation on one 32-deep K group.

Saves random E4M3 x E4M3 (and E4M3 x E2M1-valued) operands with K = 32 and the FP32 results
of ``torch._scaled_mm`` (cuBLAS QGMMA, unit scales) so that a CPU script can compare them with
the exact float64 dot products and fit a model of the accumulator (megamoe.reference).
Usage (GPU): python benchmarks/device/fp8_acc_probe.py OUT.npz
"""
import sys

import numpy as np
import torch

torch.manual_seed(0)
M, N, K = 1024, 256, 32
out = {}
e2m1 = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], device="cuda")
for name in ("e4m3", "e2m1"):
    a = (torch.randn(M, K, device="cuda") * torch.exp2(torch.randint(-3, 4, (M, 1), device="cuda").float()))
    a = a.clamp(-448, 448).to(torch.float8_e4m3fn)
    if name == "e4m3":
        b = (torch.randn(N, K, device="cuda") * 8).clamp(-448, 448).to(torch.float8_e4m3fn)
    else:
        b = e2m1[torch.randint(0, 16, (N, K), device="cuda")].to(torch.float8_e4m3fn)
    one = torch.ones((), device="cuda")
    for fast in (True, False):
        d = torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.float32, use_fast_accum=fast)
        out[f"{name}_d_fast{int(fast)}"] = d.cpu().numpy()
    out[f"{name}_a"] = a.view(torch.uint8).cpu().numpy()
    out[f"{name}_b"] = b.view(torch.uint8).cpu().numpy()
np.savez_compressed(sys.argv[1], **out)
print("saved", sys.argv[1], {k: v.shape for k, v in out.items()})
