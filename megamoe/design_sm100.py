"""The SM100 (B200) kernel in ``csrc/megamoe/kernel_sm100.cu``: the numbers it takes from the plan.

The SM100 kernel implements the reference design ``deepgemm-sm100`` of :mod:`megamoe.plan`;
it never re-derives a scheduling number. :func:`config_from_plan` reads them off a
:class:`megamoe.plan.Plan` (block_m / block_n / block_k, pipeline stages, experts per
wave, bytes per pull, pool capacity, SMs) and adds only layout facts that follow from them
(the padded scale-pool rows). Template instances exist for every (block_m, block_k) row of
the reference block table (:data:`INSTANCES`). :func:`design_for` gives the same numbers for
one EP=1 call from its token count alone (calling the plan's functions, as ``build_plan`` does),
which is what ``megamoe.kernel.MegaMoEKernel`` launches with on a 10.0 device.

Status: compiled for sm_100a and disassembled (``tests/test_kernel_sm100.py``); **never
executed** -- no SM100 GPU was available. See ``benchmarks/NOTES_kernel.md`` ("SM100 path").

Shared-memory formulas mirror ``csrc/megamoe/kernel_sm100.cu`` (a GPU-free test compares them
with the compiled library's ``megamoe_sm100_smem_bytes``). The per-stage operand bytes equal
the plan's per-stage bytes minus the plan's 16 bytes of stage barriers (the kernel keeps its
barriers in a fixed 1 KB block), so the plan's stage count always fits.
"""

from __future__ import annotations

import ctypes
from dataclasses import asdict, dataclass

from .errors import require

#: (block_m, block_k) template instances: the rows of ``megamoe.plan``'s SM100 block table.
INSTANCES = ((16, 256), (32, 128), (64, 128), (96, 128), (128, 128), (192, 128))
BLOCK_N = 128
THREADS = 512
#: Warp roles: 0-3 dispatch, 4-6 producer, 7 MMA (leader CTA of the pair), 8-15 epilogue.
DISPATCH_WARPS, PRODUCER_WARPS, MMA_WARPS, EPILOGUE_WARPS = 4, 3, 1, 8
CLUSTER_SIZE = 2
ACC_STAGES = 2
#: Largest dynamic shared memory per block on SM100 (``megamoe.plan.SM100_SMEM_CAPACITY``).
SMEM_LIMIT_SM100 = 232448
MAX_STAGES = 32


def _align(x: int, a: int) -> int:
    return (x + a - 1) // a * a


def sf_block_m(block_m: int) -> int:
    """Token-scale rows per pool block: block_m padded to the 128-row UTCCP tile."""
    return _align(block_m, 128)


