"""Host cost of an eager call, and the back-to-back times of eager calls and CUDA-graph replays,
of the SM90 kernel (EP1, V4-Flash shape) at 1, 16, 64 and 1024 tokens; JSON per token count.

``host_us``: perf_counter around 50 eager calls with no synchronization inside (the Python,
checks and launch a call costs the CPU), median of 3; ``steady_us`` / ``steady50_us``: one CUDA
event pair around 10 / 50 back-to-back calls (median of 5 / 3 rounds); ``single_us``: one call
from an idle GPU (median of 20); ``kernel_us``: the kernel's CUPTI duration (median of 10);
``graph_us`` / ``graph50_us``: the same back to back for :meth:`MegaMoEKernel.capture` replays
(only where the runtime on ``PYTHONPATH`` has ``capture``: the script also times older trees),
and whether a replay's output is bitwise the eager call's. The twenty-sixth session ran it on
the runtime before and after its host-path change (``benchmarks/results/kernel_host_ab_h200.json``).

Usage (GPU): python benchmarks/device/host_overhead.py OUT.json [LABEL] [--tokens 1,16,64,1024]
"""
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from megamoe.errors import OneLineArgumentParser
from megamoe.kernel.timing import require_sm90_gpu, token_counts
from megamoe.outputs import check_output_path

E, K, H, I = 256, 6, 4096, 2048


def main() -> int:
    ap = OneLineArgumentParser(description="Host cost, back-to-back and CUDA-graph times (see the module docstring)")
    ap.add_argument("out", type=Path, help="JSON file to write")
    ap.add_argument("label", nargs="?", default="", help="printed before each row (e.g. old / new)")
    ap.add_argument("--tokens", default="1,16,64,1024", help="comma-separated token counts (default 1,16,64,1024)")
    a = ap.parse_args()
    with ap.input_errors():
        tokens = token_counts(a.tokens)
        check_output_path("out", a.out)
    require_sm90_gpu(ap)
    from megamoe.kernel import MegaMoEKernel, prepare_weights
    import torch

    from megamoe.kernel.check import make_inputs, make_weights
    from megamoe.kernel.timing import cuda_steady_us, cuda_times_us, median_kernel_us

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from kernel_bench import (
        host_us,  # perf_counter around calls, no synchronization inside
    )

    k = MegaMoEKernel(E, K, H, I, max(8192, max(tokens)), prepare_weights(*make_weights(E, H, I, "cuda", seed=11)))
    res = {}
    for T in tokens:
        x, xs, idx, tw = make_inputs(T, E, K, H, "cuda", seed=100 + T)

        def f(x=x, xs=xs, idx=idx, tw=tw):
            return k(x, xs, idx, tw)

        f()
        k.check()
        r = {"host_us": statistics.median(host_us(f, 50) for _ in range(3)), "steady_us": statistics.median(cuda_steady_us(f, 10, rounds=5)),
             "steady50_us": statistics.median(cuda_steady_us(f, 50, rounds=3)),
             "single_us": statistics.median(cuda_times_us(f, 20, 3)),
             "kernel_us": median_kernel_us(f, 10)}
        if hasattr(k, "capture"):  # runtimes from the twenty-sixth session on
            g = k.capture(T)
            g.fill(x, xs, idx, tw)
            y = g.replay()
            g.check()
            r["graph_us"] = statistics.median(cuda_steady_us(g.replay, 10, rounds=5))
            r["graph50_us"] = statistics.median(cuda_steady_us(g.replay, 50, rounds=3))
            r["graph_bitwise"] = bool(torch.equal(y.view(torch.int16), f().view(torch.int16)))
        k.check()
        res[T] = r
        print(a.label, T, {n: round(v, 1) if isinstance(v, float) else v for n, v in r.items()}, flush=True)
        a.out.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
