"""Where the SM90 kernel's time goes per role (fault_inject bit 32: per-CTA SM-cycle counters,
no functional change). Producer: total, waiting for a free stage, waiting for arrival counts /
masks. Consumer (thread 0 of the first consumer warpgroup): total, waiting for a full stage,
decode + barrier, MMA (WGMMA + promotion), epilogues, and the epilogues' parts (L1: loads issued
and the walk, SwiGLU + amax, barrier 1, exponents + barrier 2, quantization + barrier 3, stores +
proxy fence + barrier 4 + release; L2: row metadata, stores). Each part is the median over the
launched CTAs of its count, as a fraction of the median total of its role (medians of parts need
not add up to the total's, and the parts leave out the time before a role's first block and after
its last). The JSON also keeps every CTA's counts.

Usage (GPU): python benchmarks/device/profile_stages.py OUT.json [TOKENS, default 1,256,4096,8192]
"""
import json
import statistics
import sys

sys.path.insert(0, ".")
import torch  # noqa: E402

from megamoe.errors import OneLineArgumentParser  # noqa: E402
from megamoe.kernel import MegaMoEKernel, prepare_weights  # noqa: E402
from megamoe.kernel.check import make_weights, make_inputs  # noqa: E402
from megamoe.kernel.timing import cuda_times_us, require_sm90_gpu, token_counts  # noqa: E402
from megamoe.outputs import check_output_path  # noqa: E402

E, K, H, I = 256, 6, 4096, 2048
EPI_PARTS = ["l1_loads_walk", "l1_swiglu_amax", "l1_bar1", "l1_exponents_bar2", "l1_quant_bar3",
             "l1_store_fence_release", "l2_rows", "l2_stores"]
NAMES = ["p_total", "p_wait_empty", "p_wait_dep", "c_total", "c_wait_full", "c_decode_bar", "c_mma", "c_epilogue"] + \
    [f"c_epi_{n}" for n in EPI_PARTS]  # progress words 8..23 of each CTA, in SM cycles / 64


def main() -> int:
    ap = OneLineArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("tokens", nargs="?", default="1,256,4096,8192")
    a = ap.parse_args()
    with ap.input_errors():
        check_output_path("out", a.out)
        counts = token_counts(a.tokens)
    require_sm90_gpu(ap)
    k = MegaMoEKernel(E, K, H, I, max(counts), prepare_weights(*make_weights(E, H, I, "cuda", seed=11)))
    out = {}
    for T in counts:
        x, xs, idx, tw = make_inputs(T, E, K, H, "cuda", seed=3)
        k.fault_inject = 0
        us = statistics.median(cuda_times_us(lambda: k(x, xs, idx, tw), 5, 1))
        k.fault_inject = 32
        # 32 words for each launched CTA, no more (a buffer sized for two CTAs per SM left zero rows at
        # one, and until session 54's fix they entered the medians)
        k.progress = torch.zeros(k.design(T).num_ctas * 32, dtype=torch.int32, device="cuda")
        k(x, xs, idx, tw)
        torch.cuda.synchronize()
        k.check()
        pr = k.progress.view(-1, 32)[:, 8:24].to(torch.int64).cpu() * 64
        k.fault_inject = 0
        k.progress = None
        med = {n: float(statistics.median(pr[:, i].tolist())) for i, n in enumerate(NAMES)}
        row = {"T": T, "us": us, "ctas": int(pr.shape[0]), "cycles_per_us": med["c_total"] / us if us else 0,
               **{f"{n}_frac": (med[n] / med["p_total" if n.startswith("p_") else "c_total"])
                  for n in NAMES if not n.endswith("total")},
               "median_cycles": med, "cycles_per_cta": {n: pr[:, i].tolist() for i, n in enumerate(NAMES)}}
        out[f"T={T}"] = row
        print(f"T={T:5d} {us:9.1f} us  producer: wait_empty {row['p_wait_empty_frac']:.2f} "
              f"wait_dep {row['p_wait_dep_frac']:.2f} | consumer: wait_full {row['c_wait_full_frac']:.2f} "
              f"decode+bar {row['c_decode_bar_frac']:.2f} mma {row['c_mma_frac']:.2f} "
              f"epi {row['c_epilogue_frac']:.2f}  ({med['c_total'] / 1e6:.2f} Mcyc)", flush=True)
        print("        epilogue parts (of the consumer's total): " +
              " ".join(f"{n} {row[f'c_epi_{n}_frac']:.3f}" for n in EPI_PARTS), flush=True)
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
