"""Hardware models loaded from TOML files, each figure with its source.

A hardware file has a ``name``, an optional ``arch`` (``"sm90"`` or ``"sm100"``: the compute
capability family, which decides the design that runs there natively, :data:`megamoe.plan.DESIGN_ARCH`),
a ``[figures]`` table and a ``[sources]`` table with one
entry (a string naming where the number comes from) for every figure.  With ``base = "PRESET"``
it gives only the figures that differ from that preset's (a GPU of the same family, or a what-if
on one figure): the others are the preset's, each with its source prefixed "estimate: <preset
name>'s figure" (:func:`resolve_base`).  Presets live in ``sim/hardware/*.toml`` (``b200``,
``h200``, ``h100``, ``h20``); ``load_hardware`` takes a preset name or a path.

Figures (units in the key names):

* ``num_sms``, ``clock_ghz``, ``smem_per_block_bytes``, ``l2_cache_bytes``
* ``fp8_dense_tflops`` — peak dense FP8 tensor-core rate of the GPU; ``mma_efficiency`` —
  fraction of it a block-scaled FP8xFP4 K loop sustains.
* ``hbm_gbs`` — HBM bandwidth (GB/s, bytes read + written); ``hbm_efficiency``.
* ``sm_load_gbs`` — most one SM's TMA engine moves per second.
* ``tma_latency_ns`` — issue to completion of one stage's bulk copy from HBM (a block's first
  stage; the ring's Little's-law bound on the load rate).
* ``nvlink_gbs_per_direction`` — NVLink bandwidth of one GPU in one direction (all links);
  ``nvlink_efficiency``; ``nvlink_latency_ns`` — one remote access round trip (the SM90 EP
  pull pays it per dependent remote load on top of the local pull, so where it is fitted to
  kernel traces it is the excess of a remote load over a local one).
* ``nvlink_peer_gbs`` — most one directed GPU pair can carry (equal to the port through a
  switch; a fraction of it with point-to-point links).
* ``launch_ns``, ``grid_sync_ns``, ``nvl_barrier_ns``, ``atomic_same_address_ns``,
  ``pull_latency_ns``
* ``l1_epilogue_thread_ns_per_elem``, ``l2_epilogue_thread_ns_per_elem`` — epilogue cost per
  accumulator element per epilogue thread.
* ``block_overhead_ns`` — fixed cost of one block hand-off (scheduler step, barrier phase
  flips, TMEM full/empty, arrival-mask release), spread over the K loop and the epilogue.
* ``sm90_mma_fraction`` — SM90 design: the rate of this project's SM90 kernel's matrix path
  (FP8 WGMMA plus the per-32-K FP32 promotion of the UE8M0 scales) as a fraction of the
  sustained FP8 GEMM rate (``fp8_dense_tflops x mma_efficiency``); unused by the SM100
  reference design, whose UMMA K loop runs at the sustained rate.
* ``sm90_promotion_ns_per_row`` — SM90 design: one 64-K group's FP32 promotion (the partial
  times the token scale into the accumulator), per block_m row of a K block. The K-block line
  (``sm90_mma_fraction``) holds two of them; an L1 K block promoted once (x folded per 128-K
  group at block_m 128, kernel v7.6, ``megamoe.design_sm90.L1_X_FOLD_K``) takes this x block_m
  less.
* ``e2m1_decode_thread_ns_per_elem`` — SM90 design: the consumers' per-stage preparation
  before the MMA, per element per consumer thread (kernel v4: the E2M1 -> E4M3 decode into
  shared memory; v5 decodes into the WGMMA registers inside the MMA phase, and this term is
  the token-scale table and the warpgroup barrier until v7.4, from v7.5 only the weight rows'
  fold-table offsets and the stage addresses; fitted from the per-role profile).
* ``sm90_count_ns``, ``sm90_count_item_ns`` — SM90 design, one rank (kernel v8.5+): from the
  kernel's start to its count barrier, fixed + per item of the largest CTA's share of the
  ``T k`` items (``ceil(T k / SMs)``): each CTA counts its items per expert, adds them to the
  expert sums, sorts them by expert and waits at the count barrier, then reads the counts
  and the pool-block offsets. The barrier's own release (``grid_sync_ns``) follows; the pull
  then starts.
* ``sm90_local_count_ns`` — SM90 design, one rank, the wide instance (kernel v8.9,
  :func:`megamoe.design_sm90.local_count`): from the kernel's start to the first pull when
  every CTA counts all ``T k`` items itself (no count barrier, no global atomics).
* ``sm90_combine_start_ns``, ``sm90_combine_start_pair_ns`` — SM90 design: from a CTA's release
  from the grid sync before the combine to its first combine load, at one CTA per SM and at two
  (the combine round figures count from there).
* ``sm90_count_pair_ns`` — SM90 design: how much longer the count, up to its barrier's release,
  takes at two CTAs per SM than ``sm90_count_ns + share x sm90_count_item_ns`` (read off one-CTA
  traces) says for the same share: twice the CTAs add into the per-expert sums and the barrier.
* ``sm90_fetch_counts_ns`` — SM90 design: each unit's schedulers read the published expert counts
  before their first walk (``Scheduler::fetch_counts``: a lane's counters, one acquire load after
  another), at the unit's share of a lone CTA's time; from the counts' readiness (the unit's first
  pull) to its producer's first walk, less that walk's fixed part.
* ``sm90_first_fill_ns`` — SM90 design: from a unit's first copy issue of the call to its first
  stage's arrival (the ring's first fill: at the call's start every CTA's producers issue at once,
  and at block_m 16 kernel v9.8 paces that fill by arrivals), in place of ``tma_latency_ns`` for the
  unit's first block only; read where the consumers' first record starts at that arrival (block
  descriptors, block_m 16).
* ``sm90_first_kloop_ns`` — SM90 design: how much longer a unit's first block's K loop runs than
  its later ones where kernel v9.8 paces the ring's first fill by arrivals
  (:func:`megamoe.design_sm90.first_fill_stages` > 0: block_m 16): during the first ``num_stages``
  K blocks a producer warp issues a stage only once the stage ``F`` back has landed, while every
  SM's ring fills at once; read off the traces as each CTA's first L1 MMA record less the median
  of its later ones.
* ``pull_fold_chunk_ns`` — SM90 design: one dispatch warp's fold and stores of one chunk round
  of a pulled row (``megamoe.design_sm90.PULL_ROUND_BYTES``: 32 lanes x 16 bytes); a warp
  pulling a whole row runs ``hidden / PULL_ROUND_BYTES`` of them one after another, and the row
  of a CTA with one item its four warps share (``megamoe.design_sm90.ONE_ITEM_PULL_WARPS``) a
  quarter each.
* ``sm90_pull_base_ns``, ``sm90_pull_warp_ns`` — SM90 design: a pull round's time besides its fold
  rounds (the item's index and expert, the row's load round trip, the stores and the release) is
  ``sm90_pull_base_ns + sm90_pull_warp_ns x`` the dispatch warps pulling in that round on the GPU
  (the loads in flight queue: 2.1 us with 24 warps at one token, 3.4-4.0 us with 384-528); the
  SM100 design's pull keeps ``pull_latency_ns``.
* ``sm90_pull_pair_ns`` — SM90 design, one rank at two CTAs per SM: a CTA's lone pull (its one item
  pulled by its four dispatch warps, ``megamoe.design_sm90.ONE_ITEM_PULL_WARPS``) takes this besides
  its fold rounds, whatever the warps pulling on the GPU, in place of the line above: the two-CTA
  traces' lone pulls take 4.0-4.9 us at 3-64 tokens (72-816 warps pulling), 1.2-1.9 us above the
  one-CTA line at 3-16 tokens, and do not grow with the warps. The cause is not known: it is not the
  warps polling the counts meanwhile (session 47's probe2 moved every poll 20 us later and the pull's
  fold segment stayed at 3.1 us), nor the two-CTA dispatch warps' spills (session 48's probe R gave
  them 16 more registers, a third fewer spills, and the lone pull took 0.3-0.9 us longer).
* ``stage_handoff_ns`` — SM90 design: fixed cost of one pipeline stage (barrier waits and
  releases between producer and consumers, the fixed part of the WGMMA wait and promotion),
  paid per K block.
* ``sm90_issue_kblock_ns`` — SM90 design: the producer's time to issue one K block's loads
  (token tile, scales, FP4 weights and their scales) once its stage is free; a block's last
  copy issue comes no earlier than ``K blocks x`` this after its first, and this long after
  the consumers free the stage a ring back.  Close to the consumers' K-block time, so with
  an empty ring (a CTA's first block, a block after few others) the producer runs barely
  ahead of the consumers.
* ``sched_block_ns``, ``sched_step_ns`` — SM90 design: the block scheduler between two blocks
  of one CTA (paid by the producer and by the consumers, each running its own copy): a
  fixed part per block (the scheduler call, the trace records, the accumulator reset) plus
  one step for every 32-expert chunk it scans beyond the call's first, across the passes (L1,
  L2) of the waves (``csrc/megamoe/scheduler.cuh``, :func:`sim.engine.sm90_walk_steps`); also
  after the last block, to the end of the list.
* ``sched_ahead_ns`` — SM90 design, the block_m whose consumers walk to their next block inside
  the epilogue (kernel v9.0, :data:`megamoe.design_sm90.WALK_IN_EPILOGUE`): the fixed part of
  the consumers' gap between two blocks in place of ``sched_block_ns`` (the walk's cost is in
  the epilogue figures, fitted to the same traces); the chunk scans beyond the call's first
  still cost ``sched_step_ns`` each.
* ``sched_desc_ns`` — SM90 design, the block_m whose consumers take their blocks from the
  producer's block descriptors (kernel v9.1, :data:`megamoe.design_sm90.BLOCK_DESCRIPTORS`): the
  consumers' whole gap between two blocks (wait on the stage, read the descriptor, the trace
  records, the accumulator reset), with no scheduler steps; the producer still pays
  ``sched_block_ns`` and the steps.
* ``sm90_pair_share`` — SM90 design at two CTAs per SM (kernel v9.2,
  :func:`megamoe.design_sm90.ctas_per_sm`): how much longer a CTA's consumer and producer work
  takes when another CTA shares its SM (its K blocks, epilogues, scheduler gaps and copy issues;
  each CTA also gets half the SM's load rate ``sm_load_gbs``). Two CTAs per SM do
  ``2 / sm90_pair_share`` times one CTA's work. Since the two CTAs of an SM do not share it
  fairly (benchmarks/NOTES_kernel.md, session 38), this prices the second CTA's block (units
  ``num_sms / 2`` and up) where its partner is inside a block when it starts.
* ``sm90_pair_share_first`` — the same at two CTAs per SM for the first CTA of an SM (units below
  ``num_sms / 2``), always, and for the second where its partner is idle when its block starts:
  in the v9.2 traces one CTA of each SM runs its L1 K loop at ~1.26x a lone CTA's time at every
  point of the call, its partner ~1.24x while the first is idle and 1.8-2.6x while it is in a block
  (benchmarks/NOTES_kernel.md, session 38).
* ``sm90_mask_seen_ns``, ``sm90_mask_seen_relay_ns`` — SM90 design: from an L1 epilogue's end
  (its trace record) until a producer on another SM sees the block's arrival-mask bits and may
  issue the L2 K blocks that need them: the epilogue's own fence and release add, or (kernel
  v8.1's relay, :data:`megamoe.design_sm90.RELAY_RELEASE`, block_m 16) the hand-over to a
  dispatch lane that fences and releases; then the producer's poll.
* ``sched_skip_ns`` — SM90 design: a scheduler step that skips a 32-expert chunk with one
  warp reduction instead of scanning it (kernel v8.7's wide-walk instance: ``block_m`` 16 and
  waves of more than 32 experts, :func:`megamoe.design_sm90.wide_walk`).
* ``l2_epilogue_fixed_ns`` — SM90 design: fixed part of the L2 epilogue (the row-metadata
  round trips); the SM90 L2 epilogue is this plus ``l2_epilogue_thread_ns_per_elem`` per
  element of the block's rows and again per element of its valid (stored) rows.
* ``l2_epilogue_ep_ns`` — SM90 design with several ranks: added to every L2 epilogue.  The
  kernel then stores each row, this rank's too, into its source rank's combine buffer
  through the symmetric-memory peer table: the stores wait for the destination's base
  address, a load that depends on the row's source rank.  Which rank the rows go to does not
  change the time (the stores are posted).
* ``combine_round_ns`` — SM90 design: one grid-stride round of the combine (every thread
  sums the top-k BF16 copies of one 16-byte slice of a token); the combine takes
  ``ceil(tokens x hidden / 8 / (SMs x 512 threads))`` rounds, or the HBM time if longer,
  where the kernel loads a token's slots several at a time (``design_sm90.COMBINE_SLOTS`` above
  1, or the one-CTA wide instance's ``COMBINE_SLOTS_WIDE``).
* ``combine_round_serial_ns`` — the same round where the kernel loads a token's slots one at a
  time (``design_sm90.COMBINE_SLOTS`` 1: block_m 16 outside the one-CTA wide instance, i.e.
  the two-CTA instances at 3-682 tokens on V4-Flash).
* ``block_jitter`` — how much a block's time varies from block to block (dimensionless, in
  ``[0, 0.5]``: the standard deviation of the natural log of a factor, ~ its relative spread): each
  block's K loop (its K blocks' compute: the copy-bound limits, i.e. first-touch loads, copy issues
  and the stage ring, are not scaled) and each block's epilogue take their modelled time times a
  factor ``exp(N(0, block_jitter))`` of their own, drawn once per block from the scenario's seed
  (:func:`sim.engine.block_jitter`; 0: every factor 1, the deterministic model). Fitted to the L1 K
  loops of one-CTA kernel traces (:func:`sim.calibrate.fit_block_jitter`); the epilogues take the
  same spread unfitted (their trace records hold waits and valid-row differences, 5-17% apart from
  record to record, which the model prices apart). Without it the model's identical blocks run in
  lockstep and its ties resolve alike on every SM, which the GPU's do not.
* ``legacy_launch_ns`` — per-kernel launch gap of the unfused path.
* ``legacy_a2a_latency_ns`` — fixed latency of each DeepEP all-to-all (dispatch, combine) of
  the unfused path beyond its bytes and barrier: notify round, layout and CPU-side sync.

Ranges.  Every figure must be a finite number in the closed range that :data:`FIGURE_RANGES`
gives it (``num_sms`` an integer in ``[2, megamoe.plan.MAX_SMS]``), in a file and after
:meth:`Hardware.scaled` (a sweep's ``<figure>_scale`` axes) alike; anything else is an
``InputError`` naming the figure, its range and unit, and the value.  Nothing is clamped.
The ranges are wide around every GPU this simulator models (the presets sit inside them),
but bounded for two reasons:

* The simulator's cost grows with *simulated* time: each bandwidth resource (HBM, and NVLink
  egress / ingress per GPU, and per GPU pair where ``nvlink_peer_gbs`` is below
  ``nvlink_gbs_per_direction``) is a calendar of 250 ns buckets, about 50 bytes each, up to
  the call's end (about 3.5 GB per simulated second for the default EP8 scenario, 15 GB with
  the per-pair calendars).  So the rates and efficiencies have floors and the latencies
  ceilings, tightest for the costs paid per block or per K block.  Measured (2-core CI
  machine) with every figure at its slow end at once: the default scenario (``megamoe
  simulate``) 0.17 s simulated, 2.5 GB, 7 s at the presets' 148 SMs; ``--shape
  deepseek-v4-flash --tokens 131072 --ranks 1`` 1.0 s simulated, 0.4 GB, 1.4 s.  Before,
  ``hbm_gbs = 0.01`` or ``launch_ns = 1e12`` ran out of memory after 7 GB.  With very few
  SMs (``num_sms`` down to 2, or ``--reserved-sms``) the per-SM costs run in series: the
  same corners take 0.65 s simulated (3.1 GB, 6 s; 10 GB and 19 s with per-pair calendars)
  and 4.7 s simulated (1.1 GB, 2 s).
  The fractions' floor is 0.05 (fitted kernels have sat at 0.11). Whatever the figures,
  ``sim.engine.MAX_CALENDAR_BUCKETS`` bounds the calendars of one simulation (~6 GB): a run
  that would outgrow it is refused by name (``simulated time``) instead of filling memory.
* Beyond them the numbers stop meaning a GPU: infinite or denormal bandwidths overflow the
  calendars, and ``smem_per_block_bytes = 1e30`` plans an absurd pipeline depth.
"""

