"""One small launch of the SM90 kernel for compute-sanitizer (memcheck / racecheck / synccheck).
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
