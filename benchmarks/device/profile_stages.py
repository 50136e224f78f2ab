"""Where the SM90 kernel's time goes per role (fault_inject bit 32: per-CTA SM-cycle counters,
no functional change). Producer: total, waiting for a free stage, waiting for arrival counts /
masks. Consumer (thread 0 of the first consumer warpgroup): total, waiting for a full stage,
decode + barrier, MMA (WGMMA + promotion), epilogues. Fractions of each role's total, median
over CTAs. Usage (GPU): python benchmarks/device/profile_stages.py OUT.json"""
import json
import statistics
import sys

import torch

sys.path.insert(0, ".")
from megamoe.kernel import MegaMoEKernel, prepare_weights  # noqa: E402
from megamoe.kernel.check import make_weights, make_inputs  # noqa: E402
from megamoe.kernel.timing import cuda_times_us  # noqa: E402

E, K, H, I = 256, 6, 4096, 2048
w = make_weights(E, H, I, "cuda", seed=11)
k = MegaMoEKernel(E, K, H, I, 8192, prepare_weights(*w))
out = {}
for T in (1, 256, 4096, 8192):
    x, xs, idx, tw = make_inputs(T, E, K, H, "cuda", seed=3)
    k.fault_inject = 0
    us = statistics.median(cuda_times_us(lambda: k(x, xs, idx, tw), 5, 1))
    k.fault_inject = 32
    k.progress = torch.zeros(k.num_sms * 32, dtype=torch.int32, device="cuda")
    k(x, xs, idx, tw)
    torch.cuda.synchronize()
    k.check()
    pr = k.progress.view(-1, 32)[:, 8:16].to(torch.int64).cpu() * 64
    k.fault_inject = 0
    k.progress = None
    names = ["p_total", "p_wait_empty", "p_wait_dep", "c_total", "c_wait_full", "c_decode_bar", "c_mma", "c_epilogue"]
    med = {n: float(statistics.median(pr[:, i].tolist())) for i, n in enumerate(names)}
    row = {"T": T, "us": us, "cycles_per_us": med["c_total"] / us if us else 0,
           **{f"{n}_frac": (med[n] / med["p_total" if n.startswith("p_") else "c_total"]) for n in names if not n.endswith("total")},
           "median_cycles": med}
    out[f"T={T}"] = row
    print(f"T={T:5d} {us:9.1f} us  producer: wait_empty {row['p_wait_empty_frac']:.2f} wait_dep {row['p_wait_dep_frac']:.2f} | "
          f"consumer: wait_full {row['c_wait_full_frac']:.2f} decode+bar {row['c_decode_bar_frac']:.2f} "
          f"mma {row['c_mma_frac']:.2f} epi {row['c_epilogue_frac']:.2f}  ({med['c_total']/1e6:.2f} Mcyc)", flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
