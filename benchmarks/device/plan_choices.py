"""Device run for issue 7: does the simulator rank plan choices like the kernel does?

V4-Flash EP1, the SM90 kernel with plan overrides (block_m, experts per wave) at a few token
counts (pairs: consecutive cases); writes each case's kernel time to $OUT/plan_choices.json:
``kernel_us``, the kernel's own GPU duration (CUPTI, median of 5 calls, ``median_kernel_us``; since
the forty-first session, until then the CUDA-event time of one call from an idle GPU, host latency
included, which is kept as ``event_us``), and the kernel build.
"""

from __future__ import annotations

import json
import os
import statistics

import torch

from megamoe.kernel import MegaMoEKernel, design_from_plan, prepare_weights
from megamoe.kernel.check import make_inputs, make_weights
from megamoe.kernel.build import library_path
from megamoe.kernel.timing import cuda_times_us, median_kernel_us
from megamoe.scenario import Scenario

OUT = os.environ.get("OUT", "/tmp/out")
E, K, H, I = 256, 6, 4096, 2048
CASES = [(512, {"block_m": 16}), (512, {"block_m": 64}), (512, {"experts_per_wave": 4}),
         (512, {"experts_per_wave": 32}), (4096, {"block_m": 64}), (4096, {"block_m": 128}),
         (4096, {"experts_per_wave": 4}), (4096, {"experts_per_wave": 32}),
         (64, {"block_m": 16}), (64, {"block_m": 32}), (1024, {"block_m": 32}), (1024, {"block_m": 64}),
         (8192, {"block_m": 64}), (8192, {"block_m": 128})]


def main() -> None:
    w = make_weights(E, H, I, "cuda", seed=0)
    kern = MegaMoEKernel(E, K, H, I, max(T for T, _ in CASES), prepare_weights(*w))
    out = []
    for T, over in CASES:
        mt = max(4096, T)
        sc = Scenario(shape="deepseek-v4-flash", num_ranks=1, tokens_per_rank=T, max_tokens_per_rank=mt,
                      design="megamoe-sm90", hardware="h200", **over)
        plan = sc.plan(torch.cuda.get_device_properties(0).multi_processor_count, 232448)
        idx = torch.from_numpy(sc.routing_ids()[0]).to("cuda", torch.int32)
        x, xs, _, tw = make_inputs(T, E, K, H, "cuda", seed=1)
        d = design_from_plan(plan)
        kern(x, xs, idx, tw, design=d)
        kern.check()
        ts = cuda_times_us(lambda: kern(x, xs, idx, tw, design=d), 5)
        ku = median_kernel_us(lambda: kern(x, xs, idx, tw, design=d))
        kern.check()
        rp = plan.ranks[0]
        out.append({"tokens": T, "max_tokens": mt, "override": over, "block_m": rp.config.block_m,
                    "experts_per_wave": rp.experts_per_wave, "ctas_per_sm": rp.ctas_per_sm, "kernel_us": ku,
                    "event_us": statistics.median(ts), "kernel_build": library_path("sm_90a").parent.name})
        print(out[-1], flush=True)
    with open(f"{OUT}/plan_choices.json", "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
