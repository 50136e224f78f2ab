"""Trace overhead of the SM90 kernel (issue 5 target: below 3% of kernel time): V4-Flash shape,
64 / 4096 / 8192 tokens, six rounds of five untraced then five traced calls (CUDA events),
the median of each round's ratio. Usage (GPU): python benchmarks/device/trace_overhead.py OUT.json"""
import json
import statistics
import sys

sys.path.insert(0, ".")
import torch

from megamoe.kernel import MegaMoEKernel, prepare_weights
from megamoe.kernel.check import make_inputs, make_weights
from megamoe.kernel.timing import cuda_times_us

E, K, H, I = 256, 6, 4096, 2048
w = make_weights(E, H, I, "cuda", seed=11)
k = MegaMoEKernel(E, K, H, I, 8192, prepare_weights(*w))
out = {}
for T in (64, 4096, 8192):
    args = make_inputs(T, E, K, H, "cuda", seed=3)
    k(*args)
    k(*args, trace="device")
    k.fetch_trace()
    torch.cuda.synchronize()
    rows = []
    for _ in range(6):
        off = statistics.median(cuda_times_us(lambda a=args: k(*a), 5, 1))
        on = statistics.median(cuda_times_us(lambda a=args: k(*a, trace="device"), 5, 1))
        rows.append((off, on, on / off - 1))
    k.fetch_trace()
    ov = [r[2] for r in rows]
    out[T] = {"rounds": rows, "median_overhead": statistics.median(ov)}
    print(f"T={T}: " + "  ".join(f"{a:.0f}/{b:.0f} ({100 * c:+.2f}%)" for a, b, c in rows)
          + f"  median {100 * statistics.median(ov):+.2f}%", flush=True)
with open(sys.argv[1], "w") as f:
    json.dump(out, f, indent=1)
