"""Device run for issue 7: kernel traces in the shared schema (with scenario meta and the
routing the kernel ran) and `megamoe calibrate` measurements, written to $OUT.

V4-Flash, EP1, tokens 1 / 16 / 64 / 256 / 512 / 1024 / 4096 / 8192 (the benchmark's sizes + 512; or
the first argument), uniform routing from megamoe.routing (seed 0), the plan of design megamoe-sm90
for 132 SMs passed to the kernel (design_from_plan). ``--max-tokens`` sets the scenario's
``max_tokens_per_rank`` (default: the largest count run); ``--ctas-per-sm 1`` runs the one-CTA plan
at every count (files ``kernel_flash_ep1_one_cta_t*.npz``: the one-CTA fit traces at 64 / 512).

Each count runs ``--calls`` traced calls (default 5) and keeps the one with the median makespan
(the trace's meta lists every call's, ``traced_calls_makespan_us``; until the forty-first session
one traced call was kept).

Each trace's meta holds the scenario (``Scenario.to_dict``) and: ``source`` "kernel", ``device``,
``kernel_build`` (the library's hash), ``num_sms``, ``plan`` (block_m, experts per wave, stages, CTAs
per SM), ``traced_calls_makespan_us`` (every traced call's span, first record to last) and
``kernel_us_median_untraced``: the median of five untraced single calls, each timed by a CUDA event
pair around the whole Python call from an idle GPU, so the host's launch work (~60-120 us on the
lent H200s, benchmarks/NOTES_kernel.md, fifteenth session) is in it at every size. It is not the
kernel's own time: in the committed traces it is 2.3x the traced span at 1 token and within 1% of
it at 4096 and 8192.

Usage (GPU): OUT=dir python benchmarks/device/traces.py [TOKENS] [--max-tokens M] [--ctas-per-sm 1|2] [--calls N]
"""

from __future__ import annotations

import json
import os
import statistics

try:
    import torch
except ImportError:  # refused in main() after the arguments are checked (one line, exit 2)
    torch = None

from megamoe.errors import OneLineArgumentParser
from megamoe.kernel import MegaMoEKernel, design_from_plan, prepare_weights
from megamoe.kernel.build import library_path
from megamoe.kernel.check import make_inputs, make_weights
from megamoe.kernel.timing import cuda_times_us, require_sm90_gpu, token_counts
from megamoe.kernel.trace import to_schema
from megamoe.scenario import Scenario
from sim.calibrate import calibrated_toml, from_kernel_trace, measure

OUT = os.environ.get("OUT", "/tmp/out")
E, K, H, I = 256, 6, 4096, 2048


def median_index(values: list[float]) -> int:
    """The index of the median of ``values`` (the lower of the two middle ones for an even count):
    which of several traced calls is kept. One call's makespan moves by ~2 us at 1 token from call
    to call (benchmarks/NOTES.md, sessions 29-33)."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    return order[(len(values) - 1) // 2]


def main() -> None:
    ap = OneLineArgumentParser(description="EP1 kernel traces in the shared schema (see the module docstring)")
    ap.add_argument("tokens", nargs="?", default="1,16,64,256,512,1024,4096,8192", help="comma-separated token counts")
    ap.add_argument("--max-tokens", type=int, default=None, help="max_tokens_per_rank (default: the largest count)")
    ap.add_argument("--ctas-per-sm", type=int, choices=(1, 2), default=None, help="CTAs per SM (default: the plan's rule)")
    ap.add_argument("--calls", type=int, default=5,
                    help="traced calls per token count; the one with the median makespan is kept (default 5)")
    a = ap.parse_args()
    if a.calls < 1:
        ap.error(f"calls: expected an integer >= 1, got {a.calls}")
    with ap.input_errors():
        tokens = token_counts(a.tokens)
    max_tokens = max(tokens) if a.max_tokens is None else a.max_tokens
    if max_tokens < max(tokens):
        ap.error(f"max-tokens: expected an integer >= the largest token count ({max(tokens)}), got {max_tokens}")
    require_sm90_gpu(ap)
    stem = "kernel_flash_ep1_one_cta" if a.ctas_per_sm == 1 else "kernel_flash_ep1"
    os.makedirs(OUT, exist_ok=True)
    w = make_weights(E, H, I, "cuda", seed=0)
    kern = MegaMoEKernel(E, K, H, I, max_tokens, prepare_weights(*w))
    summary = []
    for T in tokens:
        sc = Scenario(shape="deepseek-v4-flash", num_ranks=1, tokens_per_rank=T, max_tokens_per_rank=max_tokens,
                      design="megamoe-sm90", hardware="h200", ctas_per_sm=a.ctas_per_sm)
        plan = sc.plan(torch.cuda.get_device_properties(0).multi_processor_count, 232448)
        ids = sc.routing_ids()[0]
        x, xs, _, tw = make_inputs(T, E, K, H, "cuda", seed=1)
        idx = torch.from_numpy(ids).to("cuda", torch.int32)
        d = design_from_plan(plan)
        kern(x, xs, idx, tw, design=d)
        kern.check()
        ts = cuda_times_us(lambda: kern(x, xs, idx, tw, design=d), 5)
        kern.check()
        traced = []
        for _ in range(a.calls):
            _, recs = kern(x, xs, idx, tw, trace=True, design=d)
            kern.check()
            traced.append(to_schema(recs))
        spans = [t.makespan_ns / 1e3 for t in traced]
        tr = traced[median_index(spans)]
        rp = plan.ranks[0]
        tr.meta = {**sc.to_dict(), "source": "kernel", "device": torch.cuda.get_device_name(0),
                   "kernel_build": library_path("sm_90a").parent.name, "traced_calls_makespan_us": spans,
                   "num_sms": plan.num_sms, "kernel_us_median_untraced": statistics.median(ts),
                   "plan": {"block_m": rp.config.block_m, "experts_per_wave": rp.experts_per_wave,
                            "num_stages": rp.num_stages, "ctas_per_sm": rp.ctas_per_sm,
                            "wgmma_n_step": rp.wgmma_n_step}}
        tr.topk_idx = [ids]
        path = f"{OUT}/{stem}_t{T}.npz"
        tr.save_npz(path)
        summary.append({"tokens": T, "us": statistics.median(ts), "records": len(tr),
                        "makespan_us": tr.makespan_ns / 1e3})
        print(summary[-1], flush=True)
    m = measure()
    kernel = from_kernel_trace(f"{OUT}/{stem}_t{4096 if 4096 in tokens else max(tokens)}.npz", m["fp8_gemm_tflops"])
    with open(f"{OUT}/h200_calibrated.toml", "w") as f:
        f.write(calibrated_toml("h200", m, kernel))
    with open(f"{OUT}/traces_summary.json", "w") as f:
        json.dump({"runs": summary, "measured": m, "from_kernel_trace": kernel}, f, indent=1)
    print(json.dumps({"measured": m, "from_kernel_trace": kernel}, indent=1))


if __name__ == "__main__":
    main()
