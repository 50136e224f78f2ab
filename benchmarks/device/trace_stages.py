"""Untraced and traced kernel time of the SM90 kernel at several pipeline-stage counts (GPU).

Session 53 (benchmarks/NOTES_kernel.md) found that fewer stages at block_m 128 (5 of the 8 that fit
the V4-Flash shape) take 2.2-2.8% off the untraced kernel time, through the L1 data cache they leave,
while the traced kernel kept its time at every count, so the trace overhead read +4.3-4.5% at 5
stages against the 3% issue 5 holds it to. This measures both, per stage count, in one process: one
kernel object per count (same weights and inputs, V4-Flash shape, EP1), CUPTI kernel durations
(``median_kernel_us``: the median of five calls), every variant in ABBA order over the rounds
(``alternating_rounds``). Per token count and stage count it prints the median untraced and traced
times, the median per-round overhead (traced / untraced - 1) and the untraced time over the first
count's; the JSON keeps every round.

Usage (GPU): python benchmarks/device/trace_stages.py OUT.json [STAGES, default 8,6,5,4]
[TOKENS, default 4096,8192] [ROUNDS, default 6]
"""
import json
import statistics
import sys

sys.path.insert(0, ".")
import torch

from megamoe.errors import OneLineArgumentParser
from megamoe.kernel import MegaMoEKernel, prepare_weights
from megamoe.kernel.build import library_path
from megamoe.kernel.check import make_inputs, make_weights
from megamoe.kernel.timing import alternating_rounds, median_kernel_us, require_sm90_gpu, token_counts
from megamoe.outputs import check_output_path

E, K, H, I = 256, 6, 4096, 2048


def main() -> int:
    ap = OneLineArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("stages", nargs="?", default="8,6,5,4")
    ap.add_argument("tokens", nargs="?", default="4096,8192")
    ap.add_argument("rounds", nargs="?", type=int, default=6)
    a = ap.parse_args()
    with ap.input_errors():
        check_output_path("out", a.out)
        tokens = token_counts(a.tokens)
        stages = token_counts(a.stages, "stages")  # positive integers; the design checks each count
    if a.rounds < 1:
        ap.error(f"rounds: expected an integer >= 1, got {a.rounds}")
    require_sm90_gpu(ap)
    w = prepare_weights(*make_weights(E, H, I, "cuda", seed=11))
    ks = {s: MegaMoEKernel(E, K, H, I, max(tokens), w, num_stages=s) for s in stages}
    res = {"device": torch.cuda.get_device_name(), "build": library_path("sm_90a").parent.name, "stages": stages}
    for T in tokens:
        args = make_inputs(T, E, K, H, "cuda", seed=3)
        fns = {}
        for s, k in ks.items():
            k(*args)
            k(*args, trace="device")
            k.fetch_trace()
            fns[f"off{s}"] = lambda k=k: k(*args)
            fns[f"on{s}"] = lambda k=k: k(*args, trace="device")
        torch.cuda.synchronize()

        def drain():
            for k in ks.values():
                k.fetch_trace()

        rounds = alternating_rounds(fns, a.rounds, median_kernel_us, after_round=drain)
        med = {n: statistics.median(r[n] for r in rounds) for n in fns}
        res[T] = {"median_us": med, "rounds": rounds}
        for s in stages:
            ov = statistics.median(r[f"on{s}"] / r[f"off{s}"] - 1 for r in rounds)
            res[T][f"overhead{s}"] = ov
            print(f"T={T} stages {s}: untraced {med[f'off{s}']:.1f} us  traced {med[f'on{s}']:.1f} us  "
                  f"overhead {100 * ov:+.2f}%  untraced / first {med[f'off{s}'] / med[f'off{stages[0]}']:.3f}",
                  flush=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