from __future__ import annotations

import difflib
import math
import os
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path

from megamoe.errors import InputError, require, shown, shown_text
from megamoe.plan import MAX_SMS

PRESET_DIR = Path(__file__).parent / "hardware"


@dataclass(frozen=True)
class Hardware:
    """One GPU model (see module docstring for units).  All figures are positive."""

    name: str
    num_sms: int
    clock_ghz: float
    smem_per_block_bytes: int
    l2_cache_bytes: int
    fp8_dense_tflops: float
    mma_efficiency: float
    hbm_gbs: float
    hbm_efficiency: float
    sm_load_gbs: float
    nvlink_gbs_per_direction: float
    nvlink_peer_gbs: float
    nvlink_efficiency: float
    nvlink_latency_ns: float
    launch_ns: float
    grid_sync_ns: float
    nvl_barrier_ns: float
    atomic_same_address_ns: float
    tma_latency_ns: float
    pull_latency_ns: float
    l1_epilogue_thread_ns_per_elem: float
    l2_epilogue_thread_ns_per_elem: float
    block_overhead_ns: float
    sm90_mma_fraction: float
    sm90_promotion_ns_per_row: float
    e2m1_decode_thread_ns_per_elem: float
    stage_handoff_ns: float
    sm90_count_ns: float
    sm90_count_item_ns: float
    sm90_count_pair_ns: float
    sm90_combine_start_ns: float
    sm90_combine_start_pair_ns: float
    sm90_local_count_ns: float
    sm90_first_fill_ns: float
    sm90_first_kloop_ns: float
    sm90_fetch_counts_ns: float
    pull_fold_chunk_ns: float
    sm90_pull_base_ns: float
    sm90_pull_warp_ns: float
    sm90_pull_pair_ns: float
    sm90_issue_kblock_ns: float
    sched_block_ns: float
    sched_ahead_ns: float
    sched_desc_ns: float
    sm90_pair_share: float
    sm90_pair_share_first: float
    sched_step_ns: float
    sched_skip_ns: float
    sm90_mask_seen_ns: float
    sm90_mask_seen_relay_ns: float
    l2_epilogue_fixed_ns: float
    l2_epilogue_ep_ns: float
    combine_round_ns: float
    combine_round_serial_ns: float
    block_jitter: float
    legacy_launch_ns: float
    legacy_a2a_latency_ns: float
    sources: dict
    path: str = ""
    arch: str = ""  # "sm90", "sm100", or "" (not given): the design note of the CLI reads it

    def is_estimate(self, figure: str) -> bool:
        """Whether ``figure``'s source marks it an estimate (its text starts with "estimate", in
        any case): not measured on this GPU nor fitted to its traces."""
        return self.sources.get(figure, "").lstrip().lower().startswith("estimate")

    # derived rates -------------------------------------------------------------
    @property
    def tc_flops_per_ns_per_sm(self) -> float:
        """Sustained tensor-core FLOP per ns of one SM."""
        return self.fp8_dense_tflops * 1e3 * self.mma_efficiency / self.num_sms

    @property
    def hbm_bytes_per_ns(self) -> float:
        return self.hbm_gbs * self.hbm_efficiency

    @property
    def nvlink_bytes_per_ns(self) -> float:
        return self.nvlink_gbs_per_direction * self.nvlink_efficiency

    @property
    def sm_load_bytes_per_ns(self) -> float:
        return self.sm_load_gbs

    def scaled(self, labels: dict[str, str] | None = None, /, **factors: float) -> "Hardware":
        """A copy with figures multiplied (``hbm_gbs=0.5`` halves HBM bandwidth).

        Args:
            labels: figure -> the name the user gave its factor (a sweep's ``hbm_scale``), used
                as the field of an error; default ``hardware.<figure> scale``.
            factors: figure -> factor (any figure but ``num_sms``).

        Raises:
            InputError: an unknown figure, a factor that is not a finite number > 0 (>= 0 for a
                figure whose range starts at 0, e.g. ``block_jitter``: 0 switches it off), or a
                scaled figure outside its range (:data:`FIGURE_RANGES`).
        """
        vals = {f.name: getattr(self, f.name) for f in fields(self)}
        for k, v in factors.items():
            field = (labels or {}).get(k, f"hardware.{k} scale")
            require(k in FIGURE_RANGES and k != "num_sms", field,
                    "a hardware figure other than num_sms", k)
            lo, hi, unit = FIGURE_RANGES[k]
            # a figure that may be 0 may be scaled to 0 (switched off)
            require(_is_number(v) and math.isfinite(v) and (v > 0 or (lo == 0 and v == 0)), field,
                    f"a finite number {'>=' if lo == 0 else '>'} 0", v)
            x = vals[k] * v
            units = "" if unit in ("", "fraction") else f"{unit}; "
            require(in_range(k, x), field,
                    f"a factor that keeps {k} in [{_num(lo)}, {_num(hi)}] ({units}{self.name} has {_num(vals[k])})",
                    f"{_num(v)} ({k} {_num(x)})")
            vals[k] = int(x) if k in _INTS else float(x)
        return Hardware(**vals)


