"""Device run for issue 7: kernel traces in the shared schema (with scenario meta and the
routing the kernel ran) and `megamoe calibrate` measurements, written to $OUT.

V4-Flash, EP1, tokens 1 / 16 / 64 / 256 / 512 / 1024 / 4096 / 8192 (the benchmark's sizes + 512; or argv[1]), uniform routing from megamoe.routing (seed 0),
the plan of design megamoe-sm90 for 132 SMs passed to the kernel (design_from_plan).
"""

from __future__ import annotations

import json
import os
import statistics
import sys

import torch

from megamoe.kernel import MegaMoEKernel, design_from_plan, prepare_weights
from megamoe.kernel.build import library_path
from megamoe.kernel.check import make_inputs, make_weights
from megamoe.kernel.trace import to_schema
from megamoe.kernel.timing import cuda_times_us
from megamoe.scenario import Scenario
from sim.calibrate import calibrated_toml, from_kernel_trace, measure

OUT = os.environ.get("OUT", "/tmp/out")
E, K, H, I = 256, 6, 4096, 2048
TOKENS = [int(t) for t in (sys.argv[1] if len(sys.argv) > 1 else "1,16,64,256,512,1024,4096,8192").split(",")]


def main() -> None:
    os.makedirs(OUT, exist_ok=True)
    w = make_weights(E, H, I, "cuda", seed=0)
    kern = MegaMoEKernel(E, K, H, I, max(TOKENS), prepare_weights(*w))
    summary = []
    for T in TOKENS:
        sc = Scenario(shape="deepseek-v4-flash", num_ranks=1, tokens_per_rank=T, max_tokens_per_rank=max(TOKENS),
                      design="megamoe-sm90", hardware="h200")
        plan = sc.plan(torch.cuda.get_device_properties(0).multi_processor_count, 232448)
        ids = sc.routing_ids()[0]
        x, xs, _, tw = make_inputs(T, E, K, H, "cuda", seed=1)
        idx = torch.from_numpy(ids).to("cuda", torch.int32)
        d = design_from_plan(plan)
        kern(x, xs, idx, tw, design=d)
        kern.check()
        ts = cuda_times_us(lambda: kern(x, xs, idx, tw, design=d), 5)
        kern.check()
        _, recs = kern(x, xs, idx, tw, trace=True, design=d)
        kern.check()
        tr = to_schema(recs)
        rp = plan.ranks[0]
        tr.meta = {**sc.to_dict(), "source": "kernel", "device": torch.cuda.get_device_name(0),
                   "kernel_build": library_path("sm_90a").parent.name,
                   "num_sms": plan.num_sms, "kernel_us_median_untraced": statistics.median(ts),
                   "plan": {"block_m": rp.config.block_m, "experts_per_wave": rp.experts_per_wave,
                            "num_stages": rp.num_stages, "ctas_per_sm": rp.ctas_per_sm}}
        tr.topk_idx = [ids]
        path = f"{OUT}/kernel_flash_ep1_t{T}.npz"
        tr.save_npz(path)
        summary.append({"tokens": T, "us": statistics.median(ts), "records": len(tr),
                        "makespan_us": tr.makespan_ns / 1e3})
        print(summary[-1], flush=True)
    m = measure()
    kernel = from_kernel_trace(f"{OUT}/kernel_flash_ep1_t{4096 if 4096 in TOKENS else max(TOKENS)}.npz", m["fp8_gemm_tflops"])
    with open(f"{OUT}/h200_calibrated.toml", "w") as f:
        f.write(calibrated_toml("h200", m, kernel))
    with open(f"{OUT}/traces_summary.json", "w") as f:
        json.dump({"runs": summary, "measured": m, "from_kernel_trace": kernel}, f, indent=1)
    print(json.dumps({"measured": m, "from_kernel_trace": kernel}, indent=1))


if __name__ == "__main__":
    main()
