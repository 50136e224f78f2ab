"""SimPy processes of one Mega MoE call: every rank, every 2-CTA cluster, every warp role.

Granularity (DESIGN.md: block granularity, never per cycle):

* **Dispatch** (one process per rank, standing for the dispatch warps of all its SMs): count,
  per-expert send counts (global atomics, serialised per address across SMs), source-index
  exchange, grid sync, expert counts to the owners, NVLink barrier (a true cross-rank
  barrier: every rank waits for the last), then pulls.  The SM90 design at one rank (kernel
  v8.5+) instead counts each CTA's share of the items (``sm90_count_ns`` +
  ``sm90_count_item_ns`` per item of the largest share, and ``sm90_count_pair_ns`` more at two
  CTAs per SM) and meets at its count barrier (``grid_sync_ns``) before the pulls; where the plan runs the wide instance
  (``RankPlan.local_count``, kernel v8.9) every CTA counts all items itself and the pulls
  start ``sm90_local_count_ns`` after the launch, with no barrier.  All ``4 * SMs`` dispatch warps walk
  the rank's pool tokens (experts in order, each in the plan's round-robin min-remaining
  order) with stride ``4 * SMs``; one event per *round* of ``4 * SMs`` concurrent pulls, each
  pull moving ``hidden`` FP8 bytes + scales in ``bytes_per_pull`` chunks over the source
  GPU's NVLink egress and this GPU's ingress (local tokens over HBM).  A pool block's
  arrival count completes when the round holding its last token ends (chain 1).
* **GEMM** (one process per 2-CTA cluster, i.e. SMs ``2c`` and ``2c+1``, which the scheduler
  keeps on the same (expert, m block) with adjacent n blocks): the plan's block sequence.
  For each block the TMA-A/TMA-B loaders wait for the dependency (arrival count for L1,
  arrival-mask bits for L2), the K loop is one pipelined interval at ``max(tensor-core time,
  SM load time)`` per K block, with the ``num_stages`` ring letting the next block's loads
  start while the previous K loop runs; first-touch bytes of weights and activations are
  charged to HBM (later touches hit L2).  The MMA of block ``i`` needs TMEM stage ``i % 2``,
  freed when the epilogue of block ``i - 2`` ends (chains 2 and 4).  The L1 epilogue
  (SwiGLU, amax, UE8M0, FP8) sets the arrival-mask bits of its n-block pair; an L2 K block
  needs the gate and up halves of its L1 pair (chain 3, ``l2_wait = "k_block"``) or the
  whole pool block (``"pool_block"``).  The L2 epilogue writes BF16 rows to each token's
  source rank over NVLink (chain 5 starts here).
* **Combine**: the final NVLink barrier waits for every cluster's last write on every rank,
  then each rank reduces its valid slots (HBM bound).

The SM90 design (``megamoe-sm90``, this project's kernel, ``csrc/megamoe/kernel_sm90.cu``)
differs where the kernel does: one CTA per SM (units of one SM), or two at block_m 16 without
the wide walk at one rank (kernel v9.2, ``RankPlan.ctas_per_sm``: units of one CTA at half the
SM's load rate; unit ``c`` below ``S / 2`` is the first CTA of SM ``c``, whose consumer and producer
times are ``sm90_pair_share_first`` times a lone CTA's, and unit ``c + S / 2`` its second, whose
block is priced so where the first is idle when the block's K loop starts and at
``sm90_pair_share`` where the first is inside a block; benchmarks/NOTES_kernel.md, session 38); at
two CTAs per SM the units take the block list's rows by ticket (kernel v9.3,
``RankPlan.block_tickets``: one counter per rank, a row taken when the unit's producer is ready for
it, paying ``tma_latency_ns`` for the ticket's round trip) instead of the static deal; the consumer warps decode,
run the MMA and both epilogues, so a block's K loop waits for the previous block's epilogue
and then for the block scheduler's walk (``sched_block_ns`` plus ``sched_step_ns`` per
chunk scan and ``sched_skip_ns`` per chunk skip, :func:`sm90_walk_steps`; at the block_m where
the consumers walk inside the epilogue, ``WALK_IN_EPILOGUE``, ``sched_ahead_ns`` for the fixed
part; where they read the producer's block descriptors, ``BLOCK_DESCRIPTORS``, ``sched_desc_ns``
and no walk); the producer pays the whole walk after its last copy
issue, which comes ``K blocks x sm90_issue_kblock_ns`` after its first (the producer warps
issue one stage's loads in that time; since kernel v6.3 faster than the consumers use them,
so the ring paces them), one issue after
the consumers free the stage a ring back (``min(stages, K blocks)`` K blocks before the K
loop's end), and, in L2, ``K blocks - i`` issues after K block ``i``'s arrival-mask bits,
whichever is latest; the consumers cannot finish the K loop before the last stage's data
arrives; a unit's first block's first stage lands ``sm90_first_fill_ns`` after its issue, the
ring's first fill at the call's start, the later blocks' ``tma_latency_ns``, and where the kernel
paces that fill by arrivals (block_m 16) its K loop runs ``sm90_first_kloop_ns`` longer; before its first walk a
unit's schedulers read the published counts, ``sm90_fetch_counts_ns`` at its share); the L2
epilogue grows with the valid rows (and with several ranks pays ``l2_epilogue_ep_ns`` for
storing through the symmetric-memory peer table); each CTA pulls a contiguous range of
items (EP1: an even split of the T K items, sorted by expert, so pool blocks complete in wave order; EP: pool
positions, a remote one paying ``SM90_REMOTE_ROUND_TRIPS`` NVLink round trips, one round's
latency growing with its share of remote items), a round lasting ``sm90_pull_base_ns`` plus
``sm90_pull_warp_ns`` per dispatch warp pulling on the GPU plus a warp's fold rounds
(``pull_fold_chunk_ns`` each), and a CTA with one item (EP1, block_m 16) pulling it with its four
warps, a quarter of the fold rounds each (at two CTAs per SM in ``sm90_pull_pair_ns`` besides
them, not the line), its pool blocks landing apart from the round's; the combine takes grid-stride
rounds of
``combine_round_ns``.

Shared resources: HBM per GPU, NVLink egress and ingress per GPU (one direction each) and,
where a GPU pair is slower than a GPU's port (``nvlink_peer_gbs``, e.g. point-to-point
links without a switch), each directed link, as :class:`BandwidthCalendar`; the
tensor-core rate and TMA load rate are per SM.
"""

from __future__ import annotations

import gc
import heapq
import math
from dataclasses import dataclass, field
from itertools import repeat
from operator import sub

import numpy as np
import simpy

from megamoe.design_sm90 import (
    BLOCK_DESCRIPTORS,
    FIRST_FILL_PER_SM,
    ONE_ITEM_PULL_WARPS,
    RELAY_RELEASE,
    SCHED_CHUNK,
    WALK_IN_EPILOGUE,
    combine_slots,
    cta_item_starts,
    fold_rounds,
    l1_promoted_once,
    wgmma_n,
    wide_walk,
)
from megamoe.errors import InputError
from megamoe.plan import L1, Plan
from megamoe.scenario import Scenario
from megamoe.trace import COLUMNS, KIND, ROLE, Trace

from .hardware import Hardware, check_hardware, load_hardware

BUCKET_NS = 250.0
#: Most bandwidth-calendar buckets one simulation keeps over all its resources (HBM, NVLink
#: egress / ingress per GPU, per GPU pair): memory grows with *simulated* time, ~45 bytes per
#: bucket (two Python lists), so 2^27 buckets is ~6 GB, beside the ~9 GB ``MAX_BLOCKS`` allows
#: on the 24 GB CI machine. The default scenario (EP8, 24 calendars, 3.3 ms) takes ~0.3 M;
#: 16 ranks x 131072 tokens of V4-Pro on B200 (~0.5 s) ~100 M; slow hardware figures or very
#: few SMs stretch simulated time until this refuses the run (an InputError, not an
#: out-of-memory kill).
MAX_CALENDAR_BUCKETS = 1 << 27
#: Most blocks (L1 + L2, all ranks) one simulation takes: the engine keeps ~1 KB per block
#: (trace rows, events). 7.9 M blocks measured 8.8 GB and 95 s on the CI machine (24 GB,
#: 2 cores; 256 ranks x 8192 tokens, shape 256,6,4096,5632).
MAX_BLOCKS = 8_000_000
DISPATCH_WARPS_PER_SM = 4
WITH_SCALES = 1 + 1 / 32  # FP8 / FP4 data plus one UE8M0 byte per 32 elements
# The SM90 kernel's pools also hold each token's scale as FP32 per 64-K group (Params::l1_pool_fsx,
# l2_pool_fsx; kernel v7.5): bytes per activation element. The pulls and the L1 epilogue write
# them beside the UE8M0 bytes, and the producer copies them instead of the bytes.
SM90_FSX = 4 / 64
SM90_THREADS = 512  # threads per CTA of the SM90 kernel (megamoe.design_sm90.THREADS)
# dependent NVLink round trips of one remote pull in the SM90 kernel's EP dispatch
# (csrc/megamoe/kernel_sm90.cu dispatch_role_ep): the row in two batches of four 16-byte
# loads per lane, the scales, the top-k weight; a remote item costs a local one plus these
# round trips of nvlink_latency_ns (the H200's is fitted to that excess in the EP2 traces,
# sim.calibrate.fit_sm90_ep_traces)
SM90_REMOTE_ROUND_TRIPS = 4