_FIGURES = [f.name for f in fields(Hardware) if f.name not in ("name", "sources", "path", "arch")]
#: The values of a hardware file's ``arch``.
ARCHS = ("sm90", "sm100")
# The figures only the megamoe-sm90 design uses (this module's docstring describes each): fitted to
# our SM90 kernel's traces on the H200 preset, estimates elsewhere (the CLI says so when it runs
# that design on a preset whose figures are estimates).
SM90_DESIGN_FIGURES = ("sm90_mma_fraction", "sm90_promotion_ns_per_row", "e2m1_decode_thread_ns_per_elem",
                       "stage_handoff_ns", "sm90_count_ns", "sm90_count_item_ns", "sm90_count_pair_ns", "sm90_local_count_ns",
                       "sm90_first_fill_ns", "sm90_first_kloop_ns", "sm90_fetch_counts_ns", "pull_fold_chunk_ns",
                       "sm90_pull_base_ns", "sm90_pull_warp_ns", "sm90_pull_pair_ns", "sm90_issue_kblock_ns",
                       "sched_block_ns", "sched_ahead_ns", "sched_desc_ns", "sm90_pair_share", "sm90_pair_share_first",
                       "sched_step_ns", "sched_skip_ns", "sm90_mask_seen_ns", "sm90_mask_seen_relay_ns",
                       "l2_epilogue_fixed_ns", "l2_epilogue_ep_ns", "combine_round_ns", "combine_round_serial_ns",
                       "sm90_combine_start_ns", "sm90_combine_start_pair_ns")
