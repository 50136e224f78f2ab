"""The SM100 (B200) kernel in ``csrc/megamoe/kernel_sm100.cu``: the numbers it takes from the plan.

The SM100 kernel implements the reference design ``deepgemm-sm100`` of :mod:`megamoe.plan`;
it never re-derives a scheduling number. :func:`config_from_plan` reads them off a
:class:`megamoe.plan.Plan` (block_m / block_n / block_k, pipeline stages, experts per
wave, bytes per pull, pool capacity, SMs) and adds only layout facts that follow from them
(the padded scale-pool rows). Template instances exist for every (block_m, block_k) row of
the reference block table (:data:`INSTANCES`).

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
