"""Timing experiment: switch off parts of the kernel (fault_inject bits) to see what bounds a stage.
bit 2: consumers skip the MMA (decode, WGMMA, promotion); bit 8: producer skips the weight loads;
bit 64: producer skips the token-tile loads; bit 128: producer skips the token-scale loads.
(Bits 4 and 16 -- no decode, no promotion -- were removed in v6.2: their runtime checks cost the
matrix loop a branch and register copies per k32 step; benchmarks/NOTES_kernel.md.)
Outputs are wrong when a bit is set; only the times matter."""
import sys, statistics, json
import torch
sys.path.insert(0, ".")
from megamoe.kernel import MegaMoEKernel, prepare_weights
from megamoe.kernel.check import make_weights, make_inputs, reference_sm90, compare
E, K, H, I = 256, 6, 4096, 2048
w = make_weights(E, H, I, "cuda", seed=11)
k = MegaMoEKernel(E, K, H, I, 8192, prepare_weights(*w))
out = {}
for T in [int(t) for t in (sys.argv[2] if len(sys.argv) > 2 else "1,64,4096,8192").split(",")]:
    x, xs, idx, tw = make_inputs(T, E, K, H, "cuda", seed=3)
    y = k(x, xs, idx, tw); k.check()
    if T == 1:
        print("check T=1", compare(y, reference_sm90(x, xs, idx, tw, *w, block_m=k.last_design.block_m)), flush=True)
    for flags in (0, 2, 10, 202):  # (8 alone faults on a misaligned address: sessions 30 and 54)
        k.fault_inject = flags
        ts = []
        for r in range(6):
            a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
            a.record(); k(x, xs, idx, tw); b.record(); b.synchronize(); ts.append(a.elapsed_time(b) * 1e3)
        k.check()
        out[f"T={T} flags={flags}"] = statistics.median(ts[1:])
        print(f"T={T:5d} flags={flags:2d} {statistics.median(ts[1:]):9.1f} us", flush=True)
    k.fault_inject = 0
json.dump(out, open(sys.argv[1], "w"), indent=1)