_INTS = {"num_sms", "smem_per_block_bytes", "l2_cache_bytes"}

_KIB, _MIB, _GIB = 1024, 1024**2, 1024**3
#: figure -> (lo, hi, unit): the closed range a figure must lie in (see the module docstring
#: for why it is bounded); a fraction's unit is ``"fraction"``.
FIGURE_RANGES: dict[str, tuple[float, float, str]] = {
    "num_sms": (2, MAX_SMS, ""),
    "clock_ghz": (0.1, 10.0, "GHz"),
    "smem_per_block_bytes": (16 * _KIB, 4 * _MIB, "bytes"),
    "l2_cache_bytes": (1 * _MIB, 16 * _GIB, "bytes"),
    "fp8_dense_tflops": (200.0, 100_000.0, "TFLOP/s"),
    "mma_efficiency": (0.05, 1.0, "fraction"),
    "hbm_gbs": (200.0, 100_000.0, "GB/s"),
    "hbm_efficiency": (0.05, 1.0, "fraction"),
    "sm_load_gbs": (50.0, 10_000.0, "GB/s"),
    "nvlink_gbs_per_direction": (100.0, 100_000.0, "GB/s"),
    "nvlink_peer_gbs": (10.0, 100_000.0, "GB/s"),
    "nvlink_efficiency": (0.05, 1.0, "fraction"),
    "nvlink_latency_ns": (0.01, 10_000.0, "ns"),
    "launch_ns": (0.01, 1_000_000.0, "ns"),
    "grid_sync_ns": (0.01, 1_000_000.0, "ns"),
    "nvl_barrier_ns": (0.01, 1_000_000.0, "ns"),
    "atomic_same_address_ns": (0.01, 10_000.0, "ns"),
    "tma_latency_ns": (0.01, 5_000.0, "ns"),
    "pull_latency_ns": (0.01, 10_000.0, "ns"),
    "l1_epilogue_thread_ns_per_elem": (0.01, 300.0, "ns"),
    "l2_epilogue_thread_ns_per_elem": (0.01, 300.0, "ns"),
    "block_overhead_ns": (0.01, 10_000.0, "ns"),
    "sm90_mma_fraction": (0.05, 1.0, "fraction"),
    "sm90_promotion_ns_per_row": (0.0, 100.0, "ns"),
    "e2m1_decode_thread_ns_per_elem": (0.01, 20.0, "ns"),
    "stage_handoff_ns": (0.01, 5_000.0, "ns"),
    "sm90_count_ns": (0.01, 1_000_000.0, "ns"),
    "sm90_count_item_ns": (0.0, 10_000.0, "ns"),
    "sm90_count_pair_ns": (0.0, 1_000_000.0, "ns"),
    "sm90_combine_start_ns": (0.0, 100_000.0, "ns"),
    "sm90_combine_start_pair_ns": (0.0, 100_000.0, "ns"),
    "sm90_local_count_ns": (0.01, 1_000_000.0, "ns"),
    "sm90_first_fill_ns": (0.01, 100_000.0, "ns"),
    "sm90_first_kloop_ns": (0.0, 100_000.0, "ns"),
    "sm90_fetch_counts_ns": (0.0, 100_000.0, "ns"),
    "pull_fold_chunk_ns": (0.01, 5_000.0, "ns"),
    "sm90_pull_base_ns": (0.01, 100_000.0, "ns"),
    "sm90_pull_warp_ns": (0.0, 1_000.0, "ns"),
    "sm90_pull_pair_ns": (0.01, 100_000.0, "ns"),
    "sm90_issue_kblock_ns": (0.01, 5_000.0, "ns"),
    "sched_block_ns": (0.01, 10_000.0, "ns"),
    "sched_ahead_ns": (0.01, 10_000.0, "ns"),
    "sched_desc_ns": (0.01, 10_000.0, "ns"),
    "sm90_pair_share": (1.0, 4.0, ""),
    "sm90_pair_share_first": (1.0, 2.0, ""),
    "sched_step_ns": (0.01, 10_000.0, "ns"),
    "sched_skip_ns": (0.01, 10_000.0, "ns"),
    "sm90_mask_seen_ns": (0.0, 100_000.0, "ns"),
    "sm90_mask_seen_relay_ns": (0.0, 100_000.0, "ns"),
    "l2_epilogue_fixed_ns": (0.01, 10_000.0, "ns"),
    "l2_epilogue_ep_ns": (0.01, 10_000.0, "ns"),
    "combine_round_ns": (0.01, 100_000.0, "ns"),
    "combine_round_serial_ns": (0.01, 100_000.0, "ns"),
    "block_jitter": (0.0, 0.5, ""),
    "legacy_launch_ns": (0.01, 1_000_000.0, "ns"),
    "legacy_a2a_latency_ns": (0.01, 1_000_000.0, "ns"),
}
assert set(FIGURE_RANGES) == set(_FIGURES)


