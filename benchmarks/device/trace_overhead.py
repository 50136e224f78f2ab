"""Trace overhead of the SM90 kernel (issue 5 target: below 3% of kernel time): V4-Flash shape,
64 / 4096 / 8192 tokens. The kernel's own GPU duration (CUPTI, ``torch.profiler``: no host time,
no launch gap) of five untraced and five traced calls per round, the two alternating in ABBA
order over eight rounds; the overhead is the median of the per-round ratios. (Until the
fifteenth session this script timed one call from an idle GPU with CUDA events, which puts
68-123 us of host work and launch latency in every time: benchmarks/NOTES_kernel.md.)
Usage (GPU): python benchmarks/device/trace_overhead.py OUT.json"""
import json
import statistics
import sys
import time

sys.path.insert(0, ".")
import torch

from megamoe.kernel import MegaMoEKernel, prepare_weights
from megamoe.kernel.build import library_path
from megamoe.kernel.check import make_inputs, make_weights
from megamoe.kernel.timing import alternating_rounds, median_kernel_us

E, K, H, I = 256, 6, 4096, 2048
w = make_weights(E, H, I, "cuda", seed=11)
k = MegaMoEKernel(E, K, H, I, 8192, prepare_weights(*w))
out = {"meta": {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                "build": library_path("sm_90a").parent.name,
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "rounds": "per token count: (untraced us, traced us, traced / untraced - 1), kernel durations"}}
for T in (64, 4096, 8192):
    args = make_inputs(T, E, K, H, "cuda", seed=3)
    k(*args)
    k(*args, trace="device")
    k.fetch_trace()
    torch.cuda.synchronize()

    def off(a=args):
        k(*a)

    def on(a=args):
        k(*a, trace="device")

    per_round = alternating_rounds({"off": off, "on": on}, 8,
                                   median_kernel_us,
                                   after_round=k.fetch_trace)
    rows = [(t["off"], t["on"], t["on"] / t["off"] - 1) for t in per_round]
    ov = [r[2] for r in rows]
    out[T] = {"timing": "kernel (CUPTI), paired ABBA rounds", "rounds": rows, "median_overhead": statistics.median(ov)}
    print(f"T={T}: " + "  ".join(f"{a:.0f}/{b:.0f} ({100 * c:+.2f}%)" for a, b, c in rows)
          + f"  median {100 * statistics.median(ov):+.2f}%", flush=True)
with open(sys.argv[1], "w") as f:
    json.dump(out, f, indent=1)
