"""How the SM90 kernel's few-token time depends on the SMs it runs on (V4-Flash, EP1): does a
call pay for the blocks' rounds per SM (wave quantization), for the SM's share between two CTAs,
or for the weights' HBM traffic? At 1 token the 192 L1 blocks (6 experts x 32 N blocks) and the
192 L2 blocks fall on 132 SMs as one round on every SM and a second on 60; on 96 SMs every SM
takes two, on 66 three (benchmarks/NOTES_kernel.md, sessions 48-49).

Each SM count is a kernel object of its own (``MegaMoEKernel(num_sms=n)``, the plan made for n
SMs). An entry ``n`` launches its ``n x ctas_per_sm`` CTAs as usual, and the GPU's block
scheduler places them: one per SM first, so a two-CTA plan for n < 132 SMs does *not* run on n
SMs (session 48's 66-SM two-CTA row ran its 132 CTAs one per SM). An entry ``ng`` runs every call
inside a CUDA green context of n SMs (``torch.cuda.green_contexts``; on SM90 a partition is a
multiple of 8 SMs), which confines the CTAs to those SMs. Each (tokens, entry) makes one traced
call first and records the distinct SM ids (``%smid``) its CTAs ran on, so the placement is
checked, not assumed. Then in each of ``ROUNDS`` rounds (ABBA order) every entry's median CUPTI
kernel time over five calls. Outputs are checked bitwise equal across the entries (each block's
sums do not depend on where it runs); each token count's routing (``topk_idx``) is saved with
its times, so the model can be asked the same calls (``benchmarks/sm_rounds_model.py``).

Usage (GPU): python benchmarks/device/sm_rounds_probe.py OUT.json [TOKENS] [ENTRIES]
(defaults ``1,2`` and ``132,120,96,66``; the first entry is the baseline of the ratios; an SM
count above the GPU's is refused)."""
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


def parse_entry(text: str, have: int) -> tuple[int, bool]:
    """``"96"`` -> (96, False), ``"96g"`` -> (96, True); exits on a bad entry."""
    green = text.endswith("g")
    digits = text[:-1] if green else text
    if not digits.isdigit() or not 1 <= int(digits) <= have:
        sys.exit(f"ENTRIES: expected SM counts in [1, {have}], each optionally followed by g, got {text!r}")
    return int(digits), green


def in_context(ctx, fn):
    """``fn`` run inside green context ``ctx`` (None: as it is)."""
    if ctx is None:
        return fn

    def run():
        ctx.set_context()
        try:
            return fn()
        finally:
            ctx.pop_context()
    return run


def main(out_path: str, tokens: list[int], entries: list[str]) -> None:
    have = torch.cuda.get_device_properties(0).multi_processor_count
    parsed = {e: parse_entry(e, have) for e in entries}
    w = prepare_weights(*make_weights(E, H, I, "cuda", seed=11))
    kern = {e: MegaMoEKernel(E, K, H, I, 8192, w, num_sms=n) for e, (n, _) in parsed.items()}
    ctxs = {}
    for e, (n, green) in parsed.items():
        if green:
            from torch.cuda.green_contexts import GreenContext
            ctxs[e] = GreenContext.create(num_sms=n, device_id=torch.cuda.current_device())
        else:
            ctxs[e] = None
    out = {"meta": {"device": torch.cuda.get_device_name(), "sms_on_gpu": have, "torch": torch.__version__,
                    "build": library_path("sm_90a").parent.name, "rounds": ROUNDS,
                    "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                    "timing": "median CUPTI kernel time of five calls per object per round, ABBA rounds",
                    "entries": {e: {"num_sms": n, "green_context": g} for e, (n, g) in parsed.items()}},
           "tokens": {}}
    base = entries[0]
    for T in tokens:
        args = make_inputs(T, E, K, H, "cuda", seed=100 + T)
        ys, placed = {}, {}
        for e in entries:
            y, recs = in_context(ctxs[e], lambda k=kern[e]: k(*args, trace=True))()
            ys[e] = y.clone()
            placed[e] = {"smids": len({r["sm"] for r in recs}), "ctas": len({r["cta"] for r in recs})}
        for k in kern.values():
            k.check()
        ref = ys[base].view(torch.int16)
        equal = all(torch.equal(ys[e].view(torch.int16), ref) for e in entries)
        rounds = alternating_rounds({e: in_context(ctxs[e], lambda k=kern[e], a=args: k(*a)) for e in entries},
                                    ROUNDS, lambda fn: median_kernel_us(fn, 5))
        row = {}
        for e in entries:
            d = kern[e].last_design
            ratios = [r[e] / r[base] for r in rounds]
            row[e] = {"us_median": statistics.median(r[e] for r in rounds), "ratio_to_first_median":
                      statistics.median(ratios), "ratio_range": [min(ratios), max(ratios)],
                      "block_m": d.block_m, "ctas": d.num_ctas, "experts_per_wave": d.experts_per_wave,
                      "traced_call_smids": placed[e]["smids"], "traced_call_ctas": placed[e]["ctas"]}
            print(f"T={T:3d} {e:>5} ({d.num_ctas} CTAs on {placed[e]['smids']} SMs, block_m {d.block_m}) "
                  f"{row[e]['us_median']:7.1f} us  x{row[e]['ratio_to_first_median']:.3f} of {base} "
                  f"(rounds {min(ratios):.3f}..{max(ratios):.3f})", flush=True)
        out["tokens"][str(T)] = {"outputs_bitwise_equal": equal, "sms": row,
                                 "topk_idx": args[2].cpu().tolist()}  # the routing, for the model
        print(f"T={T}: outputs bitwise equal across entries: {equal}", flush=True)
        with open(out_path, "w") as f:  # after every token count: a later failure keeps the rest
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], [int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "1,2").split(",")],
         (sys.argv[3] if len(sys.argv) > 3 else "132,120,96,66").split(","))
