"""Interleaved A/B of two SM90 kernel builds in one process (GPU).

This tree's build against another library file (e.g. an older commit's build carried as
``out/ab_old/build/kernel/<hash>/libmegamoe_sm90.so``). Same weights and inputs for both,
V4-Flash shape, EP1. The calls alternate in rounds, in ABBA order, so that a clock drift
between rounds cancels. (Sequential runs of one call differed by up to 12% at 64 tokens in
the thirteenth session: benchmarks/NOTES_kernel.md.) Each build's time in a round is its
steady-state time per call: five calls back to back between one event pair
(``cuda_steady_us``), so the host's work before each launch is not in it (until the fifteenth
session: the median of five single calls from an idle GPU, which include 68-123 us of it).

Crossover (the default): two kernel objects, each with its own buffers, and each round runs
both builds on both objects (ABBA over ``new@0, old@1, new@1, old@0``). The per-round ratio
new / old is ``sqrt(new@0 * new@1 / (old@0 * old@1))``, so the objects' own difference
cancels (:func:`megamoe.kernel.timing.crossover_ratios`): in session 20 the object that ran
this tree's build was 2-4% slower at 1024-4096 tokens whichever build it ran, and a plain
paired ratio carried that bias (benchmarks/NOTES_kernel.md). The objects' ratio is reported
too. With ``--old-stages`` the old build needs objects of its own stage count, so the run is
the plain paired design (new on one object, old on the other).

Per token count it reports: the median over rounds of the per-round ratio new / old, its
range, each build's median time, and whether the outputs are bitwise equal. The old library must share this tree's ``Params`` layout, or a leading part of it (an
older build, to which fields were only appended since: the sizes are checked); it launches with
this tree's design numbers, except for the stage counts that ``--old-stages`` gives per
block_m (for an old build whose stages have another size: its launcher computes its own
shared memory from them).

``--stale-pools`` fills both kernel objects' pool data buffers (FP8 rows, UE8M0 bytes, FP32
scales: ``MegaMoEKernel.scramble_pool_data``) with seeded random bytes after each token count's
warm-up call.
A call writes only its valid pool rows, so the rows past a block's valid ones then hold what
reused, never-written memory may hold (NaN, 2^100) -- as in the trace runs, whose kernel objects
got memory freed by earlier ones. Without it the pools hold what their allocation gave: fresh
memory for the first block_m, then memory the caching allocator reuses when a token count
changes the block_m (session 23: v8.2 took 0.971x v8.1's time at 4096 tokens so).

``--kernel-time`` times each build by its kernel's own GPU durations (CUPTI through
``torch.profiler``, the median of five calls: ``megamoe.kernel.timing.median_kernel_us``)
instead of five calls back to back between one event pair. The eager 1-token call is bound by
the host's ~64 us per launch, above the kernel's ~54-56 us, so the default timing cannot see a
1-token kernel change (sessions 28-29: benchmarks/NOTES_kernel.md).

``--new-fault BITS`` launches this tree's build with ``fault_inject`` timing bits set (those
``csrc/megamoe/params.h`` defines: 2 no MMA, 8 no weight loads (only with 2: the decode would index
its table with the stage's stale fold-table offsets, a misaligned-address fault in sessions 30 and
54), 64 no token-tile loads, 128 no token-scale loads, 32 the profile instance; a part switched off
leaves wrong outputs, only the ratio counts). With this tree's own library as OLD_LIB it measures what that part costs. A
probe build with bits of its own runs its own copy of this script.

Usage: python benchmarks/device/ab_interleaved.py OLD_LIB OUT.json [tokens, default
64,1024,4096,8192] [rounds, default 12] [--old-stages 16:16,32:15,64:11,128:7] [--new-fault BITS]
[--stale-pools] [--kernel-time]
"""
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, ".")
import torch

from megamoe import design_sm90
from megamoe.errors import OneLineArgumentParser
from megamoe.kernel import KernelError, MegaMoEKernel, prepare_weights
from megamoe.kernel.check import make_inputs, make_weights
from megamoe.kernel.runtime import load_library_file
from megamoe.kernel.timing import (
    alternating_rounds,
    crossover_ratios,
    cuda_steady_us,
    median_kernel_us,
    require_sm90_gpu,
    token_counts,
)
from megamoe.outputs import check_output_path

