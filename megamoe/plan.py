"""The plan: every integer scheduling decision of a Mega MoE call, in one place.

``megamoe.plan`` is the single source of truth: the simulator (``sim``) consumes a
:class:`Plan`, and the compiled kernel receives the same numbers as parameters.  Nothing
here depends on timing.

Reference design ``deepgemm-sm100`` (DeepGEMM ``fp8_fp4_mega_moe`` for SM100; sources are
the files of github.com/deepseek-ai/DeepGEMM at the commits named):

* block config from expected tokens per expert ``e = T * R * k / E`` —
  ``csrc/jit_kernels/heuristics/mega_moe.hpp`` ``get_block_config_for_mega_moe`` (PR #316,
  commit 891d57b; block_k 256 for the smallest block_m as on main, commit 54e2261);
* experts per wave — ``get_num_experts_per_wave_for_mega_moe`` (main, 54e2261): the largest
  count whose worst-case wave fits the pool/ring, the smallest count that keeps
  ``2 * SMs`` L1 blocks busy (imbalance factor 2), then a tail-ratio sweep up to twice that;
* pipeline stages from the SMEM budget — ``get_pipeline_config_for_mega_moe`` (54e2261);
* bytes per pull: hidden bytes halved until <= 4096 (54e2261);
* pool capacity ``align(R*T_max*min(k, E_local) + E_local*(192-1), 384)`` —
  ``deep_gemm/include/deep_gemm/layout/mega_moe.cuh`` ``get_num_max_pool_tokens`` (891d57b);
* per-SM block order — ``deep_gemm/include/deep_gemm/scheduler/mega_moe.cuh``
  ``MegaMoEScheduler`` (7f2a703 = PR #304, unchanged in 891d57b): one global list per rank,
  wave by wave, all L1 blocks of the wave (expert, m block, n block; n fastest) then all L2
  blocks; SM ``s`` takes list entries ``s, s + S, s + 2S, ...`` (S = SMs); with S and the N
  block counts even, SMs ``2c`` and ``2c + 1`` (a 2-CTA cluster) always get the same
  (expert, m block) and adjacent n blocks;
* pull order inside an expert: round-robin min-remaining ("min-peeling") over source ranks —
  the dispatch loop of ``sm100_fp8_fp4_mega_moe.cuh`` (891d57b).

Our SM90 kernel's design (``megamoe-sm90``) lives in :mod:`megamoe.design_sm90` and is
selected with ``design="megamoe-sm90"``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from .errors import InputError, is_int, require

# Layout constants (DeepGEMM layout/mega_moe.cuh, 891d57b)
CANDIDATE_BLOCK_M = (8, 16, 32, 64, 96, 128, 192)
MAX_CANDIDATE_BLOCK_M = 192
LCM_CANDIDATE_BLOCK_M = 384
IMBALANCE_FACTOR = 2
PULL_THRESHOLD_BYTES = 4096
SM100_SMEM_CAPACITY = 232448  # SM100ArchSpec::smem_capacity (bytes per block)
#: The most SMs a plan takes (a GPU has 132 (H200) or 148 (B200); the simulator keeps state per
#: SM, and 100 M SMs from a hand-written hardware file once took 23 GB before it was cut off).
MAX_SMS = 1024
GRAN_K = 32  # UE8M0 scale granularity along K (recipe (1, 1, 32))

L1 = 1
L2 = 2


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def align(a: int, b: int) -> int:
    return ceil_div(a, b) * b


@dataclass(frozen=True)
class BlockConfig:
    """GEMM tiling of one design point.

    Attributes:
        block_m: tokens per block (rows of the pool block).
        block_n: output columns per block (weights rows), 128 in the reference.
        block_k: K per pipeline stage (elements; FP8/FP4 unpacked to 8 bit in SMEM).
        store_block_m: rows per epilogue TMA store.
        cluster_size: CTAs per cluster (2: 2-CTA UMMA with A multicast).
        num_epilogue_threads: 128 or 256 (1 or 2 epilogue warpgroups).
    """

    block_m: int
    block_n: int
    block_k: int
    store_block_m: int
    cluster_size: int
    num_epilogue_threads: int


# (upper bound of expected tokens per expert, block_m, store_block_m, block_k, epilogue WGs)
_SM100_BLOCK_TABLE = (
    (8.5, 16, 8, 256, 2),
    (16.5, 32, 16, 128, 2),
    (32.5, 64, 32, 128, 1),
    (64.5, 96, 16, 128, 2),
    (96.5, 128, 32, 128, 2),
    (math.inf, 192, 32, 128, 2),
)


def expected_tokens_per_expert(num_tokens: int, num_ranks: int, top_k: int, num_experts: int) -> float:
    """``T * R * k / E`` in float32 as the reference computes it."""
    return float(np.float32(num_tokens) * np.float32(num_ranks) * np.float32(top_k) / np.float32(num_experts))


def sm100_block_config(num_tokens: int, num_ranks: int, top_k: int, num_experts: int,
                       block_m: int | None = None) -> BlockConfig:
    """Block config of the reference design (``get_block_config_for_mega_moe``).

    ``block_m`` overrides the choice; the other fields then follow its table row.

    Raises:
        InputError: ``block_m`` not in the table (16, 32, 64, 96, 128, 192).
    """
    if block_m is not None:
        rows = [r for r in _SM100_BLOCK_TABLE if r[1] == block_m]
        require(bool(rows), "block_m", f"one of {', '.join(map(str, block_m_choices('deepgemm-sm100')))}", block_m)
        row = rows[0]
    else:
        e = expected_tokens_per_expert(num_tokens, num_ranks, top_k, num_experts)
        row = next(r for r in _SM100_BLOCK_TABLE if e <= r[0])
    _, bm, sbm, bk, wgs = row
    return BlockConfig(block_m=bm, block_n=128, block_k=bk, store_block_m=sbm, cluster_size=2,
                       num_epilogue_threads=128 * wgs)


def pool_capacity_tokens(num_ranks: int, max_tokens_per_rank: int, top_k: int,
                         experts_per_rank: int) -> int:
    """``align(R*T_max*min(k, E_local) + E_local*(192-1), 384)`` (``get_num_max_pool_tokens``)."""
    return align(num_ranks * max_tokens_per_rank * min(top_k, experts_per_rank)
                 + experts_per_rank * (MAX_CANDIDATE_BLOCK_M - 1), LCM_CANDIDATE_BLOCK_M)


def wave_pool_tokens(num_ranks: int, top_k: int, max_tokens_per_rank: int,
                     experts_per_wave: int, block_m: int) -> int:
    """Worst-case pool tokens one wave can need (``get_num_wave_pool_tokens``, main)."""
    from_all = max_tokens_per_rank * num_ranks
    if experts_per_wave == 1:
        return from_all
    return min(from_all * experts_per_wave,
               align(from_all * top_k + experts_per_wave * (block_m - 1), block_m))


def max_experts_per_wave(experts_per_rank: int, num_ranks: int, top_k: int, max_tokens_per_rank: int,
                         block_m: int, pool_tokens: int) -> int:
    """The most experts whose worst-case wave fits the pool (ring) of ``pool_tokens``.

    Raises:
        InputError: the pool cannot hold even one expert's worst-case wave.
    """
    max_epw = experts_per_rank
    while max_epw > 0 and wave_pool_tokens(num_ranks, top_k, max_tokens_per_rank, max_epw,
                                           block_m) > pool_tokens:
        max_epw -= 1
    require(max_epw > 0, "pool_tokens",
            f">= {wave_pool_tokens(num_ranks, top_k, max_tokens_per_rank, 1, block_m)} (one expert's worst-case wave)",
            pool_tokens)
    return max_epw


def sm100_experts_per_wave(experts_per_rank: int, num_tokens: int, top_k: int, intermediate: int,
                           block_m: int, block_n: int, num_sms: int, pool_tokens: int,
                           max_tokens_per_rank: int, num_ranks: int) -> int:
    """Experts per wave of the reference design (``get_num_experts_per_wave_for_mega_moe``).

    Raises:
        InputError: the pool cannot hold even one expert's worst-case wave.
    """
    max_epw = max_experts_per_wave(experts_per_rank, num_ranks, top_k, max_tokens_per_rank, block_m, pool_tokens)
    expected = float(np.float32(num_tokens * top_k) / np.float32(experts_per_rank))
    m_blocks = max(ceil_div(int(math.ceil(expected)), block_m), 1)
    l1_blocks_per_expert = m_blocks * ((2 * intermediate) // block_n)
    min_fill = ceil_div(IMBALANCE_FACTOR * num_sms, l1_blocks_per_expert)
    if expected < 1:
        min_fill = experts_per_rank
    if min_fill >= max_epw:
        return max_epw
    if l1_blocks_per_expert >= num_sms:
        return min_fill
    best, best_ratio = min_fill, -1.0
    for epw in range(min_fill, min(max_epw, 2 * min_fill) + 1):
        rem = experts_per_rank % epw
        ratio = 1.0 if rem == 0 else float(np.float32(rem) / np.float32(epw))
        if ratio > best_ratio:
            best, best_ratio = epw, ratio
    return best


def bytes_per_pull(hidden: int, elem_bytes: int = 1) -> int:
    """Hidden bytes halved until <= 4096 (``kPullThreshold``)."""
    n = hidden * elem_bytes
    while n > PULL_THRESHOLD_BYTES:
        n //= 2
    return n


def sm100_pipeline(smem_capacity: int, num_experts: int, hidden: int, cfg: BlockConfig,
                   pull_bytes: int, num_dispatch_warps: int = 4) -> tuple[int, int]:
    """(num_stages, smem_bytes) from the SMEM budget (``get_pipeline_config_for_mega_moe``).

    Raises:
        InputError: fewer than 2 stages fit (see :func:`smem_error`).
    """
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    epi_warps = cfg.num_epilogue_threads // 32
    send_buffers = align(pull_bytes * num_dispatch_warps, 1024)
    wgs = epi_warps // 4
    cd = align(max(wgs * cfg.store_block_m * (bn // 2) * 2, wgs * cfg.store_block_m * bn * 2), 1024)
    barriers = (num_dispatch_warps + 2 * 2 + epi_warps * 2) * 8
    amax = cfg.store_block_m * epi_warps * 4

    def fixed(experts: int) -> int:  # grows with the expert count (the dispatch's count table)
        return align(experts * 4, 1024) + send_buffers + cd + amax + barriers + 4

    sf_m, sf_n = align(bm, 128), align(bn, 128)
    per_stage = (bm // 2) * bk + bn * bk + sf_m * (bk // GRAN_K) + sf_n * (bk // GRAN_K) + 16
    stages = (smem_capacity - fixed(num_experts)) // per_stage
    if stages < 2:
        raise smem_error(lambda e: fixed(e) + 2 * per_stage, num_experts, bm, smem_capacity)
    return stages, fixed(num_experts) + stages * per_stage


def smem_error(need, num_experts: int, block_m: int, smem_capacity: int, stages: int = 2):
    """The error for a block whose fewest pipeline stages (2, or the design's minimum) do not
    fit shared memory, naming the input that makes it too large.

    The shape enters a block's shared memory through ``num_experts`` (the dispatch's
    per-expert tables; hidden and intermediate only through tile sizes that are bounded), so
    when a smaller expert count fits, the error names ``shape.num_experts`` and the largest
    count that fits; when not even one expert fits, it names
    ``hardware.smem_per_block_bytes``.

    Args:
        need: bytes of shared memory for ``stages`` stages as a function of the expert count
            (increasing).
        num_experts: the shape's expert count.
        block_m: the block's token rows (the stages' size).
        smem_capacity: the hardware's shared memory per block.
        stages: the fewest stages the design runs with.

    Returns:
        :class:`InputError` to raise.
    """
    if need(1) > smem_capacity:
        return InputError("hardware.smem_per_block_bytes",
                          f">= {need(1)} bytes for {stages} pipeline stages at block_m {block_m}", smem_capacity)
    lo, hi = 1, num_experts  # need(lo) fits, need(num_experts) does not: the largest count that fits
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if need(mid) <= smem_capacity else (lo, mid)
    return InputError("shape.num_experts",
                      f"at most {lo} experts (their dispatch tables and {stages} pipeline stages at block_m {block_m} "
                      f"need {need(num_experts)} bytes of shared memory per block, the hardware has {smem_capacity})",
                      num_experts)


def pull_order(counts: list[int] | np.ndarray) -> np.ndarray:
    """Round-robin min-remaining pull order for one expert.

    Args:
        counts: tokens each source rank sends to this expert, ``[R]``.

    Returns:
        int64 ``[sum(counts), 2]``: row i is ``(source rank, index within that rank's list)``
        of the i-th token placed in the expert's pool.  Each round takes the minimum
        remaining count ``L`` over still-active ranks and emits ``L * active`` slots,
        interleaving the active ranks slot by slot (seed 004's 5/3/9/2 example).
    """
    remaining = np.asarray(counts, dtype=np.int64).copy()
    out = np.empty((int(remaining.sum()), 2), dtype=np.int64)
    pos, offset = 0, 0
    while True:
        active = np.nonzero(remaining > 0)[0]
        if active.size == 0:
            break
        length = int(remaining[active].min())
        n = length * active.size
        out[pos:pos + n, 0] = np.tile(active, length)
        out[pos:pos + n, 1] = offset + np.repeat(np.arange(length), active.size)
        pos += n
        offset += length
        remaining[active] -= length
    return out


@dataclass
class RankPlan:
    """Decisions of one EP rank.

    Attributes:
        rank: EP rank index.
        num_tokens: tokens of this rank ``T_r``.
        combine_relay: ``megamoe-sm90`` what-if, one rank only: the combine is summed slice by
            slice while the GEMMs run (each token's 128-column slice by the dispatch warps of the
            SM that stores its last L2 row) and the call ends without a grid sync; False (the
            built kernels, EP and the reference design): the combine after the final barrier.
        config: block tiling (chosen from this rank's ``T_r`` as the reference does).
        experts_per_wave: local experts per wave.
        num_stages: SMEM pipeline stages; ``smem_bytes`` the SMEM they use.
        recv_counts: int64 ``[E_local, R]``, tokens source rank ``j`` sends to local expert ``e``.
        src_items: per local expert, per source rank, int64 ``[n, 2]`` of ``(token, slot)`` on the
            source rank in ascending order (the source index table; the reference fills it in
            atomic-arrival order, the plan fixes ascending order).
        num_sms: the units that run the rank's block list: the SMs, or at ``megamoe-sm90`` with
            ``ctas_per_sm`` 2 the CTAs (unit ``c`` runs rows ``c, c + num_sms, ..``).
        block_tickets: ``megamoe-sm90`` at two CTAs per SM (kernel v9.3,
            :func:`megamoe.design_sm90.block_tickets`): the units take the rows of
            :meth:`blocks` in list order as each becomes ready for its next one (a ticket per row),
            so :meth:`sm_blocks` is not what each unit runs; False: the static deal.
        wave_lag: the block list in the wave-lag order (``megamoe-sm90`` where ``block_tickets``,
            kernel v9.4, :func:`megamoe.design_sm90.wave_lag`,
            :class:`megamoe.policies.WaveLagScheduler`) instead of ``MegaMoEScheduler``'s.
        ctas_per_sm: ``megamoe-sm90``: CTAs sharing one SM (kernel v9.2,
            :func:`megamoe.design_sm90.ctas_per_sm`: 2 at block_m 16 and one rank where the one-CTA
            wave rule gives at most 128 experts per wave, else 1); 1 for the reference design.
        wgmma_n_step: ``megamoe-sm90``: the token step of the consumers' WGMMA N: a block's
            WGMMAs cover its valid rows rounded up to this (at most block_m,
            :func:`megamoe.design_sm90.wgmma_n`); block_m (or more) runs whole blocks. Kernel v9.12
            steps by 32 at block_m 128 and runs whole blocks below it
            (:data:`megamoe.design_sm90.WGMMA_N_STEP`). block_m for the reference design.
        local_count: ``megamoe-sm90`` at one rank, where the kernel runs its wide instance
            (:func:`megamoe.design_sm90.local_count`, kernel v8.9): every CTA counts all items
            itself and the pulls start with no count barrier; False elsewhere (a count barrier,
            or at EP > 1 the counts over NVLink).
    """

    rank: int
    num_tokens: int
    config: BlockConfig
    experts_per_wave: int
    num_stages: int
    smem_bytes: int
    recv_counts: np.ndarray
    src_items: list[list[np.ndarray]] = field(repr=False)
    num_sms: int = 0
    l1_n_blocks: int = 0
    l2_n_blocks: int = 0
    pull_policy: object = field(default=None, repr=False)
    scheduler: object = field(default=None, repr=False)
    k_split: int = 1
    wgmma_n_step: int = 0
    combine_relay: bool = False
    local_count: bool = False
    ctas_per_sm: int = 1
    block_tickets: bool = False
    wave_lag: bool = False
    _blocks: np.ndarray | None = field(default=None, repr=False)
    _orders: dict = field(default_factory=dict, repr=False)

    @property
    def tokens_per_expert(self) -> np.ndarray:
        """int64 ``[E_local]``: routed items each local expert receives."""
        return self.recv_counts.sum(axis=1)

    @property
    def m_blocks_per_expert(self) -> np.ndarray:
        """int64 ``[E_local]``: ``ceil(tokens / block_m)``."""
        return -(-self.tokens_per_expert // self.config.block_m)

    @property
    def pool_block_offset(self) -> np.ndarray:
        """int64 ``[E_local + 1]``: first pool block of each expert (block_m-padded), and total."""
        return np.concatenate([[0], np.cumsum(self.m_blocks_per_expert)])

    @property
    def num_waves(self) -> int:
        return ceil_div(len(self.recv_counts), self.experts_per_wave)

    @property
    def lists_wave_lag(self) -> bool:
        """Whether :meth:`blocks` lists the wave-lag order and it differs from the plain one (more
        than one wave): the plan's own list where ``wave_lag``, or a scheduler policy that is
        :class:`megamoe.policies.WaveLagScheduler` (a policy that replaces the list with another
        order does not)."""
        from .policies import WaveLagScheduler

        lag = self.wave_lag if self.scheduler is None else isinstance(self.scheduler, WaveLagScheduler)
        return lag and self.num_waves > 1

    def blocks(self) -> np.ndarray:
        """The rank's global block list (``MegaMoEScheduler`` order, or the wave-lag order where
        ``wave_lag``, unless a scheduler policy replaces it).

        With ``k_split`` > 1 every block of that list becomes ``k_split`` consecutive rows,
        one per equal part of its K blocks (``k_part`` 0, 1, ...); the last part's CTA adds the
        others' FP32 partial sums and runs the epilogue (a what-if of the simulator: the SM90
        kernel is built for ``k_split`` 1).

        Returns:
            int32 ``[N, 6]`` rows ``(phase, local expert, m block, n block, wave, k_part)``,
            phase 1 = L1, 2 = L2.  SM ``s`` executes rows ``s, s + S, s + 2S, ...`` (see
            :meth:`sm_blocks`).
        """
        if self._blocks is None:
            from .policies import (
                ScheduleContext,
                WaveLagScheduler,
                WaveScheduler,
                call_block_list,
            )

            ctx = ScheduleContext(self.m_blocks_per_expert, self.l1_n_blocks, self.l2_n_blocks,
                                  self.experts_per_wave, self.num_sms)
            ref = (WaveLagScheduler() if self.wave_lag else WaveScheduler()).block_list(ctx)
            blk = ref if self.scheduler is None else call_block_list(
                self.scheduler, ctx, ref, pairs=self.config.cluster_size == 2)
            ks = self.k_split
            self._blocks = np.column_stack([np.repeat(blk, ks, axis=0),
                                            np.tile(np.arange(ks, dtype=blk.dtype), len(blk))]).astype(np.int32)
        return self._blocks

    def sm_blocks(self, sm: int) -> np.ndarray:
        """Rows of :meth:`blocks` executed by SM ``sm``, in order (the static deal; with
        ``block_tickets`` the kernel's units take rows at run time instead)."""
        require(0 <= sm < self.num_sms, "sm", f"in [0, {self.num_sms})", sm)
        return self.blocks()[sm::self.num_sms]

    def pull_order(self, expert: int) -> np.ndarray:
        """Pull order of local expert ``expert``: round-robin min-remaining (see
        :func:`pull_order`) unless a pull-order policy replaces it."""
        if expert not in self._orders:
            if self.pull_policy is None:
                self._orders[expert] = pull_order(self.recv_counts[expert])
            else:
                from .policies import call_pull_order

                self._orders[expert] = call_pull_order(self.pull_policy, self.recv_counts[expert])
        return self._orders[expert]

    def pool_sources(self, expert: int) -> np.ndarray:
        """int64 ``[n, 3]``: ``(source rank, token, slot)`` of each pool row of ``expert``, in
        pool order (the TokenSrcMetadata the L2 epilogue uses to write back)."""
        order = self.pull_order(expert)
        out = np.empty((len(order), 3), dtype=np.int64)
        out[:, 0] = order[:, 0]
        for j in np.unique(order[:, 0]) if len(order) else []:
            sel = order[:, 0] == j
            out[sel, 1:] = self.src_items[expert][j][order[sel, 1]]
        return out


@dataclass
class Plan:
    """All decisions of one Mega MoE call over ``R`` ranks.

    Attributes:
        design: design name (``deepgemm-sm100`` or ``megamoe-sm90``).
        num_experts, top_k, hidden, intermediate: the shape.
        num_ranks: EP size; ``experts_per_rank = num_experts // num_ranks``.
        max_tokens_per_rank: buffer size ``T_max``.
        num_sms: SMs the kernel runs on (hardware SMs minus reserved ones).
        pool_tokens: pool (ring) capacity in tokens (``megamoe-sm90``: no ring, the kernel's pool
            rows, ``design_sm90.pool_rows_for``, the largest over the ranks).
        bytes_per_pull: bytes per dispatch pull chunk.
        l2_wait: ``"k_block"`` (an L2 K block waits for its gate and up L1 N blocks, PR #304)
            or ``"pool_block"`` (waits for the whole pool block's L1 output, PR #316).
        ranks: per-rank decisions.
    """

    design: str
    num_experts: int
    top_k: int
    hidden: int
    intermediate: int
    num_ranks: int
    max_tokens_per_rank: int
    num_sms: int
    pool_tokens: int
    bytes_per_pull: int
    l2_wait: str
    ranks: list[RankPlan]
    policies: dict = field(default_factory=dict)

    @property
    def experts_per_rank(self) -> int:
        return self.num_experts // self.num_ranks

    def num_recv_tokens(self) -> np.ndarray:
        """int64 ``[R]``: routed items each rank receives (``num_recv_tokens`` of the test)."""
        return np.array([int(r.recv_counts.sum()) for r in self.ranks], dtype=np.int64)

    def memory_per_rank(self) -> dict[str, int]:
        """HBM bytes one rank's call holds, by part: ``weights`` (its local experts' packed E2M1 weights,
        ``1.5 H I`` bytes an expert, and their UE8M0 / fold scales, one byte per 32), ``pools`` (the
        expert-contiguous L1 and L2 pools of ``pool_tokens`` rows with their scales and per-row
        metadata), ``combine`` (the BF16 combine buffer ``[top_k, T_max, H]``) and ``input`` (the
        FP8 tokens, their scales and top-k ids and weights of ``T_max`` tokens), and ``total``.

        ``deepgemm-sm100``: the symmetric buffer's regions as ``get_symm_buffer_size_for_mega_moe``
        lays them out (DeepGEMM ``csrc/apis/mega.hpp``, as shared/seeds/004 describes it: x, x_sf,
        int64 top-k ids, FP32 weights; L1 pool + UE8M0 scales + FP32 top-k weight, L2 pool + scales;
        combine), its workspace counters (a few KB) left out. ``megamoe-sm90``: the buffers
        ``megamoe.kernel.runtime`` allocates (``pool_buffers``: FP8 rows, their UE8M0 bytes and FP32
        64-K scales, token / slot / weight per row, arrival count and mask per pool block; the
        combine buffer and the items' order), the caller's own input tensors counted as ``input``.
        An estimate for the SM100 design (the layout from the seed, not from DeepGEMM's code run here).
        """
        H, I, k, T, P = self.hidden, self.intermediate, self.top_k, self.max_tokens_per_rank, self.pool_tokens
        weights = self.experts_per_rank * (3 * H * I // 2 + 3 * H * I // 32)
        combine = k * T * H * 2
        if self.design == "megamoe-sm90":
            bm = self.ranks[0].config.block_m
            pools = (P * (H + H // 128 * 4 + I + I // 128 * 4 + 12)  # rows, UE8M0 bytes, token / slot / weight
                     + (H + I) // 128 * (P // bm) * 2 * bm * 4  # FP32 scales per 64-K group and pool block
                     + (P // bm) * 12)  # arrival count, L1 N-block mask
            inputs = T * (H + H // 32 + k * 4 + k * 4) + 2 * T * k * 4  # x, x_sf, int32 ids, weights; item order
        else:
            pools = P * (H + H // 32 + 4 + I + I // 32)
            inputs = T * (H + H // 32 + k * 8 + k * 4)
        out = {"weights": weights, "pools": pools, "combine": combine, "input": inputs}
        out["total"] = sum(out.values())
        return out

    def to_dict(self) -> dict:
        """Every plan number as plain JSON types (per-rank arrays summarised)."""
        out = {k: getattr(self, k) for k in ("design", "num_experts", "top_k", "hidden",
                                             "intermediate", "num_ranks", "max_tokens_per_rank",
                                             "num_sms", "pool_tokens", "bytes_per_pull", "l2_wait",
                                             "policies")}
        out["experts_per_rank"] = self.experts_per_rank
        out["memory_per_rank_bytes"] = self.memory_per_rank()
        out["ranks"] = [{
            "rank": r.rank, "num_tokens": r.num_tokens, **asdict(r.config),
            "experts_per_wave": r.experts_per_wave, "num_waves": r.num_waves,
            "num_stages": r.num_stages, "smem_bytes": r.smem_bytes,
            "l1_n_blocks": r.l1_n_blocks, "l2_n_blocks": r.l2_n_blocks,
            "num_recv_tokens": int(r.recv_counts.sum()),
            "tokens_per_expert": r.tokens_per_expert.tolist(),
            "pool_block_offset": r.pool_block_offset.tolist(),
            "k_split": r.k_split, "wgmma_n_step": r.wgmma_n_step, "combine_relay": r.combine_relay,
            "local_count": r.local_count,
            "ctas_per_sm": r.ctas_per_sm, "num_units": r.num_sms, "block_tickets": r.block_tickets, "wave_lag": r.wave_lag,
            "num_blocks": int(len(r.blocks())),
        } for r in self.ranks]
        return out


def route_to_ranks(topk_idx: list[np.ndarray], num_experts: int, num_ranks: int
                   ) -> tuple[np.ndarray, list[list[list[np.ndarray]]]]:
    """Group routed items by (destination rank, local expert, source rank).

    Returns:
        ``counts`` int64 ``[R_dst, E_local, R_src]`` and ``items[dst][e][src]`` int64
        ``[n, 2]`` of ``(token, slot)`` in ascending order.
    """
    e_local = num_experts // num_ranks
    counts = np.zeros((num_ranks, e_local, num_ranks), dtype=np.int64)
    items = [[[None] * num_ranks for _ in range(e_local)] for _ in range(num_ranks)]
    for src, ids in enumerate(topk_idx):
        flat = ids.reshape(-1)
        valid = np.nonzero(flat >= 0)[0]
        experts = flat[valid]
        order = np.argsort(experts, kind="stable")  # ascending (token, slot) inside each expert
        valid, experts = valid[order], experts[order]
        bounds = np.searchsorted(experts, np.arange(num_experts + 1))
        k = ids.shape[1] if ids.ndim == 2 else 1
        for g in range(num_experts):
            sel = valid[bounds[g]:bounds[g + 1]]
            dst, e = divmod(g, e_local)
            counts[dst, e, src] = len(sel)
            items[dst][e][src] = np.stack([sel // k, sel % k], axis=1) if len(sel) else np.zeros((0, 2), np.int64)
    return counts, items


DESIGNS = ("deepgemm-sm100", "megamoe-sm90")
#: The compute-capability family each design's kernel is built for (sim.hardware's ``arch``):
#: DeepGEMM's reference uses SM100's tcgen05 MMA, tensor memory and FP4 operands; this project's
#: SM90 kernel uses sm_90a's WGMMA, which SM100 GPUs do not run.
DESIGN_ARCH = {"deepgemm-sm100": "sm100", "megamoe-sm90": "sm90"}


def block_m_choices(design: str) -> tuple[int, ...]:
    """The block_m values a design takes: the SM100 reference's block table (DeepGEMM
    ``get_block_config_for_mega_moe``), or the SM90 kernel's compiled instances
    (:data:`megamoe.design_sm90.BLOCK_MS`).

    Raises:
        InputError: ``design`` not one of :data:`DESIGNS`.
    """
    require(design in DESIGNS, "design", " or ".join(DESIGNS), design)
    if design == "megamoe-sm90":
        from . import design_sm90

        return tuple(design_sm90.BLOCK_MS)
    return tuple(r[1] for r in _SM100_BLOCK_TABLE)


def sm90_block_config(num_tokens: int, num_ranks: int, top_k: int, num_experts: int,
                      block_m: int | None = None) -> BlockConfig:
    """Block config of this project's SM90 kernel (:mod:`megamoe.design_sm90`): one CTA per
    SM, block_m the smallest of 16/32/64/128 holding the expected tokens per expert,
    block_n = block_k = 128, 8 consumer warps (256 threads) doing MMA and epilogue.

    Raises:
        InputError: ``block_m`` not one the kernel is compiled for.
    """
    from . import design_sm90 as d

    if block_m is None:
        block_m = d.block_m_for(expected_tokens_per_expert(num_tokens, num_ranks, top_k, num_experts))
    require(block_m in d.BLOCK_MS, "block_m", f"one of {', '.join(map(str, d.BLOCK_MS))} (SM90 kernel)", block_m)
    return BlockConfig(block_m=block_m, block_n=d.BLOCK_N, block_k=d.BLOCK_K, store_block_m=block_m,
                       cluster_size=d.CTAS_PER_SM, num_epilogue_threads=32 * d.CONSUMER_WARPS)


def build_plan(*, num_experts: int, top_k: int, hidden: int, intermediate: int, num_ranks: int,
               tokens_per_rank: list[int], max_tokens_per_rank: int, topk_idx: list[np.ndarray],
               num_sms: int, smem_capacity: int = SM100_SMEM_CAPACITY,
               design: str = "deepgemm-sm100", experts_per_wave: int | None = None,
               block_m: int | None = None, pool_tokens: int | None = None,
               num_stages: int | None = None, l2_wait: str = "k_block", k_split: int | None = None,
               combine_relay: bool | None = None, policies=None, ctas_per_sm: int | None = None,
               wgmma_n_step: int | None = None) -> Plan:
    """Make every scheduling decision for one call.

    Args:
        num_experts, top_k, hidden, intermediate: MoE shape.
        num_ranks: EP size R (divides ``num_experts``).
        tokens_per_rank: ``T_r`` per rank (each <= ``max_tokens_per_rank``).
        max_tokens_per_rank: ``T_max``.
        topk_idx: per rank int ``[T_r, k]`` expert ids, ``-1`` masked.
        num_sms: SMs available to the kernel (even for the 2-CTA reference design).
        smem_capacity: SMEM bytes per block of the target GPU.
        design: ``deepgemm-sm100`` or ``megamoe-sm90``.
        experts_per_wave, block_m, pool_tokens, num_stages: overrides of the heuristics
            (``pool_tokens`` only for ``deepgemm-sm100``: the SM90 kernel has no pool ring;
            ``num_stages`` at least one per issuing producer warp there,
            ``design_sm90.min_stages``).
        l2_wait: ``k_block`` or ``pool_block`` (see :class:`Plan`).
        k_split: ``megamoe-sm90`` only, a what-if: every block's K blocks split into this many
            equal parts on consecutive block indices (split-K; see :meth:`RankPlan.blocks`);
            None or 1: no split (the built kernel). It must divide both GEMMs' K block counts
            (``hidden / 128`` and ``intermediate / 128``).
        wgmma_n_step: ``megamoe-sm90`` only, a what-if: each block's WGMMAs at its valid rows
            rounded up to this many tokens (see :class:`RankPlan`), a multiple of 8 from 8 to 128;
            None: the built kernel's step (:data:`megamoe.design_sm90.WGMMA_N_STEP`, whole blocks
            where it has none).
        combine_relay: ``megamoe-sm90`` with one rank only, a what-if (see :class:`RankPlan`):
            True models it; None or False: the combine after the final barrier, as the kernel is
            built.
        policies: :class:`megamoe.policies.Policies` replacing reference heuristics (the
            explicit overrides above still win).
        ctas_per_sm: ``megamoe-sm90`` only: None (the rule,
            :func:`megamoe.design_sm90.ctas_and_experts_per_wave`), 1, or 2 where the kernel has
            a two-CTA instance (block_m 16, one rank; with the wide walk since kernel v9.5).

    Raises:
        InputError: any inconsistent input (named field, expected, got).
    """
    require(num_ranks >= 1 and num_experts % num_ranks == 0, "ranks",
            f"a divisor of num_experts ({num_experts})", num_ranks)
    require(len(tokens_per_rank) == num_ranks and len(topk_idx) == num_ranks, "tokens_per_rank",
            f"{num_ranks} entries (one per rank)", len(tokens_per_rank))
    require(l2_wait in ("k_block", "pool_block"), "l2_wait", "k_block or pool_block", l2_wait)
    require(isinstance(num_sms, (int, np.integer)) and 2 <= num_sms <= MAX_SMS, "num_sms",
            f"an integer in [2, {MAX_SMS}]", num_sms)
    e_local = num_experts // num_ranks
    require(design in DESIGNS, "design", " or ".join(DESIGNS), design)
    require(ctas_per_sm is None or design == "megamoe-sm90", "ctas_per_sm",
            "no value with design deepgemm-sm100 (2-CTA clusters there, not CTAs sharing an SM; the option is "
            "megamoe-sm90's)", ctas_per_sm)
    sm90 = design == "megamoe-sm90"
    require(k_split is None or (is_int(k_split) and k_split >= 1), "k_split", "None or an integer >= 1", k_split)
    ks = 1 if k_split is None else int(k_split)
    require(sm90 or ks == 1, "k_split", "1 with design deepgemm-sm100 (split-K is modelled for megamoe-sm90 only)", ks)
    require(combine_relay in (None, False, True), "combine_relay", "None, False or True", combine_relay)
    from .design_sm90 import WGMMA_N_STEPS, WGMMA_N_STEPS_SAID

    require(wgmma_n_step is None or (is_int(wgmma_n_step) and wgmma_n_step in WGMMA_N_STEPS),
            "wgmma_n_step", f"{WGMMA_N_STEPS_SAID} (WGMMA N steps of 8 tokens; unset: the kernel's)",
            wgmma_n_step)
    require(sm90 or wgmma_n_step is None, "wgmma_n_step",
            "no value with design deepgemm-sm100 (the WGMMA N step is modelled for megamoe-sm90)", wgmma_n_step)
    # the CLI's on / off beside the API's True / False (combine_relay is True when these fail)
    require(sm90 or not combine_relay, "combine_relay",
            "off (False or None) with design deepgemm-sm100 (the relay is modelled for megamoe-sm90)", "on (True)")
    require(num_ranks == 1 or not combine_relay, "combine_relay",
            "off (False or None) with several ranks (the relay is modelled for one rank)", "on (True)")
    if sm90:  # no ring: the SM90 kernel's pool holds every routed row (each rank's cap, below)
        from . import design_sm90

        kb1, kb2 = hidden // design_sm90.BLOCK_K, intermediate // design_sm90.BLOCK_K
        require(kb1 % ks == 0 and kb2 % ks == 0, "k_split",
                f"a divisor of both GEMMs' K blocks ({kb1} and {kb2})", ks)
        require(pool_tokens is None, "pool_tokens",
                "no override with design megamoe-sm90 (its pool holds every routed row, sized by the kernel)",
                pool_tokens)
    else:
        require(num_sms % 2 == 0, "num_sms", "an even number (2-CTA clusters)", num_sms)
        require((2 * intermediate) % 256 == 0 and hidden % 256 == 0, "shape",
                "2*intermediate and hidden multiples of 256 (even N block counts for 2-CTA pairs)",
                f"hidden {hidden}, intermediate {intermediate}")
        full = pool_capacity_tokens(num_ranks, max_tokens_per_rank, top_k, e_local)
        cap = pool_tokens if pool_tokens is not None else full
        require(cap > 0, "pool_tokens", "> 0", cap)
        require(cap <= full, "pool_tokens",
                f"at most {full} (the most one call can need, DeepGEMM's get_num_max_pool_tokens: a larger ring "
                "holds nothing more)", cap)
    pull = bytes_per_pull(hidden)
    counts, items = route_to_ranks(topk_idx, num_experts, num_ranks)
    from .policies import (
        BlockContext,
        Policies,
        WaveContext,
        call_block_config,
        call_wave,
    )

    pol = policies or Policies()
    ranks = []
    sm90_pool = 0
    for r in range(num_ranks):
        tpe = counts[r].sum(axis=1)
        if pol.block_config is not None and block_m is None:
            cfg = call_block_config(pol.block_config, BlockContext(
                tokens_per_rank[r], num_ranks, top_k, num_experts, hidden, intermediate, tpe))
        elif sm90:
            cfg = sm90_block_config(tokens_per_rank[r], num_ranks, top_k, num_experts, block_m)
        else:
            cfg = sm100_block_config(tokens_per_rank[r], num_ranks, top_k, num_experts, block_m)
        require(intermediate % cfg.block_k == 0 and hidden % cfg.block_k == 0, "shape",
                f"hidden and intermediate multiples of block_k {cfg.block_k}",
                f"hidden {hidden}, intermediate {intermediate}")
        if experts_per_wave is not None:
            require(1 <= experts_per_wave <= e_local, "experts_per_wave",
                    f"in [1, {e_local}] (local experts)", experts_per_wave)
        ctas = 1
        if sm90:
            # the rank's pool: every routed row plus each local expert's block padding
            cap = design_sm90.pool_rows_for(max_tokens_per_rank, top_k, num_experts, cfg.block_m, num_ranks)
            sm90_pool = max(sm90_pool, cap)
            ctas, epw = design_sm90.ctas_and_experts_per_wave(
                cfg.block_m, e_local, expected_tokens_per_expert(tokens_per_rank[r], num_ranks, top_k, num_experts),
                intermediate, num_sms, num_ranks, experts_per_wave, ctas_per_sm)
        else:
            epw = sm100_experts_per_wave(e_local, tokens_per_rank[r], top_k, intermediate,
                                         cfg.block_m, cfg.block_n, num_sms, cap,
                                         max_tokens_per_rank, num_ranks)
        if pol.wave is not None:
            max_epw = max_experts_per_wave(e_local, num_ranks, top_k, max_tokens_per_rank, cfg.block_m, cap)
            epw = call_wave(pol.wave, WaveContext(
                e_local, tokens_per_rank[r], top_k, hidden, intermediate, cfg.block_m, cfg.block_n,
                num_sms * ctas, cap, max_tokens_per_rank, num_ranks, tpe, max_epw))
        if experts_per_wave is not None:
            epw = experts_per_wave
        if sm90:
            stages = design_sm90.stages_for_ctas(cfg.block_m, num_experts, ctas, num_stages, smem_capacity)
            smem = design_sm90.smem_bytes(cfg.block_m, stages, num_experts)
        else:
            stages, smem = sm100_pipeline(smem_capacity, num_experts, hidden, cfg, pull)
            if num_stages is not None:
                require(2 <= num_stages <= stages, "num_stages",
                        f"in [2, {stages}] (what {smem_capacity} B of shared memory holds at block_m {cfg.block_m})",
                        num_stages)
                stages = num_stages
        rp = RankPlan(rank=r, num_tokens=tokens_per_rank[r], config=cfg, experts_per_wave=epw,
                      num_stages=stages, smem_bytes=smem, recv_counts=counts[r], src_items=items[r],
                      num_sms=num_sms * ctas, ctas_per_sm=ctas,
                      block_tickets=sm90 and design_sm90.block_tickets(ctas),
                      wave_lag=sm90 and design_sm90.wave_lag(ctas), l1_n_blocks=2 * intermediate // cfg.block_n,
                      l2_n_blocks=hidden // cfg.block_n, pull_policy=pol.pull_order,
                      scheduler=pol.scheduler, k_split=ks, combine_relay=bool(combine_relay),
                      wgmma_n_step=(min(cfg.block_m, int(wgmma_n_step)) if wgmma_n_step is not None
                                    else design_sm90.kernel_wgmma_n_step(cfg.block_m)) if sm90 else cfg.block_m,
                      local_count=sm90 and design_sm90.local_count(cfg.block_m, epw, num_ranks))
        used = int(rp.pool_block_offset[-1]) * cfg.block_m
        if pool_tokens is None:
            assert used <= cap, (used, cap)  # guaranteed by the capacity formula
        ranks.append(rp)
    return Plan(design=design, num_experts=num_experts, top_k=top_k, hidden=hidden,
                intermediate=intermediate, num_ranks=num_ranks,
                max_tokens_per_rank=max_tokens_per_rank, num_sms=num_sms, pool_tokens=sm90_pool if sm90 else cap,
                bytes_per_pull=pull, l2_wait=l2_wait, ranks=ranks, policies=pol.names())
