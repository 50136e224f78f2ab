"""Bitwise comparison of two kernel builds on the same inputs (A/B runs of a numerically
neutral change). `python same_outputs.py save OUT.pt` in each tree (PYTHONPATH = that tree), then
`python same_outputs.py compare A.pt B.pt`: per case, the number of BF16 outputs that differ."""
import sys

import torch

from megamoe.kernel import MegaMoEKernel, prepare_weights
from megamoe.kernel.check import make_inputs, make_weights

CASES = [("flash", 256, 6, 4096, 2048, T) for T in (1, 16, 64, 128, 256, 1024, 4096)] + [("tiny-wide", 8, 2, 256, 128, 64)]

if sys.argv[1] == "save":
    out = {}
    for name, E, K, H, I, T in CASES:
        w = make_weights(E, H, I, "cuda", seed=7, **({"sf_lo": 100, "sf_hi": 121} if "wide" in name else {}))
        k = MegaMoEKernel(E, K, H, I, T, prepare_weights(*w))
        x, xs, idx, tw = make_inputs(T, E, K, H, "cuda", seed=3)
        y = k(x, xs, idx, tw)
        k.check()
        out[f"{name} T={T}"] = y.cpu()
        del k
        torch.cuda.empty_cache()
    torch.save(out, sys.argv[2])
else:
    a, b = torch.load(sys.argv[2]), torch.load(sys.argv[3])
    for key in a:
        diff = int((a[key].view(torch.int16) != b[key].view(torch.int16)).sum())
        print(f"{key:22s} {diff:8d} of {a[key].numel()} BF16 outputs differ")
