"""This project's SM90 (H100/H200) kernel design: the numbers the kernel in ``csrc/`` uses.

``megamoe.plan`` imports these functions beside the SM100 reference design (DeepGEMM);
the kernel receives every number as a launch parameter (``csrc/megamoe/params.h``) and never
re-derives it. Shared-memory formulas mirror ``csrc/megamoe/kernel_sm90.cu`` exactly
(a GPU-free test compares them with the compiled library's ``megamoe_sm90_smem_bytes``).

Design, in one paragraph: one persistent CTA per SM (the pipeline ring needs more than half
of the 227 KB of shared memory, so two CTAs would halve the stages; one CTA also keeps the
dispatch warps and the grid sync simple) except at block_m 16 and one rank from 128-expert
one-CTA waves down (3-682 tokens on V4-Flash; the wide walk too since kernel v9.5), where two CTAs share each SM (kernel v9.2,
:func:`ctas_per_sm`: that instance needs 76
registers, and four consumer warps per scheduler hide its K loop's latency: 0.89x the time at
64-512 tokens on the H200), 512 threads in three warp-specialized roles —
dispatch (warps 0-3), producer (warps 4-7: one lane issues the TMA loads of each stage, a
tensor-map load of the activation tile and bulk copies of the packed E2M1 weight tile and
the scales, completing the stage's mbarrier by their bytes) and consumer (warps 8-15, two
warpgroups: E2M1 -> E4M3 decode straight into the registers of FP8 WGMMA ``m64n{block_m}k32``
with the weights as the register A operand ("swap AB", 64 weight rows per warpgroup), two
WGMMAs per 64-K group and one FP32 promotion per group with the token's folded scale, then the
epilogues). ``setmaxnreg`` moves registers from the dispatch and
producer warpgroups to the consumers. Block tile ``128 weight rows x block_m tokens x 128``;
the block order is DeepGEMM's MegaMoEScheduler rule.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, asdict

import numpy as np

from .errors import InputError, is_int, require

#: Output columns per block (both GEMMs). L1 blocks cover 64 gate + 64 up rows.
BLOCK_N = 128
#: K depth of one pipeline stage.
BLOCK_K = 128
#: Threads per CTA and warps per role.
THREADS = 512
DISPATCH_WARPS = 4
PRODUCER_WARPS = 4
CONSUMER_WARPS = 8
#: One CTA per SM (see module docstring), except where :func:`ctas_per_sm` gives two.
CTAS_PER_SM = 1
#: Registers per thread of the dispatch, producer and consumer warpgroups at two CTAs per SM (kernel
#: v9.2; ``kRegsPair*`` in ``csrc/megamoe/kernel_sm90.cu``, ``megamoe_sm90_role_registers_at``): 64
#: per thread at launch (``__maxnreg__``), 32768 per CTA. 48 / 48 / 80 since kernel v9.6: the
#: dispatch warps' pull spilled on 32 (a one-item pull took 5-9 us at two CTAs against 3.2 at
#: one); measured on the H200 against 32 / 64 / 80 (CUPTI kernel time, crossover A/B, 8 rounds,
#: outputs bitwise): 0.978 / 0.981 / 0.990 / 0.990 / 0.997 / 0.997 at 3 / 6 / 12 / 16 / 64 / 256
#: tokens; 40 / 56 / 80 0.985 at 3 tokens, 1.003-1.004 at 64-256 (benchmarks/NOTES_kernel.md,
#: session 40). Session 37 had chosen 32 / 64 / 80 over 48 / 48 / 80 (then 0.6% slower at 64-256)
#: and 40 / 40 / 88 (most of the gain lost to the producer's spills) on kernel v9.2.
PAIR_REGS = (48, 48, 80)
#: Stages per CTA at two CTAs per SM. Nine fit (:func:`pair_smem_limit`); measured on the H200
#: (CUPTI kernel time against one CTA per SM with 16 stages, session 37): 9 stages 0.947, 8 stages
#: 0.917, 7 0.900-0.932, 6 0.900-0.933 at 16-512 tokens (8 and 7 alike, 6 slower by 0.5-1%).
PAIR_STAGES = 8
#: Shared memory of one SM90 SM (H100 / H200: 228 KB, ``cudaDevAttrMaxSharedMemoryPerMultiprocessor``)
#: and what the driver reserves per CTA (``cudaDevAttrReservedSharedMemoryPerBlock``).
SMEM_PER_SM_SM90 = 233472
SMEM_RESERVED_PER_CTA = 1024
#: Supported block_m values (template instances of the kernel).
BLOCK_MS = (16, 32, 64, 128)
#: Producer warps that issue the ring's K blocks, round-robin, per block_m
#: (``Producer::NW`` in ``csrc/megamoe/kernel_sm90.cu``): four where one warp's ~110
#: instructions per K block paced the ring (block_m 16-64), two at block_m 128, where the
#: consumers pace it and idle producer warps only take their issue slots (kernel v6.3,
#: benchmarks/NOTES_kernel.md). The simulator's ``sm90_issue_kblock_ns`` is their combined
#: rate, fitted from traces.
PRODUCER_ISSUE_WARPS = {16: 4, 32: 4, 64: 4, 128: 2}
#: Registers per thread of each warpgroup (``setmaxnreg``): dispatch, producer, two consumer
#: warpgroups (``kRegs*`` in ``csrc/megamoe/kernel_sm90.cu``; 65536 per SM in all).
REGS_DISPATCH, REGS_PRODUCER, REGS_CONSUMER = 64, 64, 192
#: k32 WGMMAs a consumer warpgroup keeps in flight within a K block, per block_m
#: (``Sm90Tile::WGMMAS_IN_FLIGHT`` in ``csrc/megamoe/mma_sm90.cuh``): two per 64-K group, each
#: group with its own FP32 partial accumulator of ``block_m / 2`` registers per thread beside
#: the accumulator, in the consumers' 192 registers: both groups of a K block at once up to
#: block_m 64, one at a time at 128.
WGMMAS_IN_FLIGHT = {16: 4, 32: 4, 64: 4, 128: 2}
#: Token step of the consumers' WGMMA N per block_m, where it is finer than the block: the GEMM
#: runs "swap AB" (``csrc/megamoe/mma_sm90.cuh``: the tokens are WGMMA's N), so a block whose
#: valid rows fall short of block_m could issue ``wgmma.m64nNk32`` with N its valid rows rounded
#: up to this step, and skip the columns past them (both epilogues leave those tokens out).
#: Kernel v9.12 steps by 32 at block_m 128 (``Sm90Tile::WGMMA_N_STEP``, ``megamoe_sm90_wgmma_n_step``;
#: 0.822 / 0.928 / 0.904 of v9.11's kernel time at 2731 / 4096 / 8192 tokens on the H200, and its
#: block_m 128 SASS, as candidate TN2, 0.872 at 6144; benchmarks/NOTES_kernel.md session 52); v9.11 and earlier ran every block whole. The plan takes it as
#: ``RankPlan.wgmma_n_step`` and the simulator prices a block's K loop at its N (:func:`wgmma_n`).
WGMMA_N_STEP: dict[int, int] = {128: 32}
#: The WGMMA N steps a plan may ask for (``wgmma_n_step``): N is a multiple of 8 up to 128 tokens
#: (``wgmma.m64nNk32``'s N for E4M3; 128 is the largest block_m).
WGMMA_N_STEPS = tuple(range(8, 129, 8))
#: :data:`WGMMA_N_STEPS` in words, as an error says what it expected.
WGMMA_N_STEPS_SAID = "a multiple of 8 from 8 to 128"
#: Largest dynamic shared memory one block may opt into on SM90 (227 KB).
SMEM_LIMIT_SM90 = 232448
#: Most stages the kernel accepts.
MAX_STAGES = 16
#: Default stage count per block_m where fewer than fit ran faster (elsewhere: as many as fit, at
#: most :data:`MAX_STAGES`). Block_m 128: 5 of the 8 that fit the V4-Flash shape, through the L1
#: data cache the stages leave to the SM (asking for the largest shared-memory carve-out at 5 took
#: the gain back). On the H200, CUPTI kernel time, paired rounds, outputs bitwise: v9.12 at 5 stages
#: 0.973-0.981 of its time at 8 at 2731-8192 tokens (session 53); kernel v9.13 untraced 0.976 / 0.977
#: at 4096 / 8192, its trace overhead +2.0% / +1.7% at 5 stages (session 55: v9.12's +4.3-4.5% there
#: was its consumer's per-block slot atomic). 8 / 8 / 6 stages at block_m 16 / 32 / 64 read
#: 0.999-1.004 of 16 / 16 / 12: left at as many as fit (benchmarks/NOTES_kernel.md).
STAGES_DEFAULT: dict[int, int] = {128: 5}
#: Numerics the SM90 kernel implements (``megamoe.reference.Numerics.sm90_kernel()``): the
#: weights' per-32 scales folded per row into the E4M3 decode with the row's largest at 2^6
#: (``W_FOLD_K = "row"``, ``W_FOLD_TOP = 6``; ``megamoe.layouts.fold_e2m1_scales_for_sm90``),
#: applied once in the epilogue (kernel v6.5); the activations' per-32 scales folded per 64-K
#: group into their E4M3 values (``X_FOLD_K = 64``; ``megamoe.layouts.fold_e4m3_scales_for_sm90``:
#: by the dispatch warps as they pull a row into the L1 pool, by the L1 epilogue into the L2
#: pool, where one L1 N block makes exactly one 64-wide group per token), so two k32 WGMMAs
#: accumulate in the tensor core and each 64-K partial sum is promoted with one FFMA (kernel v7).
W_FOLD_K = "row"
W_FOLD_TOP = 6
X_FOLD_K = 64
#: The L1 GEMM's activation fold per block_m (``Numerics.sm90_kernel(block_m=...)``'s
#: ``x_fold_k``; the L2 GEMM's stays ``X_FOLD_K``): at block_m 128 the pulls fold each row per
#: 128-K group, the whole K block, and the block_m 128 K loop chains an L1 K block's four k32
#: WGMMAs into one partial promoted once (kernel v7.6; ``kL1Fold128BlockM`` in
#: ``csrc/megamoe/roles_shared.cuh``, ``megamoe_sm90_l1_x_fold_k``). The L2 input cannot fold
#: per 128: a 128-wide K block of it comes from two L1 blocks, each quantizing its own 64.
L1_X_FOLD_K = {16: 64, 32: 64, 64: 64, 128: 128}


#: The combine's slot loads in flight per thread, per block_m (kernel v8.0;
#: ``combine_slots`` in ``csrc/megamoe/roles_shared.cuh``, ``megamoe_sm90_combine_slots``):
#: from block_m 32 on a token's slots are loaded four at a time, at block_m 16 one at a time
#: (the batched loop in the same function costs the block_m 16 K loop 19 instructions, measured
#: +4..+7% at 64 / 256 tokens on the H200; benchmarks/NOTES_kernel.md). The H200's
#: ``combine_round_ns`` is fitted to the batched combine, ``combine_round_serial_ns`` to the
#: one-slot one (sim.calibrate; the model picks by instance since session 43).
COMBINE_SLOTS = {16: 1, 32: 4, 64: 4, 128: 4}
#: The combine's slot loads in flight per thread in the wide instance (:func:`wide_walk`; kernel
#: v8.8; ``kCombineSlotsWide`` in ``csrc/megamoe/roles_shared.cuh``,
#: ``megamoe_sm90_combine_slots_wide``): up to this many slots of a token loaded at once, with
#: their top-k indices (the rows of masked slots read and not added), one round trip per token.
#: Measured on the H200 against v8.7 (CUPTI kernel time, 8 crossover rounds): 0.982 / 0.987 /
#: 0.987 at 1 / 4 / 12 tokens, 1.000 at 16 (the same SASS there; benchmarks/NOTES_kernel.md,
#: session 33).
COMBINE_SLOTS_WIDE = 8

#: Whether the L1 epilogue's GPU-scope release of its arrival-mask bit is relayed to a dispatch
#: lane (idle once it has pulled every row) instead of made by a consumer thread, per block_m
#: (kernel v8.1; ``relay_release`` in ``csrc/megamoe/kernel_sm90.cu``,
#: ``megamoe_sm90_relay_release``): the consumer hands the request over through a 16-slot
#: mbarrier ring in shared memory and goes on to its next block without waiting for the
#: release's fence. Measured on the H200 against v8.0 (crossover A/B), with the relay at every
#: block_m: 0.961-0.971x the time at 16-256 tokens (block_m 16), 1.002 at 1024 (32), 1.010-1.011
#: at 4096 / 8192 (128); so only at block_m 16, where the kept build reads 0.960-0.969 at 16-512
#: tokens and the other instances' SASS is v8.0's (benchmarks/NOTES_kernel.md, session 21).
RELAY_RELEASE = {16: True, 32: False, 64: False, 128: False}

#: Ring stages per SM that the producers keep in flight during the call's first fill (kernel v9.8;
#: ``first_fill_per_sm`` in ``csrc/megamoe/kernel_sm90.cu``, :func:`first_fill_stages`): a
#: producer warp issues the ring's K block ``it`` only once stage ``it - F`` has landed, F this over
#: the CTAs per SM; 0 = the whole ring at once. With every CTA issuing its whole ring at once (264 x
#: 8 stages of 11 KB, ~24 MB at two CTAs per SM) each SM's first MMA started 3.3-5 us after the first
#: issue in kernel v9.7's 3-16-token traces; the guess, borne out by the A/B but not isolated in the
#: traces, was that a CTA's first stage landed with most of that burst. Four per SM (~6 MB in
#: flight) measured on the H200 against v9.7 (CUPTI kernel time, 8 crossover rounds, outputs
#: bitwise): 0.972 / 0.974 / 0.982 / 0.983 / 0.987 / 0.994 / 0.996 at 1 / 3 / 6 / 8 / 12 / 16 / 64
#: tokens (sized for 8192 tokens: 0.997 / 0.999 / 1.000 at 64 / 256 / 512); 1.016-1.017 at 1024
#: tokens (block_m 32) with it at every block_m, a layout cost of that instance, so only at block_m 16
#: (benchmarks/NOTES_kernel.md, session 42). The model prices a unit's first fill with one figure
#: read off the traces, ``sm90_first_fill_ns``.
FIRST_FILL_PER_SM = {16: 4, 32: 0, 64: 0, 128: 0}


def first_fill_stages(block_m: int, ctas_per_sm: int) -> int:
    """Stages of the ring's first fill one CTA keeps in flight (:data:`FIRST_FILL_PER_SM` over
    ``ctas_per_sm``; ``megamoe_sm90_first_fill``): 4 at block_m 16 and one CTA per SM, 2 at two, 0
    (the whole ring at once) at block_m 32-128.

    Raises:
        InputError: ``block_m`` not one of :data:`BLOCK_MS`, or ``ctas_per_sm`` not 1 or 2 (the C
            export answers -1 for both).
    """
    require(is_int(block_m) and block_m in FIRST_FILL_PER_SM, "block_m", f"one of {', '.join(map(str, BLOCK_MS))}",
            block_m)
    require(is_int(ctas_per_sm) and ctas_per_sm in (1, 2), "ctas_per_sm", "1 or 2", ctas_per_sm)
    return FIRST_FILL_PER_SM[block_m] // ctas_per_sm

#: Whether the consumers walk the block scheduler to their next block inside the epilogue of the
#: current one, per block_m (kernel v9.0; ``walk_in_epilogue`` in ``csrc/megamoe/kernel_sm90.cu``,
#: ``megamoe_sm90_walk_in_epilogue``): right after the epilogue's first global loads are issued
#: (the top-k weights at L1, the combine rows at L2), meant to run the walk's dependent chain (warp
#: shuffles, a ballot, an integer division) during their round trip instead of between the
#: blocks. The block order is the same. Elsewhere the walk runs after the epilogue. Measured on the
#: H200 against v8.9 (CUPTI kernel time, 8 crossover rounds): 0.968 at 1024 tokens (block_m 32),
#: 0.972 / 0.973 at 4096 / 8192 (128), 0.994-1.006 at 1-64 (16); with the walk in the epilogue at
#: block_m 16 too, 1.012-1.037 at 1-4 tokens (the wide instance). In v9.0's traces the walk is not
#: hidden: the gap between blocks fell from 0.67-1.15 to 0.22-0.32 us and the epilogues grew by
#: about as much; the gain is in the K loops, whose layout changed with it (a form with the same
#: instruction counts read 1.011 at 1024 tokens; benchmarks/NOTES_kernel.md, session 35).
WALK_IN_EPILOGUE = {16: False, 32: True, 64: True, 128: True}

#: Whether the consumers take their blocks from the producer's block descriptors instead of
#: walking the block scheduler, per block_m (kernel v9.1; ``block_descriptors`` in
#: ``csrc/megamoe/kernel_sm90.cu``, ``megamoe_sm90_block_descriptors``). The producer lane that
#: issues a block's first K block writes the block (three words) into that stage's descriptor in
#: shared memory before its arrive on the stage's full barrier; the consumers read it after their
#: wait. The block order is the same; only the producer warps walk. Measured on the H200 against
#: v9.0 (CUPTI kernel time, 8 crossover rounds): 0.909-0.914 at 16-256 tokens (block_m 16), 0.929
#: at 4 and 0.989 at 1 (the wide instance). At every block_m it read 1.007 / 1.020 / 1.011 at 1024 /
#: 4096 / 8192 tokens (the block_m 32 K loop grew by 18 instructions), so at block_m >= 32 the
#: consumers keep walking inside the epilogue (:data:`WALK_IN_EPILOGUE`; since v9.1 the L2
#: epilogue forms the combine-row index after the walk: 0.997 / 0.999 / 0.993 there). After a
#: failed wait the consumers walk the rest of the list with a scheduler built only then: keeping
#: the prologue's one alive through the block loop for it read 1.060 at 64 tokens (candidate G;
#: benchmarks/NOTES_kernel.md, session 36).
BLOCK_DESCRIPTORS = {16: True, 32: False, 64: False, 128: False}

#: Whether untraced launches run an instance of the kernel without any trace code, per block_m
#: (kernel v9.13, ``untraced_instance`` in ``csrc/megamoe/kernel_sm90.cu``; its traced instance's
#: consumer then writes its records from the top of each CTA's buffer, with no atomic:
#: :func:`megamoe.kernel.trace.record_ranges`). Measured against v9.12 (CUPTI kernel time): 0.946-0.993
#: at 1-256 tokens (block_m 16), 0.980 at 2048 / 2730 (64), 0.987-0.990 at 4096 / 8192 (128), with
#: the trace overhead at 5 stages at block_m 128 down from +4.3% to +1.7-2.0%. Not at block_m 32,
#: where both new instances read 1.06-1.08 and v9.12's one instance stays (benchmarks/NOTES_kernel.md,
#: session 55).
UNTRACED_INSTANCE = {16: True, 32: False, 64: True, 128: True}

#: Dispatch warps that pull a CTA's row when the CTA has only one item (EP1), per block_m
#: (kernel v8.6; ``whole_cta_pull`` in ``csrc/megamoe/roles_shared.cuh``): at block_m 16 all
#: four, each folding and storing a quarter of the row (its 512-byte chunk rounds m with
#: m % 4 = its warp), elsewhere one. One warp folding a 4 KiB row took ~5 us at one token on the
#: H200, ~3 us of it the eight chunk rounds one after another; the four-warp pull ended 2.3 us
#: sooner in the traces. Compiled at block_m 16 only: the code in the other instances re-laid
#: out their K loops (benchmarks/NOTES_kernel.md, session 28).
ONE_ITEM_PULL_WARPS = {16: 4, 32: 1, 64: 1, 128: 1}

#: Bytes of a pulled row one dispatch warp folds and stores per chunk round: its 32 lanes x one
#: 16-byte vector each (``pull_row_fold`` in ``csrc/megamoe/roles_shared.cuh``); a 4 KiB row is
#: eight rounds.
PULL_ROUND_BYTES = 32 * 16


def fold_rounds(hidden: int, warps: int = 1) -> int:
    """Chunk rounds one dispatch warp folds and stores, one after another, when ``warps`` warps
    share a pulled row of ``hidden`` bytes (E4M3): ``ceil(ceil(hidden / PULL_ROUND_BYTES) / warps)``
    (chunk round m goes to warp m % warps, ``pull_row_fold`` in ``csrc/megamoe/roles_shared.cuh``);
    V4-Flash's 4096-byte row is 8 rounds alone, 2 with four warps."""
    rounds = -(-hidden // PULL_ROUND_BYTES)  # ceil
    return -(-rounds // warps)


#: Experts in one scan of the block scheduler: a warp's 32 lanes, one expert each
#: (``Scheduler::next`` in ``csrc/megamoe/scheduler.cuh``).
SCHED_CHUNK = 32


def wide_walk(block_m: int, experts_per_wave: int) -> bool:
    """Whether the kernel runs its wide-walk instance (kernel v8.7; ``Scheduler<16, WIDE>``,
    chosen in ``megamoe_sm90_launch``): at ``block_m`` 16 with waves of more than
    :data:`SCHED_CHUNK` experts, a chunk the block index is past costs the walk one warp
    reduction instead of the scan (in each wave that spans more than one chunk).  The other
    instances' SASS is v8.6's (equal digests).  Measured on the H200 against v8.6 (CUPTI kernel
    time, 8 crossover rounds): 0.981 at 1 token, 0.997 at 4, 1.000 / 0.999 / 0.999 at 16 / 64 /
    256 (benchmarks/NOTES_kernel.md, session 32); the same code in every instance cost ~0.5% at
    16-256 tokens (a re-laid-out ``block_m`` 16 K loop, session 29's W2)."""
    return block_m == 16 and experts_per_wave > SCHED_CHUNK


def combine_slots(block_m: int, experts_per_wave: int, ctas_per_sm: int) -> int:
    """A token's slot loads the kernel's combine keeps in flight per thread in the instance a
    launch runs (``combine_and_clean``'s ``SLOTS`` in ``csrc/megamoe/kernel_sm90.cu``): every slot
    at once, :data:`COMBINE_SLOTS_WIDE`, in the one-CTA wide instance (:func:`wide_walk` at one CTA
    per SM, kernel v8.8); else :data:`COMBINE_SLOTS` of the block_m (1 at block_m 16, so the
    two-CTA instances load one at a time). The simulator prices a combine round by it
    (``combine_round_ns`` batched, ``combine_round_serial_ns`` at 1) and ``sim.calibrate`` fits
    each figure to the traces of its kind."""
    if ctas_per_sm == 1 and wide_walk(block_m, experts_per_wave):
        return COMBINE_SLOTS_WIDE
    return COMBINE_SLOTS[block_m]


#: The widest wave of the one-CTA rule (:func:`experts_per_wave_for` over one CTA per SM) at which a
#: launch still takes two CTAs per SM (:func:`ctas_per_sm`); 128 experts on V4-Flash EP1 is 3-5
#: tokens (256 at 1-2). Measured on the H200 (CUPTI kernel time, 8 ABBA rounds, outputs bitwise;
#: the model predicted each ratio first; benchmarks/NOTES.md, session 40): kernel v9.5's two-CTA
#: wide instance (the rule's waves over 264 CTAs) took 1.155 / 1.039 of the one-CTA wide launch's
#: time at 1 / 2 tokens and 0.943 / 0.920 / 0.891 at 3 / 4 / 5; before v9.5 (waves capped at 32
#: experts) two CTAs took 1.095-1.333 at 1-5 tokens and 0.977-0.852 at 6-12, and the switch was at
#: 64 experts (6 tokens; 13 until session 40's first rule change).
PAIR_MAX_ONE_CTA_WAVE = 128


def pair_fits(block_m: int, num_ranks: int) -> bool:
    """Whether a two-CTA instance (kernel v9.2; ``CTAS`` = 2 in ``csrc/megamoe/kernel_sm90.cu``,
    checked by ``megamoe_sm90_launch``, code -11) can run a launch: block_m 16 and one rank, with
    or without the wide walk (:func:`wide_walk`; the two-CTA wide instance since kernel v9.5,
    which keeps the one-slot combine and, until v9.7, the count barrier: :func:`local_count`). Those
    instances fit 64 registers per thread, so two CTAs of 512 threads fit an SM
    (:data:`PAIR_REGS`), and two of :data:`PAIR_STAGES` 11 KB stages fit its shared memory;
    block_m >= 32 (129-189 registers) does not; EP > 1 keeps one CTA (its NVLink paths were not
    measured at two)."""
    return block_m == 16 and num_ranks == 1


def ctas_per_sm(block_m: int, one_cta_wave: int, num_ranks: int) -> int:
    """CTAs per SM of a launch (the rule): two at block_m 16 and one rank where the one-CTA wave rule
    gives at most :data:`PAIR_MAX_ONE_CTA_WAVE` experts per wave (``one_cta_wave``; the launch's own
    waves then follow the same rule over the two-CTA grid), else one. Each SM then has four consumer warps per scheduler instead of two, which
    hides the latency of the block_m 16 K loop (issue slots were 54% busy at one CTA, ncu, session
    22). Measured on the H200 (CUPTI kernel time, 8 rounds): 0.925 / 0.889 / 0.889 / 0.893 of the
    one-CTA time at 16 / 64 / 256 / 512 tokens, outputs bitwise equal; block_m 16 at two CTAs
    instead of 32 / 64 at one: 1.14-1.99x at 768-2048 tokens (benchmarks/NOTES_kernel.md, session
    37). Past 128 experts per one-CTA wave (1-2 tokens on V4-Flash) the one-CTA wide instance is
    faster: it counts locally, with no count barrier (:func:`local_count`), and a few hundred
    blocks do not keep 264 CTAs busy (:data:`PAIR_MAX_ONE_CTA_WAVE`). Until session 40 the switch
    was at 32 experts (13 tokens)."""
    return 2 if pair_fits(block_m, num_ranks) and one_cta_wave <= PAIR_MAX_ONE_CTA_WAVE else 1


def block_tickets(ctas_per_sm: int) -> bool:
    """Whether the CTAs take their blocks by ticket (kernel v9.3): at two CTAs per SM, yes; at one,
    no (the static deal of :meth:`megamoe.plan.RankPlan.sm_blocks`: CTA ``c`` runs rows ``c, c + C,
    ..``). With tickets the block list is the same (``megamoe.plan``'s order), but a CTA's producer
    takes its next row from a global counter when it is ready for it (one atomic add per block, none
    taken ahead), so which CTA runs a row is decided at run time.

    Why: the two CTAs of an SM do not share it fairly. In the v9.2 traces one CTA of each SM (most
    likely the one launched first) runs an L1 block in 13.2 us at every point of the call and its
    partner in 13-27 us (19 on average), so the static deal, equal blocks for both, left the fast
    CTA waiting for L1 rows that slow CTAs held (213 us of mask waits per fast CTA at 64 tokens,
    17 per slow one). Measured on the H200 (CUPTI kernel time, paired rounds, against v9.2):
    0.999 / 0.950 / 0.948 / 0.938 / 0.925 / 0.922 / 0.922 at 16 / 24 / 32 / 48 / 64 / 256 / 512
    tokens with the ticket taken at the block boundary; one ticket taken a block ahead 1.066 at 16
    tokens and 0.929 at 512, two ahead 1.256 at 16 (a CTA that takes a row early holds an L2 block
    whose L1 rows are not done while the next wave's L1 blocks wait behind it)
    (benchmarks/NOTES_kernel.md, session 38)."""
    return ctas_per_sm == 2


def wave_lag(ctas_per_sm: int) -> bool:
    """Whether the block list is in the wave-lag order (kernel v9.4,
    :class:`megamoe.policies.WaveLagScheduler`: L1(0), L1(1), L2(0), L1(2), L2(1), ..., each wave's
    L2 pass after the next wave's L1 pass) instead of ``MegaMoEScheduler``'s (each wave's L1 pass,
    then its L2 pass): where the CTAs take their blocks by ticket (:func:`block_tickets`), yes.

    Why: with tickets in the plain order, the CTAs that take a wave's first L2 rows wait at the
    arrival masks for the wave's last L1 rows, while the next wave's L1 rows, which need nothing,
    wait behind them in the list. At 16 tokens on V4-Flash (eight short waves of ~2.5 blocks per
    CTA) the producers waited 52 us per CTA (kernel v9.3.1's trace). The pools are indexed over all
    waves, so two waves' L1 outputs in flight take no memory. Measured on the H200 (CUPTI kernel
    time, paired rounds, against v9.3.1): 0.896 / 0.945 / 0.973 / 0.996 at 16 / 24 / 32 / 48
    tokens, 1.000-1.003 at 64-512, outputs bitwise (benchmarks/NOTES_kernel.md, session 39). The
    one-CTA static deal keeps the plain order (not measured with this order)."""
    return block_tickets(ctas_per_sm)


def pair_smem_limit() -> int:
    """Dynamic shared memory one CTA may use at two CTAs per SM: half the SM's
    :data:`SMEM_PER_SM_SM90` less the driver's per-CTA reserve (115712 B on the H200)."""
    return SMEM_PER_SM_SM90 // 2 - SMEM_RESERVED_PER_CTA


def ctas_and_experts_per_wave(block_m: int, local_experts: int, expected_tokens_per_expert: float, inter: int,
                              num_sms: int, num_ranks: int, experts_per_wave: int | None = None,
                              ctas: int | None = None) -> tuple[int, int]:
    """The CTAs per SM and the experts per wave of a launch (one rule for ``design_for`` and
    ``megamoe.plan``): :func:`experts_per_wave_for` over the ``num_sms`` CTAs of one per SM
    decides :func:`ctas_per_sm` (and at one CTA the waves); at two CTAs per SM the waves follow
    the same rule over the ``2 num_sms`` CTAs (measured 0.916 against 0.947 with the one-CTA rule's
    waves at 64 tokens, session 37; until kernel v9.5 capped at :data:`SCHED_CHUNK` experts, the
    two-CTA instance having no wide walk). ``experts_per_wave`` and ``ctas`` override the rules.

    Raises:
        InputError: ``ctas`` not None, 1 or 2, or 2 where no two-CTA instance runs the launch
            (:func:`pair_fits`: block_m other than 16, or more than one rank).
    """
    require(ctas is None or (is_int(ctas) and ctas in (1, 2)), "ctas_per_sm", "1 or 2 (or unset: the kernel's rule)",
            repr(ctas) if isinstance(ctas, str) else ctas)
    one_cta_wave = experts_per_wave_for(local_experts, expected_tokens_per_expert, block_m, inter, num_sms)
    epw = experts_per_wave if experts_per_wave is not None else one_cta_wave
    fits = pair_fits(block_m, num_ranks)
    c = ctas_per_sm(block_m, one_cta_wave, num_ranks) if ctas is None else ctas
    why = "; ".join(w for w, bad in (("block_m is not 16", block_m != 16), ("not one rank", num_ranks != 1)) if bad)
    require(c == 1 or fits, "ctas_per_sm",
            f"1 at block_m {block_m}, {num_ranks} rank(s) ({why}; two CTAs per SM only at block_m 16 and one rank)", c)
    if c == 2 and experts_per_wave is None:
        epw = experts_per_wave_for(local_experts, expected_tokens_per_expert, block_m, inter, 2 * num_sms)
    return c, epw


def local_count(block_m: int, experts_per_wave: int, num_ranks: int) -> bool:
    """Whether the EP1 dispatch counts every item in every CTA, with no count barrier (kernel
    v8.9; ``dispatch_pull``'s ``LOCAL`` in ``csrc/megamoe/roles_shared.cuh``,
    ``megamoe_sm90_local_count``): the wide instances (:func:`wide_walk`) at one rank, at one CTA
    per SM (1-2 tokens on V4-Flash) and, since kernel v9.7, at two (3-30 tokens). Each CTA's 128
    dispatch threads count all ``T k`` items with shared-memory atomics, CTA 0 hands the totals to
    the schedulers, and an item's pool row is its rank among its expert's items in item order.
    Elsewhere each CTA counts its share of the items, adds it to per-expert sums in global memory
    and waits at the count barrier; at EP > 1 the counts go over NVLink.  In v8.8's 1-token trace
    on the H200 the count and its barrier ended at ~5.1 us, before which no weight moves
    (benchmarks/NOTES_kernel.md, session 34). At two CTAs the local count took 0.978 / 0.988 /
    0.985 / 0.990 / 0.984 of v9.6's count-barrier time at 4 / 6 / 8 / 12 / 16 tokens (0.997 at 3;
    CUPTI kernel time, 8 crossover rounds, outputs bitwise; session 42)."""
    return wide_walk(block_m, experts_per_wave) and num_ranks == 1


def cta_item_starts(num_items: int, num_ctas: int) -> np.ndarray:
    """The dispatch's even split of ``num_items`` items over ``num_ctas`` CTAs (``cta_range`` in
    ``csrc/megamoe/roles_shared.cuh``; kernel v8.5): CTA ``c`` takes items
    ``[n c / C, n (c + 1) / C)``. Returns int64 ``[num_ctas + 1]``: each CTA's first item, then
    ``num_items``; so the largest share is ``ceil(n / C)``. (EP1 splits the ``T k`` items, EP
    the rank's pool positions.)"""
    return (num_items * np.arange(num_ctas + 1, dtype=np.int64)) // num_ctas


def l1_promoted_once(block_m: int) -> bool:
    """Whether the L1 GEMM promotes each K block once at this block_m (its x folded per 128-K
    group, the whole K block: :data:`L1_X_FOLD_K`) instead of once per 64-K group."""
    return L1_X_FOLD_K.get(block_m) == BLOCK_K


def kernel_wgmma_n_step(block_m: int) -> int:
    """The built kernel's WGMMA N step at this block_m, at most block_m (block_m: whole blocks):
    :data:`WGMMA_N_STEP`'s entry, or block_m where it has none. The plan's default
    (``RankPlan.wgmma_n_step``) and what ``megamoe.kernel.runtime.design_from_plan`` requires."""
    return min(block_m, WGMMA_N_STEP.get(block_m, block_m))


def wgmma_n(block_m: int, valid_rows: int, step: int | None = None) -> int:
    """The WGMMA N (tokens) of a block with ``valid_rows`` valid rows at this block_m: the valid
    rows rounded up to ``step`` tokens, at most block_m (``step`` None: the kernel's,
    :func:`kernel_wgmma_n_step`; the plan's is ``RankPlan.wgmma_n_step``). Raises ``ValueError``
    for valid rows outside 1..block_m or a step below 1."""
    if not 1 <= valid_rows <= block_m:
        raise ValueError(f"valid_rows: expected 1..{block_m} (block_m), got {valid_rows}")
    step = kernel_wgmma_n_step(block_m) if step is None else step
    if step < 1:
        raise ValueError(f"step: expected >= 1, got {step}")
    return min(block_m, -(-valid_rows // step) * step)


def _align(x: int, a: int) -> int:
    return (x + a - 1) // a * a


def block_m_for(expected_tokens_per_expert: float) -> int:
    """Smallest supported block_m that holds the expected tokens of one expert (max 128).

    ``expected = tokens * ranks * topk / experts``. WGMMA's N (the tokens, swap AB) makes
    16 a convenient floor; 128 is the largest tile whose accumulator and WGMMA partial fit
    the consumers' registers.
    """
    for bm in BLOCK_MS:
        if expected_tokens_per_expert <= bm:
            return bm
    return BLOCK_MS[-1]


def stage_copy_bytes(block_m: int) -> int:
    """Bytes the producer copies into one pipeline stage: token tile ``[block_m][128]`` E4M3,
    packed weights ``[128][64]`` (decoded into registers, never into shared memory), weight
    scales ``[128][4]`` and the token scales as FP32 ``[2][block_m]`` (one per 64-K group: the
    pools' ``l1_pool_fsx`` / ``l2_pool_fsx`` slab the producer copies with the stage, kernel v7.5).
    Also what one K block reads from L2 or HBM (``benchmarks/l2_traffic.py``)."""
    return block_m * BLOCK_K + 8192 + 512 + block_m * 8


def stage_bytes(block_m: int) -> int:
    """Shared memory of one pipeline stage: :func:`stage_copy_bytes` rounded up to 1024 B
    (WGMMA's 128-byte swizzle atoms need 1024-B alignment)."""
    return _align(stage_copy_bytes(block_m), 1024)


#: Rows of ``block_m`` FP32 in the L1 epilogue's shared scratch (``fixed_bytes``).
EPILOGUE_SCRATCH_ROWS = 20


def fixed_bytes(block_m: int, num_experts: int) -> int:
    """Barriers (1 KB), dispatch scratch (3 ints per expert + 64 B), the L1 epilogue's scratch
    (``[20][block_m]`` FP32: the 8 consumer warps' amax, then the tokens' scales in rows 0-3 and
    the block's ``[block_m][64]``-byte L2-pool tile in rows 4-19, kernel v7.7), rounded up to
    1024 B."""
    return _align(1024 + _align(num_experts * 12 + 64, 128) + _align(EPILOGUE_SCRATCH_ROWS * block_m * 4, 128), 1024)


def smem_bytes(block_m: int, num_stages: int, num_experts: int) -> int:
    """Dynamic shared memory of the kernel (same formula as ``smem_bytes`` in C++)."""
    return fixed_bytes(block_m, num_experts) + num_stages * stage_bytes(block_m)


def num_stages_for(block_m: int, num_experts: int, smem_limit: int = SMEM_LIMIT_SM90) -> int:
    """As many stages as fit the shared-memory budget (at most MAX_STAGES)."""
    s = (smem_limit - fixed_bytes(block_m, num_experts)) // stage_bytes(block_m)
    return int(min(MAX_STAGES, s))


def min_stages(block_m: int) -> int:
    """The fewest stages the kernel runs correctly with: one per producer warp that issues the
    ring (``PRODUCER_ISSUE_WARPS``: 4 at block_m 16-64, 2 at 128).

    The producer warps take the K blocks round-robin, and each waits for its stage's empty
    barrier by phase parity, which tells only two consecutive phases apart. With fewer stages
    than issuing warps, a warp can reach a stage two ring rounds ahead of the consumers. It
    then takes a phase that has not come yet for one already done, and overwrites a stage
    still in use. On the H200 (fourteenth session, benchmarks/NOTES_kernel.md), 2 and 3 stages
    at block_m 16 ended in an unspecified launch failure; 4 and more, and 2 at block_m 128,
    ran with outputs bitwise equal to the default stage counts'."""
    require(is_int(block_m) and block_m in PRODUCER_ISSUE_WARPS, "block_m", f"one of {BLOCK_MS}",
            repr(block_m) if isinstance(block_m, str) else block_m)
    return PRODUCER_ISSUE_WARPS[block_m]


def stages_for(block_m: int, num_experts: int, num_stages: int | None = None,
               smem_limit: int = SMEM_LIMIT_SM90) -> int:
    """The stage count of a launch: ``num_stages`` if given, else as many as fit, at most
    :data:`STAGES_DEFAULT` where it names ``block_m``.

    Raises:
        InputError: ``num_stages`` outside ``[min_stages(block_m), num_stages_for(...)]``, or
            not even ``min_stages`` fit (``shape.num_experts``: the dispatch tables grow with it).
    """
    fewest = min_stages(block_m)
    fit = num_stages_for(block_m, num_experts, smem_limit)
    if fit < fewest:
        # the plan's message for both designs (it names the largest expert count that fits)
        from .plan import smem_error

        raise smem_error(lambda e: smem_bytes(block_m, fewest, e), num_experts, block_m, smem_limit, fewest)
    if num_stages is None:
        return min(fit, STAGES_DEFAULT.get(block_m, fit))
    require(is_int(num_stages) and fewest <= num_stages <= fit, "num_stages",
            f"an integer in [{fewest}, {fit}] (at least one per issuing producer warp, at most what {smem_limit} B "
            f"of shared memory holds at block_m {block_m})", repr(num_stages) if not is_int(num_stages) else num_stages)
    return int(num_stages)


def stages_for_ctas(block_m: int, num_experts: int, ctas: int, num_stages: int | None = None,
                    smem_limit: int = SMEM_LIMIT_SM90) -> int:
    """:func:`stages_for` at ``ctas`` CTAs per SM: at two, within :func:`pair_smem_limit` and
    :data:`PAIR_STAGES` unless ``num_stages`` is given.

    Raises:
        InputError: as :func:`stages_for`.
    """
    if ctas == 1:
        return stages_for(block_m, num_experts, num_stages, smem_limit)
    limit = min(smem_limit, pair_smem_limit())
    if num_stages is None:
        return min(PAIR_STAGES, stages_for(block_m, num_experts, None, limit))
    try:
        return stages_for(block_m, num_experts, num_stages, limit)
    except InputError as e:  # above the range: say why it is half the one-CTA one
        if not (is_int(num_stages) and num_stages > min_stages(block_m)):
            raise
        raise InputError(e.field, f"{e.expected}; two CTAs share each SM here (ctas_per_sm 1 allows more)",
                         e.got) from None


def pool_rows_for(num_tokens: int, topk: int, num_experts: int, block_m: int, ranks: int = 1) -> int:
    """Pool capacity in rows: every routed item plus the worst-case padding per expert."""
    local_experts = num_experts // ranks
    rows = ranks * num_tokens * min(topk, local_experts) + local_experts * (block_m - 1)
    return max(block_m, _align(rows, block_m))


def experts_per_wave_for(num_experts: int, expected_tokens_per_expert: float, block_m: int, inter: int,
                         num_sms: int) -> int:
    """Default wave width when no plan gives one: the smallest divisor of E whose expected L1
    blocks (experts x m blocks x 2I/128) keep every SM busy twice over (imbalance factor 2).

    An expert's m blocks are ``ceil(expected / block_m)`` (at least 1) if it has tokens, and it
    has some with probability ``1 - exp(-expected)`` (Poisson routing of ``expected`` tokens on
    average): at a few tokens most experts of a wave are empty. Counting them as full (until
    session 18) gave 16 experts per wave at 1 token, about 0.4 routed experts per wave, and
    the kernel ran 1.33x longer than with all 256 experts in one wave (H200, V4-Flash EP1:
    88.7 vs 66.3 us; 16 tokens, 32 per wave: 0.935x; benchmarks/NOTES_kernel.md).
    """
    m_blocks = max(1, math.ceil(expected_tokens_per_expert / block_m))
    occupied = -math.expm1(-expected_tokens_per_expert)  # P(an expert has a token), Poisson
    n_blocks = 2 * inter // BLOCK_N
    for w in range(1, num_experts + 1):
        if num_experts % w == 0 and w * occupied * m_blocks * n_blocks >= 2 * num_sms:
            return w
    return num_experts


@dataclass(frozen=True)
class SM90Design:
    """Every number the SM90 kernel takes from the plan. ``num_sms`` counts SMs; the kernel's
    grid (its ``num_sms`` launch parameter) is :attr:`num_ctas`, ``ctas_per_sm`` to an SM."""
    block_m: int
    block_n: int
    block_k: int
    num_stages: int
    experts_per_wave: int
    num_sms: int
    pool_rows: int
    smem_bytes: int
    threads: int = THREADS
    ctas_per_sm: int = CTAS_PER_SM
    dispatch_warps: int = DISPATCH_WARPS
    producer_warps: int = PRODUCER_WARPS
    consumer_warps: int = CONSUMER_WARPS

    @property
    def num_ctas(self) -> int:
        """CTAs of the persistent launch: ``num_sms x ctas_per_sm``."""
        return self.num_sms * self.ctas_per_sm

    def as_dict(self) -> dict:
        return asdict(self)


@functools.lru_cache(maxsize=4096)  # pure, and the frozen result is shared: one lookup per kernel call
def design_for(num_tokens: int, hidden: int, inter: int, num_experts: int, topk: int, num_sms: int = 132,
               ranks: int = 1, block_m: int | None = None, experts_per_wave: int | None = None,
               num_stages: int | None = None, pool_tokens: int | None = None,
               ctas_per_sm: int | None = None) -> SM90Design:
    """The SM90 design for a scenario (one rank of ``ranks``); any argument given overrides the
    rule: block_m from the expected tokens per expert (``num_tokens * ranks * topk /
    num_experts``), CTAs per SM and experts per wave over the rank's ``num_experts / ranks``
    local experts (:func:`ctas_and_experts_per_wave`), stages from shared memory (at two CTAs per
    SM :data:`PAIR_STAGES`, at most what :func:`pair_smem_limit` holds), pool rows for
    ``pool_tokens`` tokens per rank (default ``num_tokens``; the EP launcher passes its
    ``max_tokens``).

    Raises:
        InputError: a count that is not an integer of its range (``num_tokens`` >= 0;
            ``hidden``, ``inter`` multiples of 128; ``num_experts``, ``num_sms``, ``ranks`` >= 1,
            ``ranks`` a divisor of ``num_experts``; ``topk`` in ``[1, num_experts]``;
            ``experts_per_wave`` None or in ``[1, num_experts / ranks]``; ``pool_tokens`` None
            or >= 0), ``block_m`` not None or one of ``BLOCK_MS``, ``num_stages`` outside what
            :func:`stages_for` allows, ``ctas_per_sm`` not None, 1 or 2 (2 only where
            :func:`ctas_per_sm` allows it).
        TypeError: an unhashable argument (the results are cached by argument).
    """
    def shown(v):  # '64' is not 64
        return repr(v) if isinstance(v, str) else v

    for name, v, lo in (("num_tokens", num_tokens, 0), ("hidden", hidden, 1), ("inter", inter, 1),
                        ("num_experts", num_experts, 1), ("topk", topk, 1), ("num_sms", num_sms, 1),
                        ("ranks", ranks, 1)):
        require(is_int(v) and v >= lo, name, f"an integer >= {lo}", shown(v))
    for name, v in (("hidden", hidden), ("inter", inter)):  # the kernel's tiles (128 x 128)
        require(v % 128 == 0, name, "a multiple of 128", v)
    require(num_experts % ranks == 0, "ranks", f"a divisor of num_experts ({num_experts})", ranks)
    require(topk <= num_experts, "topk", f"at most num_experts ({num_experts})", topk)
    for name, v, lo in (("experts_per_wave", experts_per_wave, 1), ("pool_tokens", pool_tokens, 0)):
        require(v is None or (is_int(v) and v >= lo), name, f"None (the rule) or an integer >= {lo}", shown(v))
    require(experts_per_wave is None or experts_per_wave <= num_experts // ranks, "experts_per_wave",
            f"at most the rank's {num_experts // ranks} local experts", experts_per_wave)
    require(block_m is None or (is_int(block_m) and block_m in BLOCK_MS), "block_m",
            f"None (the rule) or one of {BLOCK_MS}", shown(block_m))
    expected = num_tokens * ranks * topk / num_experts
    bm = block_m if block_m is not None else block_m_for(expected)
    ctas, epw = ctas_and_experts_per_wave(bm, num_experts // ranks, expected, inter, num_sms, ranks,
                                          experts_per_wave, ctas_per_sm)
    st = stages_for_ctas(bm, num_experts, ctas, num_stages)
    rows = pool_rows_for(num_tokens if pool_tokens is None else pool_tokens, topk, num_experts, bm, ranks)
    return SM90Design(block_m=bm, block_n=BLOCK_N, block_k=BLOCK_K, num_stages=st, experts_per_wave=epw,
                      num_sms=num_sms, pool_rows=rows, smem_bytes=smem_bytes(bm, st, num_experts), ctas_per_sm=ctas)