def _is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _num(x: float) -> str:
    """A figure as written in messages: ``100000``, ``0.01``, ``1e-06``."""
    x = float(x)
    if math.isfinite(x) and x.is_integer() and abs(x) < 1e16:
        return str(int(x))
    return f"{x:.6g}"


def _range_text(k: str) -> str:
    lo, hi, unit = FIGURE_RANGES[k]
    return f"[{_num(lo)}, {_num(hi)}]" + ("" if unit in ("", "fraction") else f" ({unit})")


def in_range(k: str, v: float) -> bool:
    """Whether the number ``v`` lies in figure ``k``'s closed range (:data:`FIGURE_RANGES`; a
    non-finite ``v`` never does)."""
    lo, hi, _ = FIGURE_RANGES[k]
    return lo <= v <= hi


def check_figure(k: str, v: float, field: str | None = None) -> None:
    """Raise :class:`InputError` on ``field`` (default ``hardware.figures.<k>``) unless the
    number ``v`` lies in figure ``k``'s range (a non-finite ``v`` never does)."""
    unit = FIGURE_RANGES[k][2]
    kind = "an integer" if k in _INTS else "a fraction" if unit == "fraction" else "a number"
    require(in_range(k, v), field or f"hardware.figures.{k}", f"{kind} in {_range_text(k)}", v)


