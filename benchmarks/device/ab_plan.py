"""Paired A/B of two plan choices on one SM90 kernel build (GPU): the design rule's own launch
(``MegaMoEKernel.design``) against the same call with design overrides.

V4-Flash shape, EP1, one kernel object (one set of buffers, so no object bias): per token count
the two launches alternate in ABBA rounds (``megamoe.kernel.timing.alternating_rounds``), each
timed by its kernel's own GPU durations (CUPTI through ``torch.profiler``, the median of five
calls: ``median_kernel_us``), and their outputs are compared bit for bit (a plan choice moves
blocks between CTAs, never an output row's arithmetic). The kernel's error word is checked after
every round.

Usage: python benchmarks/device/ab_plan.py OUT.json --tokens 1,4,8,12 --override
'{"experts_per_wave": 32, "ctas_per_sm": 2}' [--rounds 8]

Prints one line per token count and writes every round's times, and the routing each count ran
(``topk_idx``: ``make_inputs`` draws it on the GPU, which the CPU cannot replay; for the model), to
OUT.json.
"""
import json
import statistics
import sys

sys.path.insert(0, ".")

from megamoe import design_sm90
from megamoe.errors import InputError, OneLineArgumentParser
from megamoe.kernel.timing import int_at_least, token_counts
from megamoe.outputs import check_output_path

E, K, H, I = 256, 6, 4096, 2048
OVERRIDES = ("block_m", "experts_per_wave", "num_stages", "ctas_per_sm")


def _overrides(text: str) -> dict:
    try:
        over = json.loads(text)
    except json.JSONDecodeError:
        over = None
    if not isinstance(over, dict) or not over or any(k not in OVERRIDES for k in over):
        raise InputError("override", f"a JSON object of some of {', '.join(OVERRIDES)}", repr(text))
    return over


def main() -> int:
    ap = OneLineArgumentParser(description="Paired A/B of two SM90 plan choices (see the module docstring)")
    ap.add_argument("out")
    ap.add_argument("--tokens", default="1,4,8,12")
    ap.add_argument("--override", required=True)
    ap.add_argument("--rounds", default="8")
    a = ap.parse_args()
    try:
        tokens = token_counts(a.tokens)
        over = _overrides(a.override)
        for T in tokens:  # the override's values, checked on the CPU before any GPU work
            design_sm90.design_for(T, H, I, E, K, **over)
        rounds = int_at_least(a.rounds, "rounds", 2)
        check_output_path("out", a.out)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from megamoe.kernel import cuda_available

    if not cuda_available():
        print("error: device: expected a CUDA GPU with sm_90+ visible to torch, got none", file=sys.stderr)
        return 2
    import torch

    from megamoe.kernel import MegaMoEKernel, prepare_weights
    from megamoe.kernel.check import make_inputs, make_weights
    from megamoe.kernel.timing import alternating_rounds, median_kernel_us

    w = make_weights(E, H, I, "cuda", seed=0)
    kern = MegaMoEKernel(E, K, H, I, max(tokens), prepare_weights(*w))
    rows = []
    for T in tokens:
        x, xs, idx, tw = make_inputs(T, E, K, H, "cuda", seed=T)
        rule = kern.design(T)
        alt = design_sm90.design_for(T, H, I, E, K, num_sms=kern.num_sms, **over)
        ya = kern(x, xs, idx, tw, design=rule).clone()
        kern.check()
        yb = kern(x, xs, idx, tw, design=alt).clone()
        kern.check()
        bitwise = bool(torch.equal(ya.view(torch.int16), yb.view(torch.int16)))
        per_round = alternating_rounds(
            {"rule": lambda: kern(x, xs, idx, tw, design=rule), "override": lambda: kern(x, xs, idx, tw, design=alt)},
            rounds, median_kernel_us, kern.check)
        ratios = [r["override"] / r["rule"] for r in per_round]
        row = {"tokens": T, "rule": {"block_m": rule.block_m, "experts_per_wave": rule.experts_per_wave,
                                      "ctas_per_sm": rule.ctas_per_sm, "num_stages": rule.num_stages},
               "override": {"block_m": alt.block_m, "experts_per_wave": alt.experts_per_wave,
                            "ctas_per_sm": alt.ctas_per_sm, "num_stages": alt.num_stages},
               "rule_us": statistics.median(r["rule"] for r in per_round),
               "override_us": statistics.median(r["override"] for r in per_round),
               "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
               "outputs_bitwise": bitwise, "rounds": per_round,
               "topk_idx": idx.cpu().tolist()}  # the routing it ran (a CUDA generator's draw)
        rows.append(row)
        print(f"T={T:5d} rule {row['rule']} {row['rule_us']:8.1f} us | override {row['override']} "
              f"{row['override_us']:8.1f} us | ratio {row['ratio_median']:.3f} ({row['ratio_min']:.3f}-"
              f"{row['ratio_max']:.3f}) bitwise={bitwise}", flush=True)
    with open(a.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(0), "override": over, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