E, K, H, I = 256, 6, 4096, 2048
TIMING_BITS = 2 | 8 | 32 | 64 | 128  # fault_inject bits that only change timing (params.h); 1 is the timeout test


def main() -> int:
    ap = OneLineArgumentParser(description="Interleaved A/B of two SM90 kernel builds (see the module docstring)")
    ap.add_argument("old_lib", type=Path, help="the other build's libmegamoe_sm90.so")
    ap.add_argument("out", type=Path, help="JSON file to write")
    ap.add_argument("tokens", nargs="?", default="64,1024,4096,8192", help="comma-separated token counts")
    ap.add_argument("rounds", nargs="?", type=int, default=12, help="ABBA rounds (default 12)")
    ap.add_argument("--old-stages", default="", metavar="BM:S,...",
                    help="the old build's stage count per block_m (default: this tree's design)")
    ap.add_argument("--new-fault", type=int, default=0, metavar="BITS",
                    help="fault_inject bits for this tree's build (timing experiments; default 0)")
    ap.add_argument("--stale-pools", action="store_true",
                    help="random bytes in the pools' never-written rows (see the module docstring)")
    ap.add_argument("--kernel-time", action="store_true",
                    help="time the kernel's own GPU durations (CUPTI) instead of back-to-back calls")
    a = ap.parse_args()
    with ap.input_errors():
        tokens = token_counts(a.tokens)
    if a.rounds < 2:
        ap.error(f"rounds: expected an integer >= 2, got {a.rounds}")
    if a.new_fault < 0 or a.new_fault & ~TIMING_BITS:
        ap.error(f"new-fault: expected a sum of the timing bits 2, 8, 32, 64, 128 (csrc/megamoe/params.h), "
                 f"got {a.new_fault}")
    if a.new_fault & 8 and not a.new_fault & 2:
        # without its weight loads the stage's fold-table offsets are stale, and the decode (on
        # unless bit 2) indexes the table with them: a misaligned-address fault, sessions 30 and 54
        # (also after a launch without bits)
        ap.error(f"new-fault: expected bit 8 (no weight loads) only with bit 2 (no MMA): the decode would "
                 f"index its table with stale offsets, got {a.new_fault}")
    if not a.old_lib.is_file():
        ap.error(f"old_lib: expected a built library file, got {str(a.old_lib)!r}")
    with ap.input_errors():
        check_output_path("out", a.out)
    try:
        pairs = [(int(k), int(v)) for k, v in (kv.split(":") for kv in a.old_stages.split(",") if kv)]
        old_stages = dict(pairs) if len({k for k, _ in pairs}) == len(pairs) else None  # no block_m twice
    except ValueError:
        old_stages = None
    if old_stages is None or not all(bm in design_sm90.BLOCK_MS and design_sm90.min_stages(bm) <= s <= design_sm90.MAX_STAGES
                                     for bm, s in old_stages.items()):
        ap.error("old-stages: expected block_m:stages pairs such as 128:7 (each block_m once, one of 16, 32, 64, "
                 f"128; stages in [{design_sm90.min_stages(16)}, {design_sm90.MAX_STAGES}] at block_m 16-64 and "
                 f"[{design_sm90.min_stages(128)}, {design_sm90.MAX_STAGES}] at "
                 "128, one per issuing producer warp at least, and no more than the old build's shared memory "
                 f"holds: its launcher refuses those), got {a.old_stages!r}")
    require_sm90_gpu(ap)
    old_lib, out, rounds = str(a.old_lib), a.out, a.rounds
    try:
        lib = load_library_file(old_lib, older_prefix=True)  # fields appended since are ignored by it
    except (OSError, KernelError) as e:
        ap.error(f"old_lib: expected a loadable SM90 kernel library, got {old_lib!r} ({e})")
    w = prepare_weights(*make_weights(E, H, I, "cuda", seed=11))
    new = MegaMoEKernel(E, K, H, I, max(tokens), w)  # object 0
    new.fault_inject = a.new_fault
    olds = {}  # block_m -> the old build's kernel object (its own stage count)

    def old_for(bm):
        if bm not in olds:
            olds[bm] = MegaMoEKernel(E, K, H, I, max(tokens), w, num_stages=old_stages.get(bm))
            olds[bm].lib = lib
        return olds[bm]

    crossover = not old_stages
    res = {"old_lib": old_lib, "rounds": rounds, "old_stages": old_stages, "new_fault": a.new_fault,
           "stale_pools": a.stale_pools, "timing": "kernel (CUPTI)" if a.kernel_time else "steady (5 calls)",
           "design": "crossover" if crossover else "paired", "tokens": {}}
    new_lib = new.lib
    other = MegaMoEKernel(E, K, H, I, max(tokens), w) if crossover else None  # object 1 (its own buffers)

    def on(build, k, args):
        """Run one build on kernel object k (the fault bits go with this tree's build)."""
        k.lib, k.fault_inject = (new_lib, a.new_fault) if build == "new" else (lib, 0)
        return k(*args)

    def measure(fn):
        if a.kernel_time:
            return median_kernel_us(fn)
        return cuda_steady_us(fn, 5, rounds=1)[0]

    for T in tokens:
        args = make_inputs(T, E, K, H, "cuda", seed=3)
        if crossover:
            ys = [on("new", new, args).clone(), on("old", other, args).clone()]  # warm-up, outputs
            new.check()
            other.check()
            if a.stale_pools:
                new.scramble_pool_data(seed=5)
                other.scramble_pool_data(seed=6)
            objs = {"0": new, "1": other}
            fns = {f"{b}@{o}": (lambda b=b, k=objs[o], a=args: on(b, k, a)) for b, o in
                   (("new", "0"), ("old", "1"), ("new", "1"), ("old", "0"))}
            per_round = alternating_rounds(fns, rounds, measure,
                                           after_round=lambda: (new.check(), other.check()))
            if a.stale_pools:  # the valid rows' outputs must not see the stale ones
                extra_eq = {"stale_outputs_equal": bool(torch.equal(on("new", new, args), ys[0]) and
                                                         torch.equal(on("old", other, args), ys[1]))}
            ratios, obj_ratios = crossover_ratios(per_round)
            times = {b: [(t[f"{b}@0"] * t[f"{b}@1"]) ** 0.5 for t in per_round] for b in ("new", "old")}
            design = new.last_design
            old_design = other.last_design
            extra = {"object_ratio_median": statistics.median(obj_ratios), "rounds_raw": per_round,
                     **(extra_eq if a.stale_pools else {})}
        else:
            ys = [new(*args).clone()]  # warm-up, outputs
            new.check()
            old = old_for(new.last_design.block_m)
            ys.append(old(*args).clone())
            old.check()
            if a.stale_pools:
                new.scramble_pool_data(seed=5)
                old.scramble_pool_data(seed=6)
            per_round = alternating_rounds({"new": lambda a=args: new(*a), "old": lambda a=args, k=old: k(*a)},
                                           rounds, measure,
                                           after_round=lambda k=old: (new.check(), k.check()))
            times = {name: [t[name] for t in per_round] for name in ("new", "old")}
            ratios = [a / b for a, b in zip(times["new"], times["old"])]
            design, old_design, extra = new.last_design, old.last_design, {}
        row = {"ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
               "new_us": statistics.median(times["new"]), "old_us": statistics.median(times["old"]),
               "bitwise_equal": bool(torch.equal(ys[0], ys[1])), "block_m": design.block_m,
               "stages": design.num_stages, "old_stages": old_design.num_stages, **times, **extra}
        res["tokens"][T] = row
        objects = f"  objects 0/1 {extra['object_ratio_median']:.3f}" if crossover else ""
        print(f"T={T:5d} bm={row['block_m']:3d} stages {row['stages']}/{row['old_stages']} "
              f"new {row['new_us']:9.1f} us  old {row['old_us']:9.1f} us  "
              f"new/old {row['ratio_median']:.3f} (rounds {row['ratio_min']:.3f}..{row['ratio_max']:.3f})  "
              f"outputs {'equal' if row['bitwise_equal'] else 'DIFFER'}{objects}"
              + ("" if "stale_outputs_equal" not in row else
                 f"  after stale pools {'equal' if row['stale_outputs_equal'] else 'DIFFER'}"), flush=True)
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