def check_hardware(hw: Hardware) -> None:
    """Raise :class:`InputError` on ``hardware.<figure>`` unless every figure of ``hw`` is a number
    (not a bool) in its range (:data:`FIGURE_RANGES`; the counts integers): a :class:`Hardware` made
    with ``dataclasses.replace`` skips :func:`parse_hardware`'s checks, and a negative, NaN or
    out-of-range figure would otherwise fail deep in the simulation or run silently."""
    for k in _FIGURES:
        v = getattr(hw, k)
        _check_value(k, v, f"hardware.{k}", shown(v))


def _check_value(k: str, v, field: str, shown_as: str) -> None:
    """Raise :class:`InputError` on ``field`` unless ``v`` is a number (not a bool; ``shown_as``
    is how the message spells it) in figure ``k``'s range, an integer for a count."""
    require(_is_number(v), field, "a number", shown_as)
    check_figure(k, v, field)
    if k in _INTS:
        require(float(v).is_integer(), field, "an integer", v)


#: The prefix :func:`resolve_base` puts before an inherited figure's source (read back by
#: :func:`inherited_from`).
_INHERITED = "estimate: {name}'s figure ({preset})"


def inherited_from(source: str) -> tuple[str, str] | None:
    """``(preset, the preset's own source)`` for a source :func:`resolve_base` wrote for a figure a
    file takes from its base preset, else None."""
    import re

    m = re.match(r"estimate: .*?'s figure \((\w+)\): (.*)", source, re.S)
    return (m.group(1), m.group(2)) if m else None


