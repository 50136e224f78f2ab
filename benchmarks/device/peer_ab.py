"""This kernel against FlagGems' fused MoE, interleaved, on one GPU (EP1, V4-Flash shape).

``benchmarks/kernel_bench.py`` times each implementation once per token count, one after
the other; between two of its runs FlagGems' time moved by 3-98% at one size (its 16-token
time was 670.8 us in session 19's run and 1327.0 us in session 20's, benchmarks/NOTES_kernel.md),
and a kernel object's own buffers can make it a few percent slower or faster than another
object of the same build (session 20). Here both run in the same rounds: per token count,
``rounds`` ABBA rounds over this kernel on two kernel objects (each with its own buffers) and
FlagGems (:class:`FlagGemsFP8` of ``kernel_bench.py``: FP8 weights with 128 x 128 block
scales, the same routing and top-k weights, the input as BF16). Each time is the steady-state
time per call (``--calls``, default five, back to back between one event pair,
:func:`megamoe.kernel.timing.cuda_steady_us`; ``kernel_bench.py`` times ten by default); a round's ratio is ``sqrt(ours@0 * ours@1) /
flaggems``, below 1 when this kernel is faster. Reports per token count the median ratio
over the rounds, its range and each implementation's median time; writes them as JSON.

With ``--graph`` every implementation's call is first captured as a CUDA graph (ours:
:meth:`MegaMoEKernel.capture`; FlagGems: :func:`megamoe.kernel.timing.cuda_graph_replay`) and
the rounds time replays: no host work per call, as a serving loop replays small batches. Each
graph's output is checked bit for bit against an eager call first.

Usage: python benchmarks/device/peer_ab.py OUT.json [tokens, default 1,16,64,256,1024,4096,8192]
[rounds, default 8] [--graph] [--calls N, default 5]. Needs a CUDA GPU of compute capability 9.0 and ``flag_gems`` importable.
"""
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from megamoe.errors import OneLineArgumentParser
from megamoe.kernel import MegaMoEKernel, prepare_weights
from megamoe.kernel.timing import (
    alternating_rounds,
    cuda_steady_us,
    int_at_least,
    token_counts,
)


def main() -> int:
    ap = OneLineArgumentParser(description="This kernel against FlagGems, interleaved (see the module docstring)")
    ap.add_argument("out", type=Path, help="JSON file to write")
    ap.add_argument("tokens", nargs="?", default="1,16,64,256,1024,4096,8192", help="comma-separated token counts")
    ap.add_argument("rounds", nargs="?", default="8", help="ABBA rounds per token count (default 8)")
    ap.add_argument("--graph", action="store_true", help="time CUDA-graph replays of every implementation's call")
    ap.add_argument("--calls", default="5", help="calls back to back per timing (default 5)")
    a = ap.parse_args()
    with ap.input_errors():
        tokens = token_counts(a.tokens)
        rounds = int_at_least(a.rounds, "rounds", 2)
        calls = int_at_least(a.calls, "calls", 1)
    from kernel_bench import (  # the FP8 peer's shape is the run's
        E,
        H,
        I,
        K,
        dequantized_bf16,
        flaggems_peer,
    )
    fg = flaggems_peer(ap, a.out)
    import flag_gems
    import torch

    from megamoe.kernel.build import library_path
    from megamoe.kernel.check import make_inputs, make_weights
    from megamoe.kernel.timing import cuda_graph_replay

    w = prepare_weights(*make_weights(E, H, I, "cuda", seed=11))
    objs = [MegaMoEKernel(E, K, H, I, max(tokens), w) for _ in range(2)]
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "flaggems": flag_gems.__version__,
           "build": library_path("sm_90a").parent.name, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "shape": {"E": E, "K": K, "H": H, "I": I}, "rounds": rounds,
           "timing": ("CUDA-graph replays, " if a.graph else "")
           + f"steady state per call ({calls} calls back to back between one event pair), ABBA rounds over "
             "ours@0, ours@1, flaggems; ratio = sqrt(ours@0 * ours@1) / flaggems per round",
           "graph": a.graph, "tokens": {}}
    for T in tokens:
        x, xs, idx, tw = make_inputs(T, E, K, H, "cuda", seed=100 + T)
        xb = dequantized_bf16(x, xs)
        call, fcall = (x, xs, idx, tw), (xb, idx, tw)
        fns = {"ours@0": lambda c=call: objs[0](*c), "ours@1": lambda c=call: objs[1](*c),
               "flaggems": lambda c=fcall: fg(*c)}
        for fn in fns.values():  # warm-up (FlagGems' Triton compile, our first launch)
            fn()
        same = None
        if a.graph:  # each call as a CUDA graph, checked bit for bit against an eager call
            graphs = [k.capture(T) for k in objs]
            for g in graphs:
                g.fill(*call)
            fg_replay, fg_out = cuda_graph_replay(fns["flaggems"])
            fg_replay()
            outs = [g.replay() for g in graphs] + [fg_out]
            eager = [fns["ours@0"](), fns["ours@1"](), fns["flaggems"]()]
            same = [bool(torch.equal(o.view(torch.int16), e.view(torch.int16))) for o, e in zip(outs, eager)]
            fns = {"ours@0": graphs[0].replay, "ours@1": graphs[1].replay, "flaggems": fg_replay}
        per_round = alternating_rounds(fns, rounds, lambda fn: cuda_steady_us(fn, calls, rounds=1)[0],
                                       after_round=lambda: [k.check() for k in objs])
        ours = [(r["ours@0"] * r["ours@1"]) ** 0.5 for r in per_round]
        ratios = [o / r["flaggems"] for o, r in zip(ours, per_round)]
        row = {"ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
               "ours_us": statistics.median(ours), "flaggems_us": statistics.median(r["flaggems"] for r in per_round),
               "block_m": objs[0].last_design.block_m, "rounds_raw": per_round,
               **({"graph_bitwise_equal_eager": same} if same is not None else {})}
        res["tokens"][T] = row
        print(f"T={T:5d} bm={row['block_m']:3d} ours {row['ours_us']:9.1f} us  flaggems {row['flaggems_us']:9.1f} us  "
              f"ours/flaggems {row['ratio_median']:.3f} (rounds {row['ratio_min']:.3f}..{row['ratio_max']:.3f})"
              + (f" graphs bitwise eager {same}" if same is not None else ""), flush=True)
        a.out.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
