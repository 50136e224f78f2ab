"""Small launches of the SM90 kernel for compute-sanitizer (memcheck / racecheck / synccheck).

Cases (all by default, or the names given): ``small`` (8 experts, 5 tokens: every SM's K blocks
fit the stage ring once), ``wide`` (64 experts in one wave: the wide instance, design_sm90.wide_walk,
with a masked slot) and ``ring`` (8 experts, H 1024, 64 tokens on 2 SMs: ~130 K blocks per SM, so
every stage is refilled several times after the consumers release it), these three at one CTA per
SM; ``pair`` (8 experts, 40 tokens, two CTAs on each of the device's SMs: the two-CTA instance,
design_sm90.ctas_per_sm, with CTAs sharing SMs) and ``pair_ring`` (``ring`` at two CTAs per SM,
4 CTAs: its ring wraps); ``m128`` (8 experts, 600 tokens at block_m 128 on 4 SMs: each expert's
blocks hold 128 rows and its remainder, so kernel v9.12, which runs a block's WGMMAs at its valid rows,
runs several N).
Usage (GPU): compute-sanitizer --tool racecheck python3 benchmarks/device/sanitize_small.py [CASE ...]"""
import sys

sys.path.insert(0, ".")
from megamoe.design_sm90 import wide_walk
from megamoe.kernel import MegaMoEKernel, prepare_weights
from megamoe.kernel.check import (
    REL_L2_TOL,
    compare,
    make_inputs,
    make_weights,
    reference_sm90,
)

CASES = {  # name: (E, K, H, I, T, kernel options, masked slot)
    "small": (8, 2, 256, 128, 5, {"num_sms": 4, "ctas_per_sm": 1}, False),
    "wide": (64, 4, 256, 128, 3, {"num_sms": 4, "experts_per_wave": 64, "ctas_per_sm": 1}, True),
    "wide_pair": (64, 4, 256, 128, 3, {"num_sms": 4, "experts_per_wave": 64, "ctas_per_sm": 2}, True),
    "ring": (8, 2, 1024, 128, 64, {"num_sms": 2, "ctas_per_sm": 1}, False),
    "pair": (8, 2, 256, 128, 40, {}, False),
    "pair_ring": (8, 2, 1024, 128, 64, {"num_sms": 2}, False),
    "m128": (8, 2, 256, 128, 600, {"num_sms": 4, "ctas_per_sm": 1, "block_m": 128}, False),
}


def run(name: str) -> bool:
    E, K, H, I, T, opts, masked = CASES[name]
    w = make_weights(E, H, I, "cuda", seed=7)
    k = MegaMoEKernel(E, K, H, I, T, prepare_weights(*w), timeout_s=60.0, **opts)
    x, xs, idx, tw = make_inputs(T, E, K, H, "cuda", seed=3)
    if masked:
        idx[0, 1] = -1
    y = k(x, xs, idx, tw)
    k.check()
    d = k.last_design
    c = compare(y, reference_sm90(x, xs, idx, tw, *w, block_m=d.block_m))
    ok = (c["rel_l2"] <= REL_L2_TOL and c["nan"] == 0
          and wide_walk(d.block_m, d.experts_per_wave) == name.startswith("wide")
          and d.ctas_per_sm == (2 if "pair" in name else 1))
    print(f"sanitize_small {name} block_m {d.block_m} experts_per_wave {d.experts_per_wave} stages {d.num_stages} "
          f"CTAs {d.num_ctas}",
          c, "OK" if ok else "FAIL")
    return ok


if __name__ == "__main__":
    from megamoe.errors import OneLineArgumentParser
    from megamoe.kernel import cuda_available

    ap = OneLineArgumentParser(description="small launches of the SM90 kernel for compute-sanitizer")
    ap.add_argument("cases", nargs="*", metavar="CASE", help=f"cases to run: {', '.join(CASES)} (default: all)")
    names = ap.parse_args().cases or list(CASES)
    if bad := [n for n in names if n not in CASES]:
        ap.error(f"CASE: expected {', '.join(CASES)}, got {', '.join(bad)}")
    if not cuda_available():
        ap.error("device: expected a CUDA GPU with sm_90+ visible to torch, got none")
    results = [run(n) for n in names]  # every case runs, also after a failed one
    sys.exit(0 if all(results) else 1)