def resolve_base(data: dict, seen: tuple[str, ...] = ()) -> dict:
    """A parsed hardware document with its ``base`` preset filled in: the figures and sources the
    document does not give are the base preset's (itself resolved), each inherited source prefixed
    ``estimate: <base name>'s figure (<preset>): `` so that :meth:`Hardware.is_estimate` counts
    it; the result has no ``base`` key. A document without ``base`` is returned as it is.

    Raises:
        InputError: ``base`` not a preset name (``hardware.base``), or a chain of bases that
            comes back to a preset already in it; a source for a figure the document does not give
            (``hardware.sources``: it would relabel the inherited figure).
    """
    if not isinstance(data, dict) or "base" not in data:
        return data
    base = data["base"]
    path = preset_path(base)
    require(path is not None, "hardware.base", f"a preset name ({', '.join(preset_names())})", shown(base))
    base = path.stem
    require(base not in seen, "hardware.base", "a chain of presets that does not come back to one of them",
            " -> ".join((*seen, base)))
    parent = resolve_base(tomllib.loads(path.read_text()), (*seen, base))
    out = {k: v for k, v in data.items() if k != "base"}
    figs, srcs = data.get("figures", {}), data.get("sources", {})
    if not (isinstance(figs, dict) and isinstance(srcs, dict)):
        return out  # parse_hardware names the bad table
    stray = sorted(map(str, set(srcs) - set(figs)))  # a source would relabel an inherited figure
    require(not stray, "hardware.sources", f"sources only for the figures this file gives (the others are "
            f"{parent['name']}'s, sourced there)", ", ".join(stray))
    if "arch" not in out and "arch" in parent:  # a GPU of the base's family unless the file says
        out["arch"] = parent["arch"]
    inherited = [k for k in parent["figures"] if k not in figs]
    out["figures"] = {**{k: parent["figures"][k] for k in inherited}, **figs}
    prefix = _INHERITED.format(name=parent["name"], preset=base)
    out["sources"] = {**{k: f"{prefix}: {parent['sources'][k]}" for k in inherited if k in parent["sources"]}, **srcs}
    return out


