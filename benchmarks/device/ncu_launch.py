"""A few launches of the SM90 kernel for ncu (benchmarks/device/ncu_x2.sh): V4-Flash, EP1,
uniform routing, T tokens (argv[1], default 256), three calls (the script profiles the last)."""
import sys

import torch

from megamoe.kernel import MegaMoEKernel, prepare_weights
from megamoe.kernel.check import make_inputs, make_weights

E, K, H, I = 256, 6, 4096, 2048
T = int(sys.argv[1]) if len(sys.argv) > 1 else 256
w = make_weights(E, H, I, "cuda", seed=11)
k = MegaMoEKernel(E, K, H, I, T, prepare_weights(*w))
x, xs, idx, tw = make_inputs(T, E, K, H, "cuda", seed=3)
for _ in range(3):
    k(x, xs, idx, tw)
torch.cuda.synchronize()
k.check()
print("ok", T, k.last_design.block_m)
