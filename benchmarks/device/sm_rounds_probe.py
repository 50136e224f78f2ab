"""How the SM90 kernel's few-token time depends on the SMs it runs on (V4-Flash, EP1): does a
call at 1-2 tokens pay for the blocks' rounds per SM (wave quantization) or for the weights' HBM
traffic? At 1 token the 192 L1 blocks (6 experts x 32 N blocks) and the 192 L2 blocks fall on
132 SMs as one round on every SM and a second on 60; on 96 SMs every SM takes two, on 66 three.
If each SM's own pipeline sets the pace, 96 SMs take about as long as 132 and 66 about 1.4 times;
if HBM does, the time barely moves with the SMs (benchmarks/NOTES_kernel.md, session 48).

Each SM count is a kernel object of its own (``MegaMoEKernel(num_sms=n)``, the plan made for n
SMs); in each of ``ROUNDS`` rounds (ABBA order) every object's median CUPTI kernel time over five
calls. Outputs are checked bitwise equal across the SM counts (each block's sums do not depend on
where it runs). Usage (GPU): python benchmarks/device/sm_rounds_probe.py OUT.json [TOKENS] [SMS]
(defaults ``1,2`` and ``132,120,96,66``; an SM count above the GPU's is refused)."""
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
ROUNDS = 8


def main(out_path: str, tokens: list[int], sms: list[int]) -> None:
    have = torch.cuda.get_device_properties(0).multi_processor_count
    if bad := [n for n in sms if not 1 <= n <= have]:
        sys.exit(f"SMS: expected SM counts in [1, {have}], got {bad}")
    w = prepare_weights(*make_weights(E, H, I, "cuda", seed=11))
    kern = {n: MegaMoEKernel(E, K, H, I, 8192, w, num_sms=n) for n in sms}
    out = {"meta": {"device": torch.cuda.get_device_name(), "sms_on_gpu": have, "torch": torch.__version__,
                    "build": library_path("sm_90a").parent.name, "rounds": ROUNDS,
                    "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                    "timing": "median CUPTI kernel time of five calls per object per round, ABBA rounds"},
           "tokens": {}}
    for T in tokens:
        args = make_inputs(T, E, K, H, "cuda", seed=100 + T)
        ys = {n: kern[n](*args).clone() for n in sms}
        for k in kern.values():
            k.check()
        ref = ys[sms[0]].view(torch.int16)
        equal = all(torch.equal(ys[n].view(torch.int16), ref) for n in sms)
        rounds = alternating_rounds({n: (lambda k=kern[n], a=args: k(*a)) for n in sms}, ROUNDS,
                                    lambda fn: median_kernel_us(fn, 5))
        row = {}
        for n in sms:
            d = kern[n].last_design
            ratios = [r[n] / r[sms[0]] for r in rounds]
            row[str(n)] = {"us_median": statistics.median(r[n] for r in rounds), "ratio_to_first_median":
                           statistics.median(ratios), "ratio_range": [min(ratios), max(ratios)],
                           "block_m": d.block_m, "ctas": d.num_ctas, "experts_per_wave": d.experts_per_wave}
            print(f"T={T:3d} SMs={n:3d} ({d.num_ctas} CTAs, block_m {d.block_m}) {row[str(n)]['us_median']:7.1f} us  "
                  f"x{row[str(n)]['ratio_to_first_median']:.3f} of {sms[0]} SMs "
                  f"(rounds {min(ratios):.3f}..{max(ratios):.3f})", flush=True)
        out["tokens"][str(T)] = {"outputs_bitwise_equal": equal, "sms": row}
        print(f"T={T}: outputs bitwise equal across SM counts: {equal}", flush=True)
    with open(out_path, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], [int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "1,2").split(",")],
         [int(x) for x in (sys.argv[3] if len(sys.argv) > 3 else "132,120,96,66").split(",")])
