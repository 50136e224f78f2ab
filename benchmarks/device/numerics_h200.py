"""The SM90 kernel's outputs against its two references, on the GPU.

For each case (the GPU suite's shapes and token counts): the kernel's BF16 output against
``reference_sm90`` with exact partial sums (``mma="exact"``) and with the H200's WGMMA
accumulation (``mma="h200_wgmma"``, the model fitted by ``benchmarks/wgmma_acc_fit.py``):
relative L2 error, fraction of outputs off by more than 1%, fraction bitwise equal, and the
L2 pool (the L1 half: WGMMA, promotion, SwiGLU, requantization) byte by byte against each;
plus every output's error against exact math (``reference_exact``).
Usage (GPU): python benchmarks/device/numerics_h200.py OUT.json
"""
import json
import sys
import time

import torch

from megamoe.kernel import MegaMoEKernel, prepare_weights
from megamoe.kernel.build import library_path
from megamoe.kernel.check import (
    compare,
    l2_pool_agreement,
    make_inputs,
    make_weights,
    reference_exact,
    reference_sm90,
)

TINY = {"E": 8, "K": 2, "H": 256, "I": 128}
FLASH = {"E": 256, "K": 6, "H": 4096, "I": 2048}
CASES = [("tiny", TINY, T, "uniform", 0.0, None) for T in (1, 33, 200)] + [
    ("tiny masked+clamp", TINY, 64, "uniform", 0.3, 0.05),
    ("tiny zipf", TINY, 300, "zipf", 0.0, None),
] + [("v4-flash", FLASH, T, "uniform", 0.0, None) for T in (1, 7, 128, 1000, 4096)] + [
    ("v4-flash zipf masked", FLASH, 512, "zipf", 0.1, None),
]


def main(out_path: str) -> None:
    rows, kernels = [], {}
    for name, shape, T, routing, mask, clamp in CASES:
        key = (tuple(shape.items()), clamp)
        if key not in kernels:
            w = make_weights(shape["E"], shape["H"], shape["I"], "cuda", seed=7)
            kernels[key] = (MegaMoEKernel(shape["E"], shape["K"], shape["H"], shape["I"], 4096,
                                          prepare_weights(*w), clamp=clamp), w)
        k, w = kernels[key]
        x, xs, idx, tw = make_inputs(T, shape["E"], shape["K"], shape["H"], "cuda", seed=T, routing=routing,
                                     mask_frac=mask)
        k.forget_pool_rows()  # rows of earlier calls stay in the pool
        y = k(x, xs, idx, tw)
        k.check()
        row = {"case": name, "tokens": T, "shape": shape}
        ex = reference_exact(x, xs, idx, tw, *w, clamp=clamp)
        row["kernel_vs_exact_math"] = compare(y, ex)
        for mma in ("exact", "h200_wgmma"):
            t0 = time.time()
            ref, l2_in = reference_sm90(x, xs, idx, tw, *w, clamp=clamp, return_l2_input=True, mma=mma,
                                       block_m=k.last_design.block_m)
            c = compare(y, ref)
            c["bitwise_equal"] = (y.view(torch.int16) == ref.view(torch.int16)).double().mean().item() if y.numel() else 1.0
            c["l2_pool"] = l2_pool_agreement(k, l2_in)
            c["ref_vs_exact_math"] = compare(ref, ex)["rel_l2"]
            c["ref_seconds"] = round(time.time() - t0, 2)
            row[mma] = c
        rows.append(row)
        h = row["h200_wgmma"]
        print(f"{name:22s} T={T:5d}  exact: rel {row['exact']['rel_l2']:.2e} off {row['exact']['frac_off_1pct']:.2e} "
              f"pool {row['exact']['l2_pool']['bytes_equal']:.5f} | h200: rel {h['rel_l2']:.2e} "
              f"off {h['frac_off_1pct']:.2e} bitwise {h['bitwise_equal']:.5f} pool {h['l2_pool']['bytes_equal']:.6f} "
              f"({h['ref_seconds']} s)", flush=True)
        with open(out_path, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "build": library_path().parent.name, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
