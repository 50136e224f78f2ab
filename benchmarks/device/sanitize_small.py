"""Two small launches of the SM90 kernel for compute-sanitizer (memcheck / racecheck / synccheck):
8 experts, and 64 experts in one wave (the wide instance) with a masked slot.
Usage (GPU): compute-sanitizer --tool memcheck python3 benchmarks/device/sanitize_small.py"""
import sys

sys.path.insert(0, ".")
from megamoe.kernel import MegaMoEKernel, prepare_weights  # noqa: E402
from megamoe.kernel.check import REL_L2_TOL, compare, make_inputs, make_weights, reference_sm90  # noqa: E402

E, K, H, I, T = 8, 2, 256, 128, 5
w = make_weights(E, H, I, "cuda", seed=7)
k = MegaMoEKernel(E, K, H, I, T, prepare_weights(*w), num_sms=4, timeout_s=60.0)
x, xs, idx, tw = make_inputs(T, E, K, H, "cuda", seed=3)
y = k(x, xs, idx, tw)
k.check()
c = compare(y, reference_sm90(x, xs, idx, tw, *w, block_m=k.last_design.block_m))
print("sanitize_small", c, "OK" if c["rel_l2"] <= REL_L2_TOL and c["nan"] == 0 else "FAIL")

# The wide instance (block_m 16, a wave of more than 32 experts: design_sm90.wide_walk; its
# combine loads every slot's row at once, kernel v8.8), with masked slots.
from megamoe.design_sm90 import wide_walk  # noqa: E402

E, K, T = 64, 4, 3
w = make_weights(E, H, I, "cuda", seed=8)
k = MegaMoEKernel(E, K, H, I, T, prepare_weights(*w), num_sms=4, experts_per_wave=E, timeout_s=60.0)
x, xs, idx, tw = make_inputs(T, E, K, H, "cuda", seed=4)
idx[0, 1] = -1
y = k(x, xs, idx, tw)
k.check()
c = compare(y, reference_sm90(x, xs, idx, tw, *w, block_m=k.last_design.block_m))
ok = c["rel_l2"] <= REL_L2_TOL and c["nan"] == 0 and wide_walk(k.last_design.block_m, k.last_design.experts_per_wave)
print("sanitize_small wide", c, "OK" if ok else "FAIL")