class BandwidthCalendar:
    """A bandwidth resource as a calendar of fixed time buckets.

    Each bucket of ``BUCKET_NS`` holds ``rate * BUCKET_NS`` bytes.  :meth:`reserve` places a
    transfer's bytes into the earliest free capacity at or after its request time and returns
    when the last byte moves.  Capacity is conserved whatever order reservations come in, so
    concurrent transfers share the bandwidth instead of queueing behind a single holder.
    Full buckets are skipped through forward pointers with path compression.
    """

    __slots__ = ("rate", "cap", "full", "used", "nxt", "total_bytes", "budget")

    def __init__(self, bytes_per_ns: float, budget: list[int] | None = None):
        """``budget``: a one-item list of buckets left, shared by the calendars of one
        simulation (default: a budget of ``MAX_CALENDAR_BUCKETS`` of its own)."""
        self.rate = bytes_per_ns
        self.cap = bytes_per_ns * BUCKET_NS
        self.full = self.cap * 0.999
        self.budget = [MAX_CALENDAR_BUCKETS] if budget is None else budget
        self.used: list[float] = []
        self.nxt: list[int] = []  # nxt[b] == b: bucket b has room
        self._grow(0)
        self.total_bytes = 0.0

    def _grow(self, b: int) -> None:
        n = len(self.used)
        extra = max(4096, b + 2 - n)
        self.budget[0] -= extra
        if self.budget[0] < 0:
            raise InputError("simulated time", f"at most {MAX_CALENDAR_BUCKETS} bandwidth-calendar buckets of "
                             f"{BUCKET_NS:g} ns over all resources (memory grows with simulated time; slow "
                             "hardware figures or few SMs stretch it)",
                             f"a resource busy beyond {(b + 1) * BUCKET_NS / 1e6:.3g} ms")
        self.used.extend([0.0] * extra)
        self.nxt.extend(range(n, n + extra))

    def _find(self, b: int) -> int:
        """First bucket at or after ``b`` with room (grows the calendar as needed)."""
        nxt = self.nxt
        if b + 1 >= len(nxt):
            self._grow(b)
        r = b
        while nxt[r] != r:
            r = nxt[r]
            if r + 1 >= len(nxt):
                self._grow(r)
        while nxt[b] != r:  # path compression
            nxt[b], b = r, nxt[b]
        return r

    def reserve(self, t: float, nbytes: float) -> float:
        """Place ``nbytes`` from time ``t`` (ns); returns the finish time (ns)."""
        if nbytes <= 0:
            return t
        self.total_bytes += nbytes
        rate = self.rate
        used = self.used
        b = int(t / BUCKET_NS)
        # the start bucket, or (common when the resource is saturated) the bucket its skip
        # pointer names when that one has room; anything else takes the general search
        nxt = self.nxt
        try:
            r = nxt[b]
            if r != b:
                if r + 1 >= len(nxt) or nxt[r] != r:
                    r = self._find(b)
                b = r
                t = b * BUCKET_NS
        except IndexError:
            self._grow(b)
        # first bucket: only the part after t is available (used capacity packs at its start)
        u = used[b]
        start = b * BUCKET_NS + u / rate
        if start < t:
            start = t
        avail = ((b + 1) * BUCKET_NS - start) * rate
        if avail >= nbytes:  # fast path: fits in the first bucket
            u += nbytes
            used[b] = u
            if u >= self.full:
                nxt[b] = b + 1
            return start + nbytes / rate
        return self._spill(b, avail, nbytes)

    def _spill(self, b: int, avail: float, nbytes: float) -> float:
        """The rest of :meth:`reserve` when the transfer does not fit in bucket ``b``."""
        rate, used, nxt = self.rate, self.used, self.nxt
        if avail > 0:
            used[b] += avail
            nbytes -= avail
            if used[b] >= self.full:
                nxt[b] = b + 1
        cap = self.cap
        while True:
            b += 1
            if b + 1 >= len(nxt) or nxt[b] != b:
                b = self._find(b)
            free = cap - used[b]
            if free >= nbytes:
                used[b] += nbytes
                if used[b] >= self.full:
                    nxt[b] = b + 1
                return b * BUCKET_NS + used[b] / rate
            used[b] = cap
            nxt[b] = b + 1
            nbytes -= free


@dataclass
class SimResult:
    """Output of :func:`simulate`.

    Attributes:
        scenario: the inputs.
        hardware: the hardware model used.
        plan: every scheduling decision.
        trace: all intervals (:class:`megamoe.trace.Trace`).
        rank_end_ns: ``[R]`` kernel end per rank (after combine).
        t_reduction_ns: ``[R]`` combine reduction time per rank.
        hbm_bytes_sim, nvlink_bytes_sim: ``[R]`` bytes the simulation moved (HBM; NVLink egress).
        num_events: SimPy events processed.
        summary: the metrics (see :mod:`sim.metrics`).
    """

    scenario: Scenario
    hardware: Hardware
    plan: Plan
    trace: Trace
    rank_end_ns: np.ndarray
    t_reduction_ns: np.ndarray
    hbm_bytes_sim: np.ndarray
    nvlink_bytes_sim: np.ndarray
    num_events: int = 0
    summary: dict = field(default_factory=dict)


def sm90_walk_steps(rp) -> tuple[np.ndarray, np.ndarray]:
    """Scheduler steps of the SM90 kernel (``csrc/megamoe/scheduler.cuh``) from the start of
    the block list to each block of ``rp.blocks()``, and to the end of the list, as chunk
    scans and chunk skips.

    The scheduler walks passes, L1 then L2 of each wave, each over the wave's experts in
    chunks of 32 (one per warp lane); a call walks chunks from the chunk of the CTA's previous
    block until one holds its next block.  A step is a chunk walked beyond the first of a call
    (the first is in ``sched_block_ns``): a CTA's walk from one of its blocks to the next is
    the difference of their counts, and the end of the list is one step short of every chunk
    of every pass.  A step is a scan (``sched_step_ns``: a warp scan and a ballot), or a skip
    (``sched_skip_ns``: one warp reduction) in a wave of more than one chunk where the kernel
    runs its wide-walk instance (:func:`megamoe.design_sm90.wide_walk`, kernel v8.7).

    In the wave-lag order (``rp.wave_lag``, kernel v9.4: the two-CTA producer puts the walk at
    the first chunk of each taken block's pass, ``Scheduler::seek``) a block's count is the chunks
    of its own pass before its chunk, and the end's is zero: no walk carries from one block to the
    next.

    Returns:
        int64 ``[N, 2]`` (scans, skips) from the start to each block, and int64 ``[2]`` the same
        to the end.
    """
    E, epw = len(rp.tokens_per_expert), rp.experts_per_wave
    if rp.wave_lag:
        blk = rp.blocks().astype(np.int64)
        steps = np.zeros((len(blk), 2), np.int64)
        steps[:, 0] = blk[:, 1] // SCHED_CHUNK - (blk[:, 1] // epw * epw) // SCHED_CHUNK
        return steps, np.zeros(2, np.int64)
    w0 = np.arange(0, E, epw)
    w1 = np.minimum(w0 + epw, E)
    chunks = (w1 - 1) // SCHED_CHUNK - w0 // SCHED_CHUNK + 1  # chunks a wave's experts span
    wide = wide_walk(rp.config.block_m, epw) & (w1 - w0 > SCHED_CHUNK)
    per_pass = np.repeat(chunks, 2)  # pass 2w: L1 of wave w, 2w + 1: L2
    wide_pass = np.repeat(wide, 2)
    cum = np.zeros((len(per_pass) + 1, 2), np.int64)
    cum[1:, 0] = np.cumsum(np.where(wide_pass, 0, per_pass))
    cum[1:, 1] = np.cumsum(np.where(wide_pass, per_pass, 0))
    blk = rp.blocks().astype(np.int64)
    w_b = blk[:, 1] // epw
    p_b = 2 * w_b + blk[:, 0] - 1
    # chunks up to and including each block's own (a walk costs the chunks after the previous
    # block's, up to the next block's, each by its own pass), less the list's first chunk
    steps = cum[p_b].copy()
    steps[np.arange(len(blk)), wide_pass[p_b].astype(np.int64)] += blk[:, 1] // SCHED_CHUNK - w0[w_b] // SCHED_CHUNK + 1
    first = np.zeros(2, np.int64)
    first[int(wide_pass[0])] = 1
    return steps - first, cum[-1] - first


_NO_JITTER = (1.0, 1.0)
#: The block jitter of rank ``r`` draws from ``numpy.random.default_rng([seed, JITTER_STREAM, r])``
#: (the routing draws from ``[seed, r]``, its hot-expert permutation from ``[seed, 1_000_003]``).
JITTER_STREAM = 0x6A177E5


def block_jitter(block_ids: np.ndarray, sigma: float, seed: int) -> list | None:
    """Each block's K-loop and epilogue time factors, or ``None`` where ``sigma`` is 0 (every factor
    1: the deterministic model).

    Args:
        block_ids: int ``[n, 9]``, the engine's block table (``_Engine.block_ids``: rank, unit,
            phase, expert, m block, n block, wave, valid rows, K part).
        sigma: the hardware's ``block_jitter``, the standard deviation of a factor's natural log.
        seed: the scenario's seed.

    Returns:
        ``[n]`` pairs (K loop, epilogue) of independent log-normal draws ``exp(N(0, sigma))``
        (median 1), in block-id order. Rank ``r`` draws ``[n_r, 2]`` from
        ``numpy.random.default_rng([seed, JITTER_STREAM, r])`` and gives them to its blocks sorted by
        (phase, expert, m block, n block, K part), so a block keeps its factors whatever unit runs it
        and whatever the plan's order: two what-ifs with the same blocks (another wave width, policy
        or SM count) meet the same draws (common random numbers).

    Without the jitter the model's identical blocks run in lockstep, and the ties between the two
    CTAs of an SM resolve the same way on every SM, which moved few-token makespans by up to 8 points
    for a 0.2% change of a figure (benchmarks/NOTES.md, forty-seventh session)."""
    if sigma == 0:
        return None
    out = np.empty((len(block_ids), 2))
    ranks = block_ids[:, 0]
    for r in np.unique(ranks).tolist():
        mine = np.flatnonzero(ranks == r)
        b = block_ids[mine]
        order = np.lexsort((b[:, 8], b[:, 5], b[:, 4], b[:, 3], b[:, 2]))  # phase, expert, m, n, K part
        out[mine[order]] = np.random.default_rng([seed, JITTER_STREAM, r]).lognormal(0.0, sigma, (len(mine), 2))
    return out.tolist()