def stage_bytes(block_m: int, block_k: int) -> int:
    """Operand bytes of one stage: token half-tile, unpacked FP4 weight tile, both scale tiles."""
    return (block_m // 2) * block_k + BLOCK_N * block_k + sf_block_m(block_m) * (block_k // 32) + BLOCK_N * (block_k // 32)


def fixed_bytes(num_experts: int) -> int:
    """1 KB alignment slack + (1 KB barriers, dispatch scratch, epilogue amax) rounded to 1 KB."""
    return 1024 + _align(1024 + _align(num_experts * 12 + 64, 128) + 2 * 4 * 8 * 4, 1024)


def smem_bytes(block_m: int, block_k: int, num_stages: int, num_experts: int) -> int:
    return fixed_bytes(num_experts) + num_stages * stage_bytes(block_m, block_k)


def tmem_columns(block_m: int, block_k: int) -> int:
    """TMEM columns allocated per CTA: 2 accumulator stages + token and weight scale columns."""
    used = ACC_STAGES * block_m + (block_k // 128) * (sf_block_m(block_m) // 32 + 4)
    return next(c for c in (32, 64, 128, 256, 512) if used <= c)


@dataclass(frozen=True)
class SM100KernelConfig:
    """Every number the SM100 kernel takes from a ``deepgemm-sm100`` plan (one rank)."""
    block_m: int
    block_n: int
    block_k: int
    num_stages: int
    experts_per_wave: int
    bytes_per_pull: int
    pool_tokens: int
    num_sms: int
    sf_pool_rows: int
    smem_bytes: int
    cluster_size: int = CLUSTER_SIZE
    threads: int = THREADS

    def as_dict(self) -> dict:
        return asdict(self)


def config_from_plan(plan, rank: int = 0) -> SM100KernelConfig:
    """The kernel's numbers for ``plan.ranks[rank]`` -- read off the plan, not re-derived.

    Raises:
        InputError: not a ``deepgemm-sm100`` plan, no compiled instance for its (block_m,
            block_k), odd SM count, or stages beyond the kernel's shared memory.
    """
    require(plan.design == "deepgemm-sm100", "plan.design", "deepgemm-sm100", plan.design)
    require(0 <= rank < len(plan.ranks), "rank", f"in [0, {len(plan.ranks)})", rank)
    r = plan.ranks[rank]
    cfg = r.config
    require((cfg.block_m, cfg.block_k) in INSTANCES, "block config", f"(block_m, block_k) in {INSTANCES}",
            (cfg.block_m, cfg.block_k))
    require(cfg.block_n == BLOCK_N and cfg.cluster_size == CLUSTER_SIZE, "block config",
            f"block_n {BLOCK_N}, cluster_size {CLUSTER_SIZE}", (cfg.block_n, cfg.cluster_size))
    require(plan.num_sms % 2 == 0, "num_sms", "even (2-CTA clusters)", plan.num_sms)
    require(plan.pool_tokens % cfg.block_m == 0, "pool_tokens", f"a multiple of block_m {cfg.block_m}",
            plan.pool_tokens)
    smem = smem_bytes(cfg.block_m, cfg.block_k, r.num_stages, plan.num_experts)
    require(smem <= SMEM_LIMIT_SM100, "num_stages", f"fitting {SMEM_LIMIT_SM100} B of shared memory",
            f"{r.num_stages} stages = {smem} B")
    return SM100KernelConfig(
        block_m=cfg.block_m, block_n=cfg.block_n, block_k=cfg.block_k, num_stages=r.num_stages,
        experts_per_wave=r.experts_per_wave, bytes_per_pull=plan.bytes_per_pull, pool_tokens=plan.pool_tokens,
        num_sms=plan.num_sms, sf_pool_rows=plan.pool_tokens // cfg.block_m * sf_block_m(cfg.block_m),
        smem_bytes=smem)


def params_type():
    """ctypes mirror of ``megamoe::Sm100Params`` (kernel_sm100.cu): the shared ``Params``
    (``megamoe.kernel.runtime.Params``, kept in step with ``params.h`` by its owner) followed
    by block_k, pull_bytes, sf_pool_rows and a reserved word."""
    from .kernel.runtime import Params

    class Sm100Params(ctypes.Structure):
        _fields_ = [("base", Params), ("block_k", ctypes.c_int64), ("pull_bytes", ctypes.c_int64),
                    ("sf_pool_rows", ctypes.c_int64), ("reserved", ctypes.c_int64)]

    return Sm100Params


def design_for(num_tokens: int, max_tokens: int, hidden: int, inter: int, num_experts: int, topk: int,
               num_sms: int, *, block_m: int | None = None, num_stages: int | None = None,
               experts_per_wave: int | None = None, smem_capacity: int | None = None) -> SM100KernelConfig:
    """The kernel's numbers for one EP=1 call of ``num_tokens`` tokens, without a plan.

    The SM100 counterpart of ``design_sm90.design_for``: the same functions of
    :mod:`megamoe.plan`, in the same order, that ``build_plan(design="deepgemm-sm100",
    num_ranks=1, tokens_per_rank=[num_tokens], max_tokens_per_rank=max_tokens, ...)`` calls for
    its one rank, so the result equals ``config_from_plan`` of that plan field by field
    (``tests/test_kernel_sm100.py``). Nothing here depends on the routing: block config from the
    expected tokens per expert, pool capacity from ``max_tokens``, experts per wave from both,
    stages from the SMEM budget, bytes per pull from ``hidden``.

    Args:
        num_tokens: tokens of this call (``0 <= num_tokens <= max_tokens``).
        max_tokens: the kernel's token capacity (the plan's ``max_tokens_per_rank``).
        hidden, inter, num_experts, topk: the shape.
        num_sms: the persistent grid (even: 2-CTA clusters).
        block_m, num_stages, experts_per_wave: overrides, with ``build_plan``'s checks.
        smem_capacity: SMEM budget of the plan's stage count (default ``plan.SM100_SMEM_CAPACITY``).

    Raises:
        InputError: a shape the plan or the kernel does not take, an override out of range.
    """
    from . import plan as P

    cap_smem = P.SM100_SMEM_CAPACITY if smem_capacity is None else smem_capacity
    require(max_tokens >= 1, "max_tokens", ">= 1", max_tokens)
    require(0 <= num_tokens <= max_tokens, "num_tokens", f"in [0, {max_tokens}] (max_tokens)", num_tokens)
    require(num_sms >= 2 and num_sms % 2 == 0, "num_sms", "an even number >= 2 (2-CTA clusters)", num_sms)
    require((2 * inter) % 256 == 0 and hidden % 256 == 0, "shape",
            "2*intermediate and hidden multiples of 256 (even N block counts for 2-CTA pairs)",
            f"hidden {hidden}, intermediate {inter}")
    pool = P.pool_capacity_tokens(1, max_tokens, topk, num_experts)
    pull = P.bytes_per_pull(hidden)
    cfg = P.sm100_block_config(num_tokens, 1, topk, num_experts, block_m)
    require(inter % cfg.block_k == 0 and hidden % cfg.block_k == 0, "shape",
            f"hidden and intermediate multiples of block_k {cfg.block_k}", f"hidden {hidden}, intermediate {inter}")
    epw = P.sm100_experts_per_wave(num_experts, num_tokens, topk, inter, cfg.block_m, cfg.block_n, num_sms, pool,
                                   max_tokens, 1)
    if experts_per_wave is not None:
        require(1 <= experts_per_wave <= num_experts, "experts_per_wave", f"in [1, {num_experts}] (local experts)",
                experts_per_wave)
        epw = experts_per_wave
    stages, _ = P.sm100_pipeline(cap_smem, num_experts, hidden, cfg, pull)
    if num_stages is not None:
        require(2 <= num_stages <= stages, "num_stages", f"in [2, {stages}] (SMEM budget)", num_stages)
        stages = num_stages
    require((cfg.block_m, cfg.block_k) in INSTANCES, "block config", f"(block_m, block_k) in {INSTANCES}",
            (cfg.block_m, cfg.block_k))
    smem = smem_bytes(cfg.block_m, cfg.block_k, stages, num_experts)
    require(smem <= SMEM_LIMIT_SM100, "num_stages", f"fitting {SMEM_LIMIT_SM100} B of shared memory",
            f"{stages} stages = {smem} B")
    return SM100KernelConfig(
        block_m=cfg.block_m, block_n=cfg.block_n, block_k=cfg.block_k, num_stages=stages, experts_per_wave=epw,
        bytes_per_pull=pull, pool_tokens=pool, num_sms=num_sms,
        sf_pool_rows=pool // cfg.block_m * sf_block_m(cfg.block_m), smem_bytes=smem)