def parse_hardware(data: dict, path: str = "<dict>") -> Hardware:
    """Validate a parsed hardware TOML document (with its ``base`` preset filled in first:
    :func:`resolve_base`).

    Raises:
        InputError: not a table, a key other than name, arch, base, figures and sources at the top level (a
            typo would otherwise be ignored), a missing or non-numeric figure, a figure outside its range
            (:data:`FIGURE_RANGES`: e.g. a negative or infinite bandwidth, an efficiency above
            1), a non-integer count, a figure without a source, an empty name or source, or a
            figure or source key that names no figure (checked first, with the nearest name: a
            misspelt key would otherwise be ignored or reported as the right one missing), an
            ``arch`` not in :data:`ARCHS`.
    """
    require(isinstance(data, dict), "hardware", "a table (name, [figures], [sources])", type(data).__name__)
    extra = sorted(set(data) - {"name", "arch", "base", "figures", "sources"})
    require(not extra, "hardware", "only name, arch, base, [figures] and [sources] at the top level",
            ", ".join(map(str, extra)))
    data = resolve_base(data)
    arch = data.get("arch", "")
    require(arch == "" and "arch" not in data or arch in ARCHS, "hardware.arch", " or ".join(map(repr, ARCHS)),
            shown(arch))
    name = data.get("name")
    require(isinstance(name, str) and name.strip() != "", "hardware.name", "a non-empty string",
            "missing" if name is None else shown(name))
    figs = data.get("figures")
    require(isinstance(figs, dict), "hardware.figures", "a [figures] table",
            "missing" if figs is None else type(figs).__name__)
    srcs = data.get("sources", {})
    require(isinstance(srcs, dict), "hardware.sources", "a [sources] table", type(srcs).__name__)
    # keys that name no figure first: a misspelt figure would otherwise be reported as the right
    # one missing
    for table, keys in (("figures", figs), ("sources", srcs)):
        unknown = sorted(map(str, set(keys) - set(_FIGURES)))
        require(not unknown, f"hardware.{table}", "figure names only (sim.hardware.Hardware's fields)",
                ", ".join(_with_hint(u) for u in unknown))
    vals = {}
    for k in _FIGURES:
        require(k in figs, f"hardware.figures.{k}", "a number", "missing")
        v = figs[k]
        _check_value(k, v, f"hardware.figures.{k}",
                     ("true" if v else "false") if isinstance(v, bool) else shown(v))  # as the TOML spells it
        if k in _INTS:
            v = int(v)
        require(isinstance(srcs.get(k), str) and srcs[k].strip() != "", f"hardware.sources.{k}",
                "a non-empty source string", shown(srcs[k]) if k in srcs else "missing")
        vals[k] = float(v) if k not in _INTS else v
    return Hardware(name=name, sources=dict(srcs), path=path, arch=arch, **vals)


def _with_hint(key: str) -> str:
    """``key`` with the nearest figure name, where one is close (a misspelling)."""
    near = difflib.get_close_matches(key, _FIGURES, n=1)
    return f"{key} (did you mean {near[0]}?)" if near else key


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.toml"))


def preset_path(spec: object) -> Path | None:
    """The preset TOML that ``spec`` names (a preset name in any case: ``H100`` is ``h100``), or
    None when ``spec`` is no preset name (a path, a misspelling, not a string)."""
    return PRESET_DIR / f"{spec.lower()}.toml" if isinstance(spec, str) and spec.lower() in preset_names() else None


def hardware_path(spec: str) -> Path:
    """The file a hardware spec names: its preset's TOML when ``spec`` is a preset name
    (case-insensitive), else ``spec`` itself as a path (not checked here)."""
    return preset_path(spec) or Path(spec)


def load_hardware(spec: str) -> Hardware:
    """Load a preset (``b200``, ``h200``, ``h100``, ``h20``; case-insensitive) or a TOML path.

    Raises:
        InputError: ``spec`` not a non-empty string, unknown preset, unreadable file, or an
            invalid figure.
    """
    require(isinstance(spec, str) and spec != "", "hardware", "a preset name or a .toml path",
            type(spec).__name__ if not isinstance(spec, str) else "an empty string")
    p = hardware_path(spec)
    if preset_path(spec) is None:  # a path
        require(spec.lower().endswith(".toml") or os.sep in spec, "hardware",
                f"a preset ({', '.join(preset_names())}) or a .toml path",
                shown_text(spec))  # ' h100': the space shown
        require(p.is_file(), "hardware", "an existing TOML file", spec)
    try:
        data = tomllib.loads(p.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise InputError("hardware", "a UTF-8 TOML file",
                         f"{p} (byte 0x{exc.object[exc.start]:02x} at offset {exc.start} is not UTF-8)") from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError("hardware", "valid TOML", f"{p}: {exc}") from None
    except OSError as exc:
        raise InputError("hardware", "a readable .toml file", f"{p} ({exc.strerror})") from None
    try:  # the message names the file
        return parse_hardware(data, str(p))
    except InputError as exc:
        raise InputError(exc.field, exc.expected, f"{exc.got!r} in {p}" if not isinstance(exc.got, str)
                         else f"{exc.got} in {p}") from None