class _Engine:
    def __init__(self, plan: Plan, hw: Hardware, launch_offsets_ns=None, seed: int = 0):
        # seed: the scenario's, for the block jitter (block_jitter)
        self.plan, self.hw = plan, hw
        self.launch_offsets_ns = [0.0] * plan.num_ranks if launch_offsets_ns is None else list(launch_offsets_ns)
        self.env = simpy.Environment()
        R = plan.num_ranks
        budget = [MAX_CALENDAR_BUCKETS]  # shared by every calendar of this simulation
        self.hbm = [BandwidthCalendar(hw.hbm_bytes_per_ns, budget) for _ in range(R)]
        self.egress = [BandwidthCalendar(hw.nvlink_bytes_per_ns, budget) for _ in range(R)]
        self.ingress = [BandwidthCalendar(hw.nvlink_bytes_per_ns, budget) for _ in range(R)]
        # one calendar per directed GPU pair, only where a pair is slower than a GPU's port
        # (a link carries a subset of one port's bytes, so an equal or faster link never binds)
        self.links = None
        if hw.nvlink_peer_gbs < hw.nvlink_gbs_per_direction and R > 1:
            rate = hw.nvlink_peer_gbs * hw.nvlink_efficiency
            self.links = [[BandwidthCalendar(rate, budget) for _ in range(R)] for _ in range(R)]
        self.rows: list[tuple] = []      # rank-level intervals (COLUMNS order, codes)
        # per block, in simulation order, 9 numbers: block id, load start, MMA start, MMA end,
        # epilogue start, epilogue end, dependency, first-touch bytes, ring stage free; the
        # block id indexes self.block_ids (rank, cluster, phase, expert, m, n, wave, valid rows,
        # K part)
        self.blocks: list[float] = []
        self.n_events = 0
        # per rank state
        self.arrival = []        # pool block -> arrival time (nan until known)
        self.arrival_ev = []     # pool block -> Event (lazily)
        self.l1_done = []        # pool block -> array of L1 pair epilogue ends
        self.l1_left = []        # pool block -> pairs still to finish
        self.l1_ev = []
        self.ready_cache = []    # (pool block, K part) -> L2 K-block readiness times
        self.xchg = []           # split-K: (phase, pool block, n block) -> [parts done, last end, Event]
        self.touched_w = []      # (phase, expert, n pair, K part) seen
        self.touched_a = []      # (phase, pool block, K part) seen
        self.counts_ready = [None] * R
        self.last_write = np.zeros(R)
        self.cluster_end = np.zeros(R)
        self.tables = []         # per rank: constants of the GEMM loop (see _rank_tables)
        self.ticket = [[0] for _ in range(R)]  # per rank: the next row of the block list to take (block_tickets)
        # per rank at two CTAs per SM (SM90): per first CTA of an SM, the K-loop start and epilogue end of
        # its previous and its latest block, ns (its partner's block is priced by them, see cluster)
        self.busy = [[[0.0] * 4 for _ in range(rp.num_sms // 2)] if rp.ctas_per_sm == 2 else None
                     for rp in plan.ranks]
        ids = []
        for rp in plan.ranks:
            nb = int(rp.pool_block_offset[-1])
            self.arrival.append([None] * nb)
            self.arrival_ev.append({})
            self.l1_done.append([[0.0] * rp.l1_n_blocks for _ in range(nb)])
            self.l1_left.append([rp.l1_n_blocks] * nb)
            self.l1_ev.append({})
            self.ready_cache.append({})
            self.xchg.append({})
            e_loc = len(rp.recv_counts)
            self.touched_w.append([False] * (3 * e_loc * max(rp.l1_n_blocks, rp.l2_n_blocks) * rp.k_split))
            self.touched_a.append([False] * (3 * (nb + 1) * rp.k_split))
            self.tables.append(self._rank_tables(rp, ids))
        self.block_ids = (np.concatenate(ids) if ids else np.zeros((0, 9), np.int64)).astype(np.int32)
        self.jitter = block_jitter(self.block_ids, hw.block_jitter, seed)  # per block: K loop, epilogue
        # an NVLink barrier across ranks; with one rank it is a grid sync
        self.barrier_ns = hw.nvl_barrier_ns if plan.num_ranks > 1 else hw.grid_sync_ns
        self.pre_pull_arrivals = 0
        self.pre_pull_times = np.zeros(R)
        self.pre_pull_done = self.env.event()
        self.counts_done = [self.env.event() for _ in range(R)]  # counts_ready[r] set

    def _rank_tables(self, rp, ids: list) -> tuple:
        """Constants of one rank's GEMM loop, built once: per cluster, the columns of its block
        rows (with ``rp.block_tickets`` one column set of all rows in list order, and instead of
        each unit's walks the chunk steps of :func:`sm90_walk_steps`); per pool block, its valid
        rows, byte counts and L2 write-back targets.  Appends the rank's ``[n, 9]`` block-id table
        to ``ids`` (with tickets its unit column is -1 until a unit takes the row)."""
        plan, r, R = self.plan, rp.rank, self.plan.num_ranks
        cfg = rp.config
        bm, bn, bk, cs = cfg.block_m, cfg.block_n, cfg.block_k, cfg.cluster_size
        S = rp.num_sms  # the units: SMs, or the CTAs at two CTAs per SM (SM90)
        H, I = plan.hidden, plan.intermediate
        tpe = rp.tokens_per_expert
        mbe = -(-tpe // bm)
        pbo = np.concatenate([[0], np.cumsum(mbe)])
        n_pb = int(pbo[-1])
        # pool block -> valid rows (its expert's tokens less the rows before it)
        pb_e = np.repeat(np.arange(len(tpe)), mbe)
        pb_m = np.arange(n_pb) - pbo[pb_e]
        valid = np.minimum(bm, tpe[pb_e] - pb_m * bm).tolist()
        ks = rp.k_split  # split-K: each row of the block list covers 1 / ks of the K blocks
        ktot1, ktot2 = (H // bk) * bk // ks, (I // bk) * bk // ks
        # first-touch activation bytes (FP8 + UE8M0 scales; SM90: + FP32 scales read instead of
        # the bytes) and L1 output bytes per pool block
        sm90 = plan.design == "megamoe-sm90"
        act_f, out_f = (1 + SM90_FSX, WITH_SCALES + SM90_FSX) if sm90 else (WITH_SCALES, WITH_SCALES)
        act1 = [v * ktot1 * act_f for v in valid]
        act2 = [v * ktot2 * act_f for v in valid]
        l1_out = [v * cs * bn / 2 * out_f for v in valid]
        # L2 write-back targets: tokens of each pool block per source rank (pool order)
        src = [rp.pull_order(e)[:, 0] for e in range(len(tpe)) if tpe[e]]
        if src:
            first_tok = np.repeat(np.cumsum(tpe) - tpe, tpe)  # each token's expert's first pool row
            tok_pb = np.repeat(pbo[:-1], tpe) + (np.arange(len(first_tok)) - first_tok) // bm
            frac = np.bincount(tok_pb * R + np.concatenate(src), minlength=n_pb * R).reshape(n_pb, R)
        else:
            frac = np.zeros((n_pb, R), dtype=np.int64)
        row_bytes = cs * bn * 2  # BF16 output row of the unit's CTAs
        irate = self.ingress[0].rate
        ing = [(cal, cal.used, cal.nxt) for cal in self.ingress]
        pbs, js = np.nonzero(frac)  # pool blocks ascending, then source ranks ascending
        nbs = frac[pbs, js] * row_bytes
        # per pool block: local bytes (or None), remote targets in rank order (ingress calendar,
        # its lists, bytes, bytes / rate), remote bytes in all, remote targets as (rank, bytes)
        local = [None] * n_pb
        here = js == r
        for p, nb in zip(pbs[here].tolist(), nbs[here].tolist()):
            local[p] = float(nb)
        pbs, js, nbs = pbs[~here], js[~here].tolist(), nbs[~here]
        entries = list(zip([ing[j][0] for j in js], [ing[j][1] for j in js], [ing[j][2] for j in js],
                           nbs.astype(np.float64).tolist(), (nbs / irate).tolist()))
        pairs = list(zip(js, nbs.tolist()))
        tot = np.zeros(n_pb, dtype=np.int64)
        np.add.at(tot, pbs, nbs)
        bounds = np.searchsorted(pbs, np.arange(n_pb + 1)).tolist()
        wb = list(zip(local, [entries[x:y] for x, y in zip(bounds, bounds[1:])],
                      tot.astype(np.float64).tolist(), [pairs[x:y] for x, y in zip(bounds, bounds[1:])]))
        # per cluster (SMs cs*c .. cs*c+cs-1 run rows cs*c, cs*c + S, ...): loop columns; with
        # block tickets one queue of every row in list order, whose unit (block-id column 1) the
        # run fills in
        blk = rp.blocks().astype(np.int64)
        ph, e, m, n, kp = blk[:, 0], blk[:, 1], blk[:, 2], blk[:, 3], blk[:, 5]
        pb = pbo[e] + m
        e_loc = len(tpe)
        nbw = max(rp.l1_n_blocks, rp.l2_n_blocks)
        key_w = ((ph * e_loc + e) * nbw + n) * ks + kp    # (phase, expert, n pair, K part) first touch
        key_a = (ph * (n_pb + 1) + pb) * ks + kp          # (phase, pool block, K part) first touch
        tickets = rp.block_tickets
        rows = [np.arange(len(blk))] if tickets else [np.arange(cs * c, len(blk), S) for c in range(S // cs)]
        lens = [len(x) for x in rows]
        rows = np.concatenate(rows)
        unit = np.full(len(rows), -1) if tickets else np.repeat(np.arange(len(lens)), lens)
        ids.append(np.column_stack([np.full(len(rows), r), unit, blk[rows, :5],
                                    np.asarray(valid, dtype=np.int64)[pb[rows]], kp[rows]]))
        cols = [x[rows].tolist() for x in (ph, n, pb, key_w, key_a, kp)]
        base = sum(len(x) for x in ids[:-1])
        clusters = []
        a = 0
        for k in lens:
            clusters.append(tuple(x[a:a + k] for x in cols) + (range(base + a, base + a + k),))
            a += k
        hw = self.hw
        threads = cfg.num_epilogue_threads
        if plan.design == "megamoe-sm90":
            # the L2 epilogue: a fixed part, then per element of the block's rows and again
            # per element of its valid rows (only those are stored); with several ranks the
            # rows go through the symmetric-memory peer table, whichever rank they go to
            c = hw.l2_epilogue_thread_ns_per_elem * bn / threads
            fixed = hw.l2_epilogue_fixed_ns + (hw.l2_epilogue_ep_ns if R > 1 else 0.0)
            epi2 = [fixed + c * (bm + v) for v in valid]
            if tickets:  # the walk's chunk steps from the list's start to each row, and to its end
                key, end_key = sm90_walk_steps(rp)
                walks = (key.tolist(), end_key.tolist())
            else:
                walks = self._sm90_walks(rp, rows, lens)
        else:
            epi2 = [hw.l2_epilogue_thread_ns_per_elem * bm * bn / threads] * n_pb
            walks = [(repeat(0.0), 0.0)] * len(lens)
        return clusters, act1, act2, l1_out, wb, epi2, walks, valid

    def _sm90_walks(self, rp, rows, lens) -> list:
        """Per CTA of the SM90 kernel: the scheduler's cost before each of its blocks and after
        its last one, ``[(gaps, end_gap)]`` (see :func:`sm90_walk_steps`): ``sched_block_ns``
        plus ``sched_step_ns`` per chunk scan and ``sched_skip_ns`` per chunk skip.  This is the
        producer's; where the consumers walk inside the epilogue
        (:data:`megamoe.design_sm90.WALK_IN_EPILOGUE`) theirs has ``sched_ahead_ns`` for its
        fixed part, and where they read the producer's block descriptors
        (:data:`megamoe.design_sm90.BLOCK_DESCRIPTORS`) theirs is ``sched_desc_ns`` (:meth:`cluster`)."""
        hw = self.hw
        key, end_key = sm90_walk_steps(rp)
        key = key[rows]
        cost = np.array([hw.sched_step_ns, hw.sched_skip_ns])
        out = []
        a = 0
        for k in lens:
            ks = key[a:a + k]
            steps = np.maximum(np.diff(ks, axis=0, prepend=np.zeros((1, 2), np.int64)), 0)  # a policy's order may walk back: no cost
            end = np.maximum(end_key - (ks[-1] if k else 0), 0)
            out.append(((hw.sched_block_ns + steps @ cost).tolist(), hw.sched_block_ns + float(end @ cost)))
            a += k
        return out

    def _ticket_rows(self, r: int, c: int, cols: tuple, key: list, walked: list, share: float, seek: bool):
        """The rows unit ``c`` of rank ``r`` takes by ticket (``RankPlan.block_tickets``, kernel
        v9.3): each step takes the rank's next row of the block list from its counter (the caller
        has advanced the simulated time to the moment the unit's producer is ready for a row, so
        the units take rows in simulated-time order and the rows start in list order), records
        the unit in the block-id table and gives the row's loop columns (``cols``: the rank's
        rows in list order) with the producer's cost before it, ns: ``sched_block_ns`` plus
        ``sched_step_ns`` per chunk scan and ``sched_skip_ns`` per chunk skip from the unit's
        previous row to this one (``key``: :func:`sm90_walk_steps` per row; a walk back costs
        nothing, as in :meth:`_sm90_walks`), all times ``share``, plus the ticket's atomic add, a
        global-memory round trip priced at ``tma_latency_ns`` (the copy-engine probe's measured
        round trip standing in for the atomic's, which is not measured separately).  Stops when
        the counter passes the end of the list; ``walked`` holds the steps to the unit's latest
        row (the caller's end gap walks on from there). ``seek`` (``RankPlan.wave_lag``, kernel
        v9.4): ``key`` counts each row's steps within its own pass, and ``walked`` stays at zero."""
        hw = self.hw
        ctr, ids = self.ticket[r], self.block_ids
        n = len(cols[0])
        fixed = hw.sched_block_ns * share + hw.tma_latency_ns
        scan, skip = hw.sched_step_ns * share, hw.sched_skip_ns * share
        ph, nb, pb, kw, ka, kp, bid = cols
        while ctr[0] < n:
            i = ctr[0]
            ctr[0] = i + 1
            k0, k1 = key[i]
            gap = fixed + scan * max(k0 - walked[0], 0) + skip * max(k1 - walked[1], 0)
            if not seek:  # the walk carries on from this row (in the wave-lag order it restarts)
                walked[0], walked[1] = k0, k1
            ids[bid[i], 1] = c
            yield ph[i], nb[i], pb[i], kw[i], ka[i], kp[i], bid[i], gap

    # -- dispatch ---------------------------------------------------------------
    def _pre_pull_barrier(self, r: int, sm90_ep1: bool):
        """Rank ``r`` at the barrier before the pulls (every rank must arrive: the NVLink
        barrier, or the SM90 EP1 count barrier, a grid sync); sets ``counts_ready[r]``."""
        env, plan = self.env, self.plan
        self.pre_pull_times[r] = env.now
        self.pre_pull_arrivals += 1
        if self.pre_pull_arrivals == plan.num_ranks:
            # a Python float: it becomes the SimPy clock, which numpy scalars would slow down
            done = float(self.pre_pull_times.max() + self.barrier_ns)
            ev = self.pre_pull_done
            self.env.timeout(done - env.now).callbacks.append(lambda _e: ev.succeed(done))
        start_wait = env.now
        done = yield self.pre_pull_done
        barrier = KIND["grid_sync" if sm90_ep1 else "nvl_barrier"]
        self.rows.append((r, -1, ROLE["dispatch"], barrier, -1, -1, -1, -1, start_wait, done, 0, 0))
        self._counts_ready(r, done)

    def _counts_ready(self, r: int, t: float):
        self.counts_ready[r] = t
        self.counts_done[r].succeed(t)

    def dispatch(self, r: int):
        env, hw, plan = self.env, self.hw, self.plan
        rp = plan.ranks[r]
        T, k, H = rp.num_tokens, plan.top_k, plan.hidden
        S = rp.num_sms  # CTAs (SM90 at two CTAs per SM: twice the SMs)
        t = hw.launch_ns + self.launch_offsets_ns[r]  # a late rank starts late (launch skew)
        items = self.valid_slots[r]
        multi = plan.num_ranks > 1
        sm90_ep1 = plan.design == "megamoe-sm90" and not multi
        local = sm90_ep1 and rp.local_count
        if local:
            # kernel v8.9's wide instance: every CTA counts all T k items itself, no count barrier
            steps = (("count", hw.sm90_local_count_ns, 0),)
        elif sm90_ep1:
            # kernel v8.5+ (csrc/megamoe/roles_shared.cuh, dispatch_pull): every CTA counts, publishes
            # and sorts its share of the T k items, the largest share arriving last at the count
            # barrier; no send-count atomics, no index table
            share = int(np.diff(cta_item_starts(T * k, S)).max())
            # at two CTAs per SM twice the CTAs publish and meet at the barrier
            pair = hw.sm90_count_pair_ns if rp.ctas_per_sm == 2 else 0.0
            steps = (("count", hw.sm90_count_ns + share * hw.sm90_count_item_ns + pair, 0),)
        else:
            steps = (
                ("count", 500.0 + T * k * 8 / hw.hbm_bytes_per_ns, 0),
                ("index_exchange", S * hw.atomic_same_address_ns, 0),  # per-expert send counts
                # source-index table into the owners' workspaces (remote stores when EP > 1)
                ("index_exchange", (hw.nvlink_latency_ns + items * 4 / hw.nvlink_bytes_per_ns) if multi
                 else items * 4 / hw.hbm_bytes_per_ns, items * 4),
                ("grid_sync", hw.grid_sync_ns, 0),
                ("index_exchange", hw.nvlink_latency_ns if multi else 0.0, plan.num_experts * 8),  # counts
            )
        for kind, dur, nbytes in steps:
            self.rows.append((r, -1, ROLE["dispatch"], KIND[kind], -1, -1, -1, -1, t, t + dur, nbytes, 0))
            t += dur
        yield env.timeout(t)
        if local:
            self._counts_ready(r, env.now)
        else:
            yield from self._pre_pull_barrier(r, sm90_ep1)
        # pulls, one event per round of 4*S concurrent warps
        G = S * DISPATCH_WARPS_PER_SM
        bm = rp.config.block_m
        src = np.concatenate([rp.pull_order(e)[:, 0] for e in range(len(rp.recv_counts))]
                             or [np.zeros(0, np.int64)])
        n = len(src)
        if n == 0:
            return
        tpe = rp.tokens_per_expert
        per_token = H * WITH_SCALES + 4  # FP8 row, scales, top-k weight
        fsx = H * SM90_FSX if plan.design == "megamoe-sm90" else 0.0  # written into the pool besides
        chunks = math.ceil(H / plan.bytes_per_pull)
        warp_rate = hw.sm_load_bytes_per_ns / DISPATCH_WARPS_PER_SM
        lat = hw.pull_latency_ns + chunks * plan.bytes_per_pull / warp_rate
        R = plan.num_ranks
        lats = None
        solo_pb, n_solo, lat_solo = (), 0, 0.0
        if plan.design == "megamoe-sm90":
            # the pull round of every item, the round completing each pool block, each CTA's
            # items, and the CTA of each pool item
            item_round, pb_round, per_cta, item_cta = self._sm90_pull_rounds(rp, src)
            n_rounds = int(item_round.max()) + 1
            W = DISPATCH_WARPS_PER_SM
            rounds = fold_rounds(H)  # a whole row's chunk rounds, one after another
            # a CTA with one item pulls it with all its dispatch warps, each its share of the
            # chunk rounds (kernel v8.6, EP1 at block_m 16); the others one item per warp
            warps = ONE_ITEM_PULL_WARPS.get(bm, 1) if R == 1 else 1
            alone = (per_cta == 1) & (warps > 1)  # per CTA
            solo = alone[item_cta]  # per pool item
            # a round's time: the base, more with every dispatch warp pulling then, and the folds
            busy = [int(np.clip(per_cta[~alone] - W * q, 0, W).sum()) + (W * int(alone.sum()) if q == 0 else 0)
                    for q in range(n_rounds)]
            base = [hw.sm90_pull_base_ns + hw.sm90_pull_warp_ns * b for b in busy]
            lats = [x + rounds * hw.pull_fold_chunk_ns for x in base]
            # at two CTAs per SM a lone pull takes sm90_pull_pair_ns whatever the warps pulling
            lat_solo = ((hw.sm90_pull_pair_ns if rp.ctas_per_sm == 2 else base[0])
                        + fold_rounds(H, warps) * hw.pull_fold_chunk_ns)
            if solo.all():  # every CTA pulls one row at most
                lats[0] = lat_solo
            elif solo.any():
                # the pool blocks whose rows all come from CTAs with one item land at lat_solo
                mixed = np.zeros(len(pb_round), dtype=bool)
                np.logical_or.at(mixed, self._pool_blocks(rp), ~solo)
                solo_pb = set(np.nonzero(~mixed)[0].tolist())
                n_solo = int(solo.sum())
            cnt = np.bincount(item_round * R + src, minlength=n_rounds * R).reshape(n_rounds, R)
            cnt[0, r] -= n_solo  # EP1 only: pulled apart, below
            counts = cnt.tolist()
            if R > 1:
                # a warp pulls its items one after another, each from a remote rank paying
                # SM90_REMOTE_ROUND_TRIPS NVLink round trips: a round's latency grows with
                # its share of remote items
                remote = 1.0 - cnt[:, r] / np.maximum(cnt.sum(axis=1), 1)
                lats = (np.array(lats) + remote * (SM90_REMOTE_ROUND_TRIPS * hw.nvlink_latency_ns)).tolist()
        else:
            # last global token index of every pool block, and the round that pulls it
            mbe = -(-tpe // bm)
            pb_e = np.repeat(np.arange(len(tpe)), mbe)
            pb_m = np.arange(len(pb_e)) - np.repeat(np.cumsum(mbe) - mbe, mbe)
            last = (np.cumsum(tpe) - tpe)[pb_e] + np.minimum((pb_m + 1) * bm, tpe[pb_e]) - 1
            pb_round = last // G
            n_rounds = (n + G - 1) // G
            # per round: tokens from each source rank, and the pool blocks it completes
            counts = np.bincount(np.arange(n) // G * R + src, minlength=n_rounds * R).reshape(n_rounds, R).tolist()
        order = np.argsort(pb_round, kind="stable")
        cut = np.searchsorted(pb_round[order], np.arange(n_rounds + 1)).tolist()
        order = order.tolist()
        hbm, ingress, egress, links = self.hbm[r], self.ingress[r], self.egress, self.links
        arrival, arrival_ev = self.arrival[r], self.arrival_ev[r]
        for q in range(n_rounds):
            t0 = env.now
            cnt = counts[q]
            finish = t0 + (lat if lats is None else lats[q])
            if q == 0 and n_solo:  # the CTAs with one item, beside the first round
                b = float(n_solo) * per_token
                f1 = max(t0 + lat_solo, hbm.reserve(t0, 2 * b + n_solo * fsx))
                self.rows.append((r, -1, ROLE["dispatch"], KIND["pull"], -1, -1, -1, -1, t0, f1, int(b), n_solo))

                def land(_e, f1=f1):  # at f1, as a round's pool blocks land at its end
                    for pb in solo_pb:
                        arrival[pb] = f1
                        ev = arrival_ev.pop(pb, None)
                        if ev is not None:
                            ev.succeed(f1)

                env.timeout(f1 - t0).callbacks.append(land)
            for j, cj in enumerate(cnt):
                if not cj:
                    continue
                b = float(cj) * per_token
                if j == r:
                    finish = max(finish, hbm.reserve(t0, 2 * b + cj * fsx))
                else:
                    f1 = egress[j].reserve(t0, b)
                    f2 = ingress.reserve(t0, b)
                    if links is not None:
                        f2 = max(f2, links[j][r].reserve(t0, b))
                    f3 = hbm.reserve(t0, b + cj * fsx)  # write into the local pool
                    finish = max(finish, f1, f2, f3)
            yield env.timeout(finish - t0)
            ntok = sum(cnt)
            self.rows.append((r, -1, ROLE["dispatch"], KIND["pull"], -1, -1, -1, -1, t0, finish,
                              int(ntok * per_token), ntok))
            for pb in order[cut[q]:cut[q + 1]]:
                if pb in solo_pb:
                    continue
                arrival[pb] = finish
                ev = arrival_ev.pop(pb, None)
                if ev is not None:
                    ev.succeed(finish)

    def _pool_blocks(self, rp) -> np.ndarray:
        """The pool block of every pool item (pool order: experts in order, each expert's items
        in pull order): its expert's first block + its position // block_m."""
        tpe, bm = rp.tokens_per_expert, rp.config.block_m
        mbe = -(-tpe // bm)
        first = np.cumsum(tpe) - tpe
        e_of = np.repeat(np.arange(len(tpe)), tpe)
        return (np.cumsum(mbe) - mbe)[e_of] + (np.arange(int(tpe.sum())) - first[e_of]) // bm

    def _sm90_pull_rounds(self, rp, src: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The SM90 kernel's pull order (``csrc/megamoe/kernel_sm90.cu``): CTA ``c`` pulls a
        contiguous range of items with its 4 dispatch warps, item ``j`` of the range in round
        ``j // 4``.  EP1: the range is the items (token, top-k slot) ``[T K c / S, T K (c + 1) / S)``
        in item order ``t K + k`` (kernel v8.5; until v8.4 the items of tokens
        ``[T c / S, T (c + 1) / S)``, so that at one token one CTA pulled all top-k items in two
        rounds), sorted by expert (stably: kernel v7.9; until v7.8 in item order, so that a pool
        block collected rows from almost every CTA and completed only at the end of the pull);
        a pool row is the expert's items in ascending order.
        EP: the range is pool positions ``[N c / S, N (c + 1) / S)`` of the rank's ``N`` pool
        items (experts in order, each in pull order).

        Returns:
            the round of every pool item (pool order, as ``src``), the round that completes
            each pool block (its rows' latest), the items of each CTA (int64 ``[S]``) and the
            CTA of each pool item (pool order).
        """
        S, bm, K = rp.num_sms, rp.config.block_m, self.plan.top_k
        W = DISPATCH_WARPS_PER_SM
        tpe = rp.tokens_per_expert
        mbe = -(-tpe // bm)
        n = len(src)
        if self.plan.num_ranks == 1:
            T = rp.num_tokens
            ids = self.topk_idx[rp.rank].reshape(-1)
            items = np.nonzero(ids >= 0)[0]
            i0 = cta_item_starts(T * K, S)[:-1]                 # first item of each CTA
            cta = np.searchsorted(i0, items, side="right") - 1
            # position of each item in its CTA's items sorted by expert (stable)
            srt = np.lexsort((items, ids[items], cta))
            first = np.searchsorted(cta[srt], np.arange(S))
            pos = np.empty(len(items), dtype=np.int64)
            pos[srt] = np.arange(len(items)) - first[cta[srt]]
            rnd = pos // W
            per_cta = np.bincount(cta, minlength=S)
            # pool order: experts in order, each expert's items ascending
            po = np.argsort(ids[items], kind="stable")
            rnd, cta = rnd[po], cta[po]
        else:
            j0 = cta_item_starts(n, S)                          # first pool position of each CTA
            j = np.arange(n)
            cta = np.searchsorted(j0[:-1], j, side="right") - 1
            rnd = (j - j0[cta]) // W
            per_cta = np.diff(j0)
        pb_round = np.zeros(int(mbe.sum()), dtype=np.int64)
        np.maximum.at(pb_round, self._pool_blocks(rp), rnd)
        return rnd, pb_round, per_cta, cta

    # -- GEMM clusters -----------------------------------------------------------
    def cluster(self, r: int, c: int):
        env, hw, plan = self.env, self.hw, self.plan
        rp = plan.ranks[r]
        cfg = rp.config
        bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
        cs = cfg.cluster_size  # SMs per unit: 2 (2-CTA cluster, lockstep) or 1
        clusters, act1, act2, l1_out, wb, epi2, walks, valid = self.tables[r]
        sm90 = plan.design == "megamoe-sm90"
        # SM90 at two CTAs per SM (kernel v9.2): a CTA's consumer and producer work takes a share
        # times as long as a lone CTA's, and it gets half the SM's load rate. The two do not share
        # the SM fairly (benchmarks/NOTES_kernel.md, session 38): the SM's first CTA (units below
        # S / 2) takes sm90_pair_share_first always, its second (unit c + S / 2 on SM c) that
        # where the first is idle when the second's block's K loop starts, else sm90_pair_share
        # (the first is in a block from its first K block to its epilogue end); each CTA's
        # scheduler walks at its own share (the first's, or sm90_pair_share)
        pair = sm90 and rp.ctas_per_sm == 2
        half = rp.num_sms // 2
        partner = c - half if pair and c >= half else None  # a second CTA's first CTA
        own = self.busy[r][c] if pair and partner is None else None  # a first CTA's block windows
        shares = (hw.sm90_pair_share_first, hw.sm90_pair_share) if pair else (1.0,)
        share = shares[-1] if partner is not None else shares[0]
        tickets = rp.block_tickets
        if tickets:  # kernel v9.3: the rank's rows in list order, each taken by the first unit ready
            cols = clusters[0]
            walked = [0, 0]  # chunk scans and skips from the list's start to the unit's latest row
            rows = self._ticket_rows(r, c, cols, walks[0], walked, share, rp.wave_lag)
        else:
            cols = clusters[c]  # phase, n block, pool block, first-touch keys, block id per row
            # SM90: the scheduler's cost before each block and after the last (0 for SM100)
            gaps, end_gap = walks[c]
            if share != 1.0:
                gaps, end_gap = [g * share for g in gaps], end_gap * share
            rows = zip(*cols, gaps)
        t_ready = self.counts_ready[r]
        if t_ready is None:
            t_ready = yield self.counts_done[r]
        if sm90:  # the unit's schedulers read the published counts before their first walk
            t_ready += hw.sm90_fetch_counts_ns * share
        if not tickets and not cols[0]:
            self.cluster_end[r] = max(self.cluster_end[r], t_ready + end_gap)
            return
        H, I = plan.hidden, plan.intermediate
        lat = hw.tma_latency_ns
        stages = rp.num_stages
        # the consumers' walk costs less by this where they walk inside the epilogue (kernel
        # v9.0: its cost is in the epilogue figures); the producer's does not. Where they read
        # the producer's block descriptors (kernel v9.1) their gap is sched_desc_ns, no walk.
        c_less = hw.sched_block_ns - hw.sched_ahead_ns if sm90 and WALK_IN_EPILOGUE.get(bm, False) else 0.0
        c_desc = sm90 and BLOCK_DESCRIPTORS.get(bm, False)
        tc = hw.tc_flops_per_ns_per_sm * (hw.sm90_mma_fraction if sm90 else 1.0)
        # global bytes one SM moves per K block: its share of A (half with 2-CTA multicast),
        # its B tile in FP4, and the scales
        stage_bytes = (bm // cs) * bk + bn * bk / 2 + (bm + bn) * bk / 32
        # load rate of one SM: its engine limit, or Little's law on the stage ring
        load_rate = min(hw.sm_load_bytes_per_ns / rp.ctas_per_sm, stages * stage_bytes / lat)
        epi_threads = cfg.num_epilogue_threads
        ks = rp.k_split
        kb1, kb2 = H // bk // ks, I // bk // ks

        def priced(f: float, nm: int = bm) -> tuple:
            """The block figures, ns, at share ``f`` of a lone CTA's consumer and producer time
            and WGMMA N ``nm`` (the tokens its WGMMAs and promotions cover, design_sm90.wgmma_n):
            K block (L2, L1), L1 epilogue, K loops, ring prefetches (L1, L2), each L2 K block's
            offset in its loop, one K block's copy issue, the K loops' issues, ``f``."""
            t_mma_k = 2.0 * nm * bn * bk / tc
            if sm90:
                # the consumer warps prepare the stage (kernel v5-v7.4: the token-scale table and a
                # warpgroup barrier, v7.5: the weight rows' fold-table offsets; the E2M1 -> E4M3
                # decode goes into the WGMMA registers), run
                # the MMA of the stage, then hand the stage back: serial per K block
                t_k = max((t_mma_k + hw.e2m1_decode_thread_ns_per_elem * bn * bk / cfg.num_epilogue_threads
                           + hw.stage_handoff_ns) * f, stage_bytes / load_rate)
                # an L1 K block promoted once (x folded per 128-K group at this block_m, kernel v7.6:
                # design_sm90.L1_X_FOLD_K) saves one 64-K group's promotion
                t_k1 = (max(t_k - hw.sm90_promotion_ns_per_row * nm * f, stage_bytes / load_rate)
                        if l1_promoted_once(bm) else t_k)
            else:
                t_k = max(t_mma_k, stage_bytes / load_rate) + hw.block_overhead_ns / max(1, H // bk)
                t_k1 = t_k
            # the L1 epilogue pays a fixed hand-off (cross-warp amax reduction, arrival-mask release);
            # the L2 epilogue's time per pool block is in epi2
            t_epi1 = (hw.l1_epilogue_thread_ns_per_elem * bm * bn / epi_threads + hw.block_overhead_ns) * f
            # SM90: the producer issues one K block's loads in t_iss (its stage already free), so a
            # block's last copy issue comes no earlier than kb x t_iss after its first, and no
            # earlier than t_iss after the consumers free the stage a ring back. Not scaled by the
            # share f (until the forty-first session it was): the figure is read off one-CTA
            # traces where the ring, i.e. the consumers, already paces the issues, and the ring's
            # pacing at a share is priced apart (the K loop's prefetch term below)
            t_iss = hw.sm90_issue_kblock_ns if sm90 else 0.0
            return (t_k, t_k1, t_epi1, kb1 * t_k1, kb2 * t_k, min(stages, kb1) * t_k1, min(stages, kb2) * t_k,
                    [i * t_k for i in range(kb2)], t_iss, kb1 * t_iss, kb2 * t_iss, f)

        prices = [priced(f) for f in shares]
        # SM90 where the WGMMAs cover a block's valid rows only (RankPlan.wgmma_n_step): the
        # figures per WGMMA N, picked per block by its pool block's valid rows
        n_of = [wgmma_n(bm, v, rp.wgmma_n_step) for v in valid] if sm90 and rp.wgmma_n_step < bm else None
        if n_of is not None:
            by_n = {nm: [priced(f, nm) for f in shares] for nm in set(n_of)}
            by_share_n = {nm: [(p[7], p[8]) for p in ps] for nm, ps in by_n.items()}
        t_k, t_k1, t_epi1, loop1, loop2, pre1, pre2, _, t_iss, iss1, iss2, esh = prices[-1 if partner is not None else 0]
        ca = 2  # where this block's share's L2 readiness figures start in a ready_cache entry
        # split-K (a what-if, RankPlan.blocks): a row runs 1 / ks of its GEMM's K blocks; the
        # last part's CTA waits for the others' partial sums (each stored by its CTA after its
        # K loop and loaded after it: one memory round trip plus the bytes at one SM's load
        # rate each way, priced from tma_latency_ns and sm_load_gbs (on the H200 both measured by
        # the copy-engine probe); the exchange itself is not measured)
        kb2_all = I // bk
        t_xchg = lat + bn * bm * 4 / hw.sm_load_bytes_per_ns
        xchg = self.xchg[r]
        # FP4 weight bytes of the unit
        w1, w2 = cs * bn * (kb1 * bk) / 2, cs * bn * (kb2 * bk) / 2
        per_kb = 2 * bk // bn  # L1 n blocks (bn/2 SwiGLU outputs each) per L2 K block
        by_share = [(p[7], p[8]) for p in prices]  # L2 K-block offsets and copy issue, per share
        desc = hw.sched_desc_ns * share
        prev_issue = t_ready  # SM90: the producer's last copy issue of the previous block
        prev_mma_end = t_ready
        prev_prefetch = 0.0
        prev_epi_end = t_ready
        epi_m2 = epi_m1 = t_ready  # epilogue ends of the two previous blocks (TMEM stages)
        hbm, egress, ingress, links = self.hbm[r], self.egress[r], self.ingress, self.links
        hbm_reserve, egress_reserve = hbm.reserve, egress.reserve
        # BandwidthCalendar.reserve(t, nbytes) runs inline below for its common case (the
        # bucket of t, or the bucket its skip pointer names, has room for all the bytes) and
        # is called otherwise; the ingress calendars all have the same rate
        hused, hnxt, hrate, hfull = hbm.used, hbm.nxt, hbm.rate, hbm.full
        irate, ifull = self.ingress[0].rate, self.ingress[0].full
        tw, ta = self.touched_w[r], self.touched_a[r]
        l1_done, l1_left, l1_ev = self.l1_done[r], self.l1_left[r], self.l1_ev[r]
        ready_cache = self.ready_cache[r]
        arrival, arrival_ev = self.arrival[r], self.arrival_ev[r]
        per_k_wait = plan.l2_wait == "k_block"
        mask_seen = ((hw.sm90_mask_seen_relay_ns if RELAY_RELEASE.get(bm) else hw.sm90_mask_seen_ns)
                     if sm90 else 0.0)
        wb_slack = hw.nvlink_latency_ns
        record = self.blocks.extend
        timeout = env.timeout
        last_write = float(self.last_write[r])
        # SM90: the unit's first block's first stage lands sm90_first_fill_ns after its issue (the
        # ring's first fill at the call's start, read off the traces), the later ones' tma_latency_ns
        first_lat = max(lat, hw.sm90_first_fill_ns) if sm90 else lat
        # and where the kernel paces that fill by arrivals (v9.8, block_m 16) the first block's K
        # loop runs sm90_first_kloop_ns longer than a later one's (read off the traces)
        first_kloop = hw.sm90_first_kloop_ns if sm90 and FIRST_FILL_PER_SM.get(bm, 0) else 0.0
        jitter = self.jitter
        for phase, n, pb, key_w, key_a, kp, bid, gap in rows:
            jk, je = jitter[bid] if jitter is not None else _NO_JITTER  # the block's K-loop and epilogue factors
            if n_of is not None:  # this block's WGMMA N
                prices, by_share = by_n[n_of[pb]], by_share_n[n_of[pb]]
                t_k, t_k1, t_epi1, loop1, loop2, pre1, pre2, _, t_iss, iss1, iss2, esh = prices[-1 if partner is not None else 0]
            adj = False  # L2: wait per K block (ready_cache entry's [ca], [ca + 1])
            if phase == L1:
                dep = arrival[pb]
                if dep is None:
                    ev = arrival_ev.get(pb)
                    if ev is None:
                        ev = arrival_ev[pb] = env.event()
                    dep = yield ev
            else:
                if l1_left[pb] > 0:
                    ev = l1_ev.get(pb)
                    if ev is None:
                        ev = l1_ev[pb] = env.event()
                    yield ev
                cached = ready_cache.get(pb * ks + kp)
                if cached is None:  # the K-block readiness of this pool block (and K part), once
                    vec = l1_done[pb]  # max over each L2 K block's per_kb L1 n blocks
                    ready = (list(map(max, *(vec[k:kb2_all * per_kb:per_kb] for k in range(per_kb))))
                             if per_kb > 1 else vec[:kb2_all])[kp * kb2:(kp + 1) * kb2]
                    # K block i is consumed no earlier than ready_i + lat and the loop ends
                    # (kb - i) * t_k after that: the latest such end, less lat + kb * t_k;
                    # SM90: the producer issues K block i no earlier than ready_i, so its last
                    # issue comes no earlier than the latest ready_i + (kb - i) issues; the two
                    # for every share a block may be priced at
                    cached = ready_cache[pb * ks + kp] = (ready[0], max(ready)) + tuple(
                        v for offs, t_is in by_share
                        for v in (max(map(sub, ready, offs)),
                                  max(x + (kb2 - i) * t_is for i, x in enumerate(ready)) if sm90 else None))
                if per_k_wait and kb2 > 1:
                    dep, adj = cached[0], True
                else:
                    dep = cached[1]
            # the loaders may start once the dependency holds and a ring stage is free (SM90:
            # and the producer has walked the scheduler to this block)
            free = (prev_issue if sm90 else prev_mma_end - prev_prefetch) + gap
            load_start = dep if dep > free else free
            # accumulator stages: TMEM has 2 (block i waits for epilogue i-2); the SM90
            # consumers hold the accumulators in registers, run the epilogue themselves and
            # then walk the scheduler to this block
            arrive = load_start + first_lat  # the block's first stage lands
            first_lat = lat
            mma_start = arrive
            if prev_mma_end > mma_start:
                mma_start = prev_mma_end
            c_start = epi_m1 + (desc if c_desc else gap - c_less) if sm90 else epi_m2
            if c_start > mma_start:
                mma_start = c_start
            now = env.now
            if partner is None:
                # with tickets an SM's first CTA prices its block at the take: nothing in it waits
                # for a later state, and its partner reads its windows only once they have begun
                if load_start > now and not tickets:
                    yield timeout(load_start - now)
            else:  # a second CTA: priced when its K loop starts, by its partner's state then
                if mma_start > now:
                    yield timeout(mma_start - now)
                bp = self.busy[r][partner]
                si = 1 if bp[2] <= mma_start < bp[3] or bp[0] <= mma_start < bp[1] else 0
                t_k, t_k1, t_epi1, loop1, loop2, pre1, pre2, _, t_iss, iss1, iss2, esh = prices[si]
                ca = 2 + 2 * si
            first = 0.0
            if not tw[key_w]:
                tw[key_w] = True
                first = w1 if phase == L1 else w2  # FP4 weights of the unit's n blocks
            if not ta[key_a]:
                ta[key_a] = True
                first += act1[pb] if phase == L1 else act2[pb]  # FP8 activations + UE8M0 scales
            if phase == L1:
                mma_end = mma_start + loop1 * jk + first_kloop
                if first:
                    f = hbm_reserve(load_start, first) + t_k1
                    if f > mma_end:
                        mma_end = f
                if sm90:  # the last K block's data comes after its issue; the ring paces the issues
                    issue_end = load_start + iss1
                    mma_end = max(mma_end, issue_end + lat + t_k1)
                    issue_end = max(issue_end, mma_end - pre1 + t_iss)
            else:
                mma_end = mma_start + loop2 * jk + first_kloop
                if first:
                    f = hbm_reserve(load_start, first) + t_k
                    if f > mma_end:
                        mma_end = f
                if adj:
                    f = cached[ca] + lat + loop2 * jk
                    # (the cached offsets are the unjittered K blocks'; with a factor below 1 the
                    # last K block could otherwise end before its data has landed)
                    f1 = cached[1] + lat + t_k * jk
                    if f1 > f:
                        f = f1
                    if f > mma_end:
                        mma_end = f
                if sm90:  # as in L1; each K block's issue also waits for its arrival-mask bits
                    issue_end = load_start + iss2
                    if adj:
                        issue_end = max(issue_end, cached[ca + 1])
                    mma_end = max(mma_end, issue_end + lat + t_k)
                    issue_end = max(issue_end, mma_end - pre2 + t_iss)
            first_kloop = 0.0
            epi_start = mma_end if mma_end > prev_epi_end else prev_epi_end
            part_end = None
            if ks > 1:
                part_end, epi_start = yield from self._split_k(xchg, (phase, pb, n), kp, ks, epi_start, t_xchg)
            if part_end is not None:  # a part that only stores its partial sums
                epi_end = part_end
            elif phase == L1:
                epi_end = epi_start + t_epi1 * je
                # FP8 outputs + scales to HBM: hbm.reserve(epi_start, nb)
                nb = l1_out[pb]
                b = int(epi_start / BUCKET_NS)
                f = None
                try:
                    x = hnxt[b]
                    if x == b or hnxt[x] == x:
                        start = x * BUCKET_NS + hused[x] / hrate
                        if start < epi_start:
                            start = epi_start
                        if ((x + 1) * BUCKET_NS - start) * hrate >= nb:
                            hbm.total_bytes += nb
                            u = hused[x] + nb
                            hused[x] = u
                            if u >= hfull:
                                hnxt[x] = x + 1
                            f = start + nb / hrate
                except IndexError:
                    pass
                if f is None:
                    f = hbm_reserve(epi_start, nb)
                if f > epi_end:
                    epi_end = f
                done = l1_done[pb]
                # SM90: the L2 producers see the arrival-mask bits this long after the epilogue
                done[n] = epi_end + mask_seen
                if cs == 2:
                    done[n + 1] = epi_end
                elif cs > 2:
                    done[n + 2:n + cs] = [epi_end] * (cs - 2)
                left = l1_left[pb] = l1_left[pb] - cs
                if left == 0:
                    ev = l1_ev.pop(pb, None)
                    if ev is not None:
                        ev.succeed()
            else:
                epi_end = epi_start + epi2[pb] * esh * je
                # BF16 rows to each token's source rank: HBM for local rows, else the
                # destination's NVLink ingress (and the pair's link) plus this GPU's egress
                fin = epi_end
                local, remote, remote_bytes, pairs = wb[pb]
                b = int(epi_start / BUCKET_NS)
                if local is not None:
                    nb = local
                    f = None
                    try:
                        x = hnxt[b]
                        if x == b or hnxt[x] == x:
                            start = x * BUCKET_NS + hused[x] / hrate
                            if start < epi_start:
                                start = epi_start
                            if ((x + 1) * BUCKET_NS - start) * hrate >= nb:
                                hbm.total_bytes += nb
                                u = hused[x] + nb
                                hused[x] = u
                                if u >= hfull:
                                    hnxt[x] = x + 1
                                f = start + nb / hrate
                    except IndexError:
                        pass
                    if f is None:
                        f = hbm_reserve(epi_start, nb)
                    if f > fin:
                        fin = f
                if links is None:
                    for cal, used, nxt, nb, dur in remote:
                        try:
                            x = nxt[b]
                            if x == b or nxt[x] == x:
                                start = x * BUCKET_NS + used[x] / irate
                                if start < epi_start:
                                    start = epi_start
                                if ((x + 1) * BUCKET_NS - start) * irate >= nb:
                                    cal.total_bytes += nb
                                    u = used[x] + nb
                                    used[x] = u
                                    if u >= ifull:
                                        nxt[x] = x + 1
                                    f = start + dur
                                    if f > fin:
                                        fin = f
                                    continue
                        except IndexError:
                            pass
                        f = cal.reserve(epi_start, nb)
                        if f > fin:
                            fin = f
                else:
                    for j, nb in pairs:
                        f = ingress[j].reserve(epi_start, nb)
                        f2 = links[r][j].reserve(epi_start, nb)
                        if f2 > f:
                            f = f2
                        if f > fin:
                            fin = f
                if remote_bytes:
                    f = egress_reserve(epi_start, remote_bytes)
                    if f > fin:
                        fin = f
                # the stores must drain (but for the last hop) before the TMEM stage is reused
                if fin - wb_slack > epi_end:
                    epi_end = fin - wb_slack
                if fin > last_write:
                    last_write = fin
            prev_prefetch = pre1 if phase == L1 else pre2
            if sm90:  # the producer's last copy issue (paced, or a ring ahead of the K loop's end) and
                # the consumers' block start (after their scheduler walk) instead; where they read
                # the block from its first stage's descriptor (BLOCK_DESCRIPTORS, kernel v9.1) they
                # know the block, and the kernel records its start, only once that stage is full
                c_rec = max(c_start, arrive) if c_desc else c_start
                record((bid, issue_end, c_rec, mma_end, epi_start, epi_end, dep, first, free))
                prev_issue = issue_end
            else:
                record((bid, load_start, mma_start, mma_end, epi_start, epi_end, dep, first, free))
            prev_mma_end = mma_end
            prev_epi_end = epi_end
            epi_m2, epi_m1 = epi_m1, epi_end
            if own is not None:  # a first CTA: its previous and this block's windows
                own[0], own[1], own[2], own[3] = own[2], own[3], mma_start, epi_end
            if tickets:  # the producer takes its next row when it is ready for it (simulated-time order)
                now = env.now
                if prev_issue > now:
                    yield timeout(prev_issue - now)
        if tickets:  # the walk from the unit's last row to the end of the list
            end_key = walks[1]
            end_gap = share * (hw.sched_block_ns + hw.sched_step_ns * max(end_key[0] - walked[0], 0)
                               + hw.sched_skip_ns * max(end_key[1] - walked[1], 0))
        self.last_write[r] = max(self.last_write[r], last_write)
        self.cluster_end[r] = max(self.cluster_end[r], prev_epi_end + (desc if c_desc else end_gap - c_less))

    def _split_k(self, xchg: dict, key: tuple, kp: int, ks: int, epi_start: float, t_xchg: float):
        """Split-K hand-over of one block's partial sums (a generator; ``yield from`` it).

        A part below the last (``kp < ks - 1``) stores its FP32 partial sums and releases them:
        ``t_xchg`` after ``epi_start``. The last part's CTA waits until every other part has
        released, loads them (``t_xchg`` after the latest release) and then runs the block's
        epilogue.

        Returns:
            ``(end of the store, epi_start)`` for a storing part, ``(None, epilogue start)`` for
            the last part.
        """
        st = xchg.get(key)
        if st is None:
            st = xchg[key] = [0, 0.0, None]  # parts released, latest release, the last part's Event
        if kp < ks - 1:
            end = epi_start + t_xchg
            st[0] += 1
            st[1] = max(st[1], end)
            if st[0] == ks - 1 and st[2] is not None:
                st[2].succeed()
            return end, epi_start
        if st[0] < ks - 1:
            st[2] = self.env.event()
            yield st[2]
        del xchg[key]
        return None, max(epi_start, st[1] + t_xchg)

    # -- run -----------------------------------------------------------------------
    def run(self, topk_idx: list[np.ndarray]):
        plan, hw = self.plan, self.hw
        self.valid_slots = [int((ids >= 0).sum()) for ids in topk_idx]
        self.topk_idx = topk_idx
        for r in range(plan.num_ranks):
            self.env.process(self.dispatch(r))
            for c in range(plan.ranks[r].num_sms // plan.ranks[r].config.cluster_size):
                self.env.process(self.cluster(r, c))
        self.env.run()
        eid = getattr(self.env, "_eid", None)  # SimPy's scheduled-event counter
        self.n_events = next(eid) if eid is not None else 0
        R = plan.num_ranks
        if any(rp.combine_relay for rp in plan.ranks):  # SM90 EP1: no barrier, no combine after it
            return self._relay_end()
        # final NVLink barrier (chain 5): every rank's last write has landed
        arrive = np.maximum(self.cluster_end, self.last_write) + hw.grid_sync_ns
        for r in range(R):
            self.rows.append((r, -1, ROLE["epilogue"], KIND["grid_sync"], -1, -1, -1, -1,
                              float(max(self.cluster_end[r], self.last_write[r])), float(arrive[r]), 0, 0))
        barrier = float(arrive.max()) + self.barrier_ns
        # the barrier's own kind: the SM90 kernel at one rank has no NVLink barrier, only grid syncs
        # (as the barrier before the pull, _pre_pull_barrier)
        bar_kind = KIND["grid_sync" if plan.design == "megamoe-sm90" and R == 1 else "nvl_barrier"]
        t_red = np.zeros(R)
        end = np.zeros(R)
        for r in range(R):
            self.rows.append((r, -1, ROLE["epilogue"], bar_kind, -1, -1, -1, -1,
                              float(arrive[r]), barrier, 0, 0))
            T = plan.ranks[r].num_tokens
            nbytes = (self.valid_slots[r] + T) * plan.hidden * 2
            t_red[r] = (hw.tma_latency_ns + nbytes / hw.hbm_bytes_per_ns) if T else 0.0
            start = 0.0
            if T and plan.design == "megamoe-sm90":
                # every thread of the grid sums one 16-byte slice of a token per round; the round
                # is slower where the kernel loads a token's slots one at a time; the first starts
                # a while after the release (more at two CTAs per SM)
                rp = plan.ranks[r]
                rounds = -(-T * plan.hidden // 8 // (rp.num_sms * SM90_THREADS))
                serial = combine_slots(rp.config.block_m, rp.experts_per_wave, rp.ctas_per_sm) == 1
                start = hw.sm90_combine_start_pair_ns if rp.ctas_per_sm == 2 else hw.sm90_combine_start_ns
                t_red[r] = max(t_red[r], start + rounds * (hw.combine_round_serial_ns if serial else hw.combine_round_ns))
            self.hbm[r].total_bytes += nbytes
            self.rows.append((r, -1, ROLE["epilogue"], KIND["combine"], -1, -1, -1, -1,
                              barrier + start, barrier + t_red[r], nbytes, T))
        # meanwhile the dispatch warps clean the workspace and pass the last NVLink barrier
        cleaned = barrier + hw.grid_sync_ns
        last = cleaned + self.barrier_ns
        for r in range(R):
            self.rows.append((r, -1, ROLE["dispatch"], KIND["grid_sync"], -1, -1, -1, -1,
                              barrier, cleaned, 0, 0))
            self.rows.append((r, -1, ROLE["dispatch"], bar_kind, -1, -1, -1, -1,
                              cleaned, last, 0, 0))
            end[r] = max(barrier + t_red[r], last)
        return end, t_red

    def _relay_end(self):
        """The combine relay (``RankPlan.combine_relay``, a what-if of the SM90 design; one rank): each L2
        block, once its epilogue ends, is one request to its SM's dispatch warps, served in
        order. A request takes ``2 x tma_latency_ns`` (its rows' tokens, then the per-slice
        count adds beside the tokens' top-k ids: two dependent memory round trips) to find the
        slices it completes, then one round trip (``tma_latency_ns``) per pass of its busiest
        serving warp (a warp sums two slices per pass; rows 32 j .. 32 j + 31 go to warp j mod
        3, each 32-row chunk after the first of a warp adds two more round trips), and no less
        than the HBM calendar takes for the slices' valid rows and outputs. The call ends one
        round trip after the later of the last request and the last CTA (its add to the done
        count). These prices are the model's, from ``tma_latency_ns`` (on the H200 the copy engine's
        latency measured by ``benchmarks/device/tma_probe.cu``, not a fit to the relay), and optimistic: a kernel form of the relay on the H200 took 2.2-9.3 us per request, slowed
        the K loops and ran 1.04-1.11x the time of the kernel without it (benchmarks/NOTES.md,
        thirty-first session), which the model does not reproduce.

        Returns ``(end, t_red)`` as :meth:`run` does; ``t_red`` is how far the relay runs past
        the last CTA's GEMM work."""
        plan, hw = self.plan, self.hw
        lat = hw.tma_latency_ns
        rp = plan.ranks[0]
        bm, ks = rp.config.block_m, rp.k_split
        T = rp.num_tokens
        b, ids = self._block_table()
        sel = (ids[:, 2] != L1) & (ids[:, 8] == ks - 1)  # L2 blocks that store rows (a split's last part)
        ee, sm, ex, mb, nb, vm = b[sel, 5], ids[sel, 1], ids[sel, 3], ids[sel, 4], ids[sel, 5], ids[sel, 7]
        tok = {e: rp.pool_sources(e)[:, 1] for e in np.unique(ex).tolist()}
        nval = (self.topk_idx[0] >= 0).sum(axis=1) if T else np.zeros(0, np.int64)
        count = np.zeros((max(T, 1), rp.l2_n_blocks), dtype=np.int64)
        queues = {}
        for i in np.lexsort((ee, sm)).tolist():
            queues.setdefault(int(sm[i]), []).append(i)
        heap = [(ee[q[0]] + 2 * lat, s, 0) for s, q in queues.items()]
        heapq.heapify(heap)
        hbm = self.hbm[0]
        last = 0.0
        while heap:
            t_add, s, j = heapq.heappop(heap)
            i = queues[s][j]
            rows = tok[int(ex[i])][int(mb[i]) * bm:int(mb[i]) * bm + int(vm[i])]
            n = int(nb[i])
            np.add.at(count[:, n], rows, 1)
            won = count[rows, n] == nval[rows]
            if won.any():  # a token twice in one block (a repeated expert): its first row wins
                at = np.nonzero(won)[0]
                won = np.zeros(len(rows), dtype=bool)
                won[at[np.unique(rows[at], return_index=True)[1]]] = True
            count[rows[won], n] = 0
            r_idx = np.arange(len(rows))
            warp, chunk = (r_idx // 32) % 3, r_idx // 96
            post = 0.0
            for w in range(3):
                mine = warp == w
                if mine.any():
                    per_chunk = np.bincount(chunk[mine], weights=won[mine].astype(np.float64))
                    passes = float(np.ceil(per_chunk / 2).sum())
                    post = max(post, passes * lat + (len(per_chunk) - 1) * 2 * lat)
            nbytes = float((nval[rows[won]].sum() + won.sum()) * 128 * 2)
            end = t_add + post
            if nbytes:
                end = max(end, hbm.reserve(t_add, nbytes))
            self.rows.append((0, s, ROLE["dispatch"], KIND["combine"], -1, -1, n, -1,
                              float(t_add - 2 * lat), float(end), nbytes, int(won.sum())))
            last = max(last, end)
            if j + 1 < len(queues[s]):
                nxt = queues[s][j + 1]
                heapq.heappush(heap, (max(ee[nxt], end) + 2 * lat, s, j + 1))
        done = max(float(self.cluster_end[0]), last)
        end = done + lat
        self.rows.append((0, -1, ROLE["dispatch"], KIND["grid_sync"], -1, -1, -1, -1, done, end, 0, 0))
        return np.array([end]), np.array([max(0.0, last - float(self.cluster_end[0]))])

    def _block_table(self) -> tuple[np.ndarray, np.ndarray]:
        """The simulated blocks (``self.blocks``, 9 numbers each: float64 ``[N, 9]``) and their
        ids (``self.block_ids`` rows: int32 ``[N, 9]``), as :meth:`trace` and the relay read them."""
        b = np.asarray(self.blocks, dtype=np.float64).reshape(-1, 9)
        return b, self.block_ids[b[:, 0].astype(np.int64)]

    def trace(self) -> Trace:
        rows = Trace.from_rows(np.asarray(self.rows, dtype=np.float64)) if self.rows else None
        if not self.blocks:
            return rows if rows is not None else Trace.from_rows([])
        b, ids = self._block_table()
        nblk = len(b)
        r, c, ph, e, m, n, w, vm = (ids[:, i] for i in range(8))
        ls, ms, me, es, ee, dep, first, free = (b[:, i] for i in range(1, 9))
        l1 = ph == L1
        load_kind = np.where(l1, KIND["l1_load"], KIND["l2_load"]).astype(np.int32)
        mma_kind = np.where(l1, KIND["l1_mma"], KIND["l2_mma"]).astype(np.int32)
        epi_kind = np.where(l1, KIND["l1_epilogue"], KIND["l2_epilogue"]).astype(np.int32)
        # the loader sat idle on a dependency (chains 1 and 3) from `free` until `dep`
        waited = dep > free + 1e-6
        cs = self.plan.ranks[0].config.cluster_size
        nb = (first / cs).astype(np.int64)
        if self.plan.design == "megamoe-sm90":  # producer / consumer warpgroups
            # the SM90 records hold the producer's last copy issue in place of the load start
            # and the consumers' block start in place of the MMA start (see cluster)
            lanes = ((ROLE["producer"], load_kind, free, ls), (ROLE["consumer"], mma_kind, ms, me),
                     (ROLE["consumer"], epi_kind, es, ee))
            wait_role = ROLE["producer"]
        else:
            lanes = ((ROLE["tma_a"], load_kind, ls, me), (ROLE["tma_b"], load_kind, ls, me),
                     (ROLE["mma"], mma_kind, ms, me), (ROLE["epilogue"], epi_kind, es, ee))
            wait_role = ROLE["tma_a"]
        # per SM of the unit: every lane's intervals, then the dependency waits; the columns are
        # written straight into the final arrays (rank-level rows first)
        sel = np.nonzero(waited)[0]
        nw = len(sel)
        L = len(lanes)
        head = len(rows) if rows is not None else 0
        per_sm = L * nblk + nw
        total = head + cs * per_sm
        dtypes = Trace.from_rows([]).cols  # the schema's column dtypes
        out = {k: np.empty(total, dtype=dtypes[k].dtype) for k in COLUMNS}
        if rows is not None:
            for k in COLUMNS:
                out[k][:head] = rows[k]
        same = {"rank": r, "expert": e, "m_block": m, "wave": w, "tokens": vm}
        for half in range(cs):
            sm, nn = cs * c + half, n + half
            p = head + half * per_sm
            q = p + L * nblk
            full = {**same, "sm": sm, "n_block": nn, "bytes": nb}
            for k, v in full.items():
                out[k][p:q].reshape(L, nblk)[:] = v
                out[k][q:q + nw] = v[sel] if k != "bytes" else 0
            for i, (role, kind, t0, t1) in enumerate(lanes):
                s = slice(p + i * nblk, p + (i + 1) * nblk)
                out["role"][s] = role
                out["kind"][s] = kind
                out["t_start_ns"][s] = t0
                out["t_end_ns"][s] = t1
            out["role"][q:q + nw] = wait_role
            out["kind"][q:q + nw] = KIND["idle_wait"]
            out["t_start_ns"][q:q + nw] = free[sel]
            out["t_end_ns"][q:q + nw] = dep[sel]
        return Trace(out)


def simulate(scenario: Scenario, hardware: Hardware | str | None = None) -> SimResult:
    """Simulate one call.

    Args:
        scenario: the inputs (shape, ranks, tokens, routing, hardware name, design, overrides).
        hardware: a :class:`Hardware`, or a preset name / TOML path for
            :func:`sim.hardware.load_hardware`, to use instead of ``scenario.hardware``.

    Returns:
        :class:`SimResult` with the trace and ``summary`` (see :func:`sim.metrics.summarize`).

    Raises:
        InputError: invalid scenario or hardware (one line naming the field).
    """
    from .metrics import summarize

    # the simulation allocates many small objects (block records, SimPy events) and frees
    # nothing cyclic that matters while it runs: the cyclic collector only costs time here
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _simulate(scenario, hardware, summarize)
    finally:
        if gc_was_enabled:
            gc.enable()


def _simulate(scenario: Scenario, hardware: Hardware | str | None, summarize) -> SimResult:
    if not isinstance(scenario, Scenario):
        raise InputError("scenario", "a megamoe.scenario.Scenario", type(scenario).__name__)
    if not (hardware is None or isinstance(hardware, (Hardware, str))):
        raise InputError("hardware", "a sim.hardware.Hardware, a preset name or a .toml path",
                         type(hardware).__name__)
    if isinstance(hardware, Hardware):
        check_hardware(hardware)  # a file's figures were checked when it loaded
    hw = hardware if isinstance(hardware, Hardware) else \
        load_hardware(scenario.hardware if hardware is None else hardware)
    plan = scenario.plan(hw.num_sms, hw.smem_per_block_bytes)
    n_blocks = sum(int(rp.m_blocks_per_expert.sum()) * (rp.l1_n_blocks + rp.l2_n_blocks) for rp in plan.ranks)
    if n_blocks > MAX_BLOCKS:  # checked before the block lists and the engine allocate
        s = scenario.shape
        bms = "/".join(str(b) for b in sorted({rp.config.block_m for rp in plan.ranks}))
        raise InputError("blocks", f"at most {MAX_BLOCKS} blocks over all ranks (routed slots / block_m x "
                         "(2 x intermediate + hidden) / 128: fewer tokens, a larger block_m or a smaller hidden or "
                         "intermediate make fewer)",
                         f"{n_blocks} (block_m {bms}, hidden {s.hidden}, intermediate {s.intermediate})")
    for rp in plan.ranks:  # run (and check) scheduler policies before the simulation
        rp.blocks()
    eng = _Engine(plan, hw, [1e3 * v for v in scenario.launch_offsets_us()], scenario.seed)
    end, t_red = eng.run(scenario.routing_ids())
    trace = eng.trace()
    # the figures themselves (a hardware file may move or change; compare re-simulates with these)
    from .hardware import _FIGURES

    trace.meta = {**scenario.to_dict(), "source": "simulator", "hardware_name": hw.name,
                  "hardware_figures": {k: getattr(hw, k) for k in _FIGURES},
                  "plan": {"block_m": plan.ranks[0].config.block_m,
                           "experts_per_wave": plan.ranks[0].experts_per_wave,
                           "num_stages": plan.ranks[0].num_stages,
                           **({"ctas_per_sm": plan.ranks[0].ctas_per_sm, "wgmma_n_step": plan.ranks[0].wgmma_n_step}
                              if plan.design == "megamoe-sm90" else {})}}
    trace.topk_idx = scenario.routing_ids()
    res = SimResult(scenario=scenario, hardware=hw, plan=plan, trace=trace, rank_end_ns=end,
                    t_reduction_ns=t_red,
                    hbm_bytes_sim=np.array([h.total_bytes for h in eng.hbm]),
                    nvlink_bytes_sim=np.array([g.total_bytes for g in eng.egress]),
                    num_events=eng.n_events)
    res.summary = summarize(res)
    return res
