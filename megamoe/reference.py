"""Reference MoE forward: the exact math and the kernel's quantized numerics, step by step.

Two forwards with the same signature:

* :func:`moe_reference` -- exact math in float64 on the *dequantized* inputs:
  ``y_t = sum_{valid slots s} w_ts * W2_e (silu(min(g, c)) * clamp(u, -c, c))`` with
  ``[g; u] = W1_e x_t`` (``c`` = ``activation_clamp``; no clamp when None).
* :func:`moe_reference_quantized` -- what a MegaMoE kernel computes, bit by bit where the
  reference design fixes it (DeepGEMM ``sm100_fp8_fp4_mega_moe.cuh``, commit 891d57b):

  1. **L1 GEMM** ``x (E4M3, UE8M0/32) x W1 (E2M1, UE8M0/32)`` with FP32 accumulation, see
     :class:`Numerics` for how scales meet the partial sums.
  2. **L1 epilogue**, per pair of gate/up values (Linear1 branch, lines ~960-1010 at 891d57b):
     gate and up rounded to BF16 (``__float22bfloat162_rn``); clamp in BF16 --
     ``gate = min(gate, c)``, ``up = min(max(up, -c), c)`` with ``__hmin2``/``__hmax2``
     (which return the non-NaN operand, emulated with ``torch.fmin``/``fmax``); back to
     FP32; ``silu = gate / (1 + expf(-gate))`` (FP32 add and divide; fast math:
     ``gate * rcp(1 + __expf(-gate))``); ``h = (silu * up) * topk_weight`` (two FP32
     multiplies in that order).
  3. **Re-quantization**: per 32 consecutive intermediate channels of a row, amax ->
     UE8M0 (rounded up) -> saturating E4M3 cast (:func:`megamoe.formats.
     quantize_e4m3_epilogue`, bit-exact to ``get_e4m3_sf_and_sf_inv``).
  4. **L2 GEMM** ``h (E4M3) x W2 (E2M1)`` like L1; the FP32 result is rounded to BF16 per
     (token, slot) (``cast_into_bf16_and_pack``).
  5. **Combine**: per token, the valid slots' BF16 rows are summed in FP32 in ascending slot
     order starting from +0.0 (``__ffs`` over the valid-slot ballot), then rounded to BF16.

Numerics of the GEMMs (:class:`Numerics`): FP32 partial sums per K group, summed in K
order in FP32.  With ``*_fold_k = None`` a group is 32 wide (one UE8M0 scale per operand):
the group's dot product of the decoded E4M3 and E2M1 values is formed exactly (float64
holds it exactly), multiplied by both scales, rounded once to FP32 and added to the FP32
accumulator (the first group initialises it).  With ``*_fold_k = G`` the per-32 scales of
that operand inside each G-wide K group are folded into its values as ``2^(s_i - s_max)``
(rounded to E4M3, nearest-even with subnormals, as an SM90 kernel decoding E2M1 into E4M3
would; ``s_max`` over the 32-groups that hold a nonzero value), and the group's ``2^s_max``
multiplies the G-wide partial sum.  ``w_fold_k = "row"`` folds the weights over each row's
whole K, and ``w_fold_top = t`` decodes them as ``2^(s_i - s_max + t)`` with ``2^(s_max - t)``
applied per 32-wide partial sum (this project's SM90 kernel: ``Numerics.sm90_kernel()``).
The partial sums are exact by default (``Numerics.mma = "exact"``); ``mma = "h200_wgmma"``
forms them as the H200's FP8 ``wgmma`` does (:func:`h200_wgmma_partials`, a model fitted to
the tensor core bit for bit), with which this project's SM90 kernel is reproduced bit for bit
(measured on the H200, ``benchmarks/results/kernel_numerics_h200.json``).  What this does
*not* model: other tensor cores' accumulation (SM100's block-scaled MMA is taken as exact),
and the last-ulp behaviour of the GPU's ``__expf``/``rcp.approx`` under ``fast_math`` (here:
correctly rounded FP32 results), which can flip one FP8 rounding in rare cases.

Expert parallelism (:func:`moe_reference_quantized_ep`) splits experts over R ranks and
performs dispatch / combine in one process; each routed row's arithmetic is independent of
the other rows, so the result is bitwise equal to the single-rank one.  Memory is bounded
by processing one expert at a time, ``chunk_rows`` routed rows and a few hundred MiB of
decoded weight rows at a time (DeepSeek-V4-Pro: 64 tokens run in well under 8 GiB; weights
may be supplied lazily per expert, see :class:`ExpertWeights`).

Bad input raises :class:`megamoe.errors.InputError` (a ``ValueError``) naming the tensor.
``-1`` slots contribute nothing; zero tokens give an empty ``[0, H]`` output; NaN/Inf in
one token's input never reach another token's output.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Protocol, Sequence, runtime_checkable

import torch

from megamoe.errors import InputError
from megamoe.formats import (
    BLOCK_K, E2M1_VALUES, _check_tensor, cast_to_e4m3, decode_e4m3, decode_ue8m0,
    pack_ue8m0, quantize_e2m1_blocks, quantize_e4m3_blocks, quantize_e4m3_epilogue,
    round_to_bf16, unpack_ue8m0,
)
from megamoe.layouts import check_mxfp4_weights

__all__ = [
    "Numerics", "ExpertWeights", "TensorExpertWeights", "SyntheticWeights",
    "mega_moe_pre_dispatch", "quantize_weights",
    "moe_reference", "moe_reference_quantized", "moe_reference_quantized_ep",
    "l1_epilogue", "block_scaled_gemm", "h200_wgmma_partials",
]


# ============================================================================ numerics

@dataclass(frozen=True)
class Numerics:
    """Where architectures differ in the quantized forward.

    Attributes:
        arch: ``"sm100"`` (DeepGEMM's ``tcgen05.mma ... block_scale``: E4M3 x E2M1 with one
            UE8M0 per 32 K elements per operand, scales applied by the MMA) or ``"sm90"``
            (Hopper ``wgmma`` has neither FP4 nor block scales: the kernel decodes E2M1
            into E4M3 -- this project's into the WGMMA registers -- and applies scales
            itself, either per 32-wide ``wgmma`` K step on the partial sum -- the fold
            fields None, same numbers as SM100 -- or folded into the operands per G-wide
            group).  Informational:
            the numbers depend only on the fields below.
        w_fold_k: None: weight scales applied per 32-element K group on that group's FP32
            partial sum.  G (multiple of 32): per-32 weight scales folded into the E4M3
            operand as ``2^(s_i - s_max)`` per G-wide group (rounded to E4M3), group scale
            ``2^s_max`` applied to the G-wide partial sum.  ``"row"``: G = the GEMM's whole K.
        x_fold_k: the same for the activation operand (x in L1, the FP8 SwiGLU output in L2).
            When both are set they are equal, or ``w_fold_k = "row"`` and the partial sums
            are ``x_fold_k`` wide (each multiplied by its activation group scale; the
            weight row's scale is one factor of the whole row).
        l2_x_fold_k: the L2 GEMM's activation fold when it differs from L1's (None: ``x_fold_k``
            for both); the same rules as ``x_fold_k``. This project's SM90 kernel folds x per
            128 at block_m 128 and the L2 input per 64 (:meth:`sm90_kernel`).
        w_fold_top: folded weights are ``2^(s_i - s_max + w_fold_top)`` (E2M1's 6 x 2^6 = 384
            still fits E4M3: 0..6), the scale ``2^(s_max - w_fold_top)``; 0 without a fold.
        bf16_before_swiglu: round gate/up to BF16 before clamp and SwiGLU (the reference
            kernel does; False keeps FP32 and clamps in FP32).
        fast_math: ``__expf`` + approximate reciprocal in SiLU (DeepGEMM's
            ``fp8_fp4_mega_moe`` defaults to ``fast_math=True``); here emulated as
            ``exp2(x * fp32(log2 e))`` with flush-to-zero and an FP32 reciprocal, which is
            not guaranteed bit-exact against the GPU's approximate instructions.
        mma: how each K group's partial sum is formed. ``"exact"``: exactly, rounded once to
            FP32. ``"h200_wgmma"`` (``arch="sm90"``, 32-multiple groups): as the H200's FP8
            ``wgmma`` returns it, a chain of k32 steps from a zero accumulator, each step
            modelled by :func:`h200_wgmma_partials` (fitted to the tensor core bit for bit).

    Raises:
        InputError: unknown arch, a flag (``bf16_before_swiglu``, ``fast_math``) that is not
            a bool, fold not a positive multiple of 32 (or ``"row"``; ``l2_x_fold_k`` also
            not None with ``x_fold_k`` None or ``w_fold_k`` other than ``"row"``), x/w
            folds that are both set, differ and ``w_fold_k`` is not ``"row"`` (or
            ``x_fold_k`` is ``"row"``), ``w_fold_top`` outside 0..6 (or set
            without ``w_fold_k``), or ``mma`` not ``"exact"`` / ``"h200_wgmma"`` (the latter
            only with ``arch="sm90"`` and groups of a fixed width).
    """

    arch: str = "sm100"
    w_fold_k: int | str | None = None
    x_fold_k: int | str | None = None
    bf16_before_swiglu: bool = True
    fast_math: bool = False
    w_fold_top: int = 0
    mma: str = "exact"
    l2_x_fold_k: int | str | None = None

    def __post_init__(self) -> None:
        if self.arch not in ("sm100", "sm90"):
            raise InputError("numerics.arch", "'sm100' or 'sm90'", self.arch)
        for f in ("w_fold_k", "x_fold_k", "l2_x_fold_k"):
            v = getattr(self, f)
            rows_ok = f != "l2_x_fold_k"  # (the L2 input's fold: never the whole row)
            if v is not None and not (rows_ok and v == "row") and (
                    not isinstance(v, int) or isinstance(v, bool) or v <= 0 or v % BLOCK_K != 0):
                raise InputError(f"numerics.{f}", "None, 'row' or a positive multiple of 32" if rows_ok
                                 else "None or a positive multiple of 32", repr(v) if isinstance(v, str) else v)
        t = self.w_fold_top
        if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t <= 6 or (t and self.w_fold_k is None):
            raise InputError("numerics.w_fold_top", "an int 0..6 (6 x 2^t <= 448), 0 when w_fold_k is None",
                             repr(t) if isinstance(t, str) else t)
        for f in ("bf16_before_swiglu", "fast_math"):
            v = getattr(self, f)
            if not isinstance(v, bool):
                raise InputError(f"numerics.{f}", "True or False", repr(v))
        if self.w_fold_k is not None and self.x_fold_k is not None \
                and self.w_fold_k != self.x_fold_k and (self.w_fold_k != "row" or self.x_fold_k == "row"):
            raise InputError("numerics.x_fold_k", f"equal to w_fold_k ({self.w_fold_k!r}) when both are "
                             "set, or a multiple of 32 with w_fold_k='row'", repr(self.x_fold_k))
        if self.l2_x_fold_k is not None and (self.x_fold_k is None or self.w_fold_k != "row"):
            raise InputError("numerics.l2_x_fold_k", "None unless w_fold_k is 'row' and x_fold_k is set",
                             repr(self.l2_x_fold_k))
        if not isinstance(self.mma, str) or self.mma not in ("exact", "h200_wgmma"):
            raise InputError("numerics.mma", "'exact' or 'h200_wgmma'", repr(self.mma))
        if self.mma == "h200_wgmma" and (self.arch != "sm90" or self.group_k == "row"):
            raise InputError("numerics.mma", "'h200_wgmma' only with arch='sm90' and K groups of a fixed "
                             "width (not both folds 'row')", f"arch={self.arch!r}, group_k={self.group_k!r}")

    @classmethod
    def sm100(cls, fast_math: bool = False) -> "Numerics":
        """The reference design: block-scaled MMA, per-32 scales on partial sums, BF16
        gate/up before SwiGLU."""
        return cls("sm100", None, None, True, fast_math)

    @classmethod
    def sm90(cls, fold_k: int | None = None, fast_math: bool = False) -> "Numerics":
        """A Hopper kernel: E2M1 decoded into E4M3 for ``wgmma``.  ``fold_k=None`` applies
        the per-32 scales on each 32-wide partial sum (numerically equal to SM100);
        ``fold_k=G`` folds both operands' per-32 scales into E4M3 values per G-wide group."""
        return cls("sm90", fold_k, fold_k, True, fast_math)

    @classmethod
    def sm90_kernel(cls, fast_math: bool = False, mma: str = "exact", block_m: int | None = None) -> Numerics:
        """What this project's SM90 kernel computes (``megamoe.design_sm90.W_FOLD_K`` /
        ``W_FOLD_TOP`` / ``X_FOLD_K`` / ``L1_X_FOLD_K``): weights folded per row into E4M3 with
        the row's largest scale at 2^6 (``megamoe.layouts.fold_e2m1_scales_for_sm90``),
        activations folded per 64-K group (``megamoe.layouts.fold_e4m3_scales_for_sm90``), one
        FP32 partial sum per 64-K group (kernel v7); at ``block_m`` 128 the L1 GEMM's x folded
        and summed per 128-K group (kernel v7.6; ``L1_X_FOLD_K``), the L2 GEMM's input per 64.
        Not the per-32 numbers of :meth:`sm90` ``()``: the activation fold rounds the small
        values of a group below its partner's scale; the weight fold alone
        (``Numerics("sm90", "row", None, w_fold_top=6)``) is bitwise ``sm90()`` when every
        weight row's nonzero 32-groups lie within 14 binades of its largest.
        ``mma="h200_wgmma"``: each group's partial as the H200's tensor core sums it, a chain of
        k32 steps (:func:`h200_wgmma_partials`), so the kernel's GEMMs are reproduced bit for bit.

        Args:
            fast_math: see the class.
            mma: ``"exact"`` or ``"h200_wgmma"`` (see the class).
            block_m: the launch's (``MegaMoEKernel.last_design.block_m``: the numbers depend on
                it); None: a block_m below 128.
        Raises:
            InputError: ``block_m`` not None or one of 16, 32, 64, 128; ``mma`` or
                ``fast_math`` invalid (see the class)."""
        from megamoe import design_sm90
        if block_m is not None and (not isinstance(block_m, int) or isinstance(block_m, bool)
                                    or block_m not in design_sm90.L1_X_FOLD_K):
            raise InputError("block_m", f"None or one of {sorted(design_sm90.L1_X_FOLD_K)}", repr(block_m))
        x1 = design_sm90.X_FOLD_K if block_m is None else design_sm90.L1_X_FOLD_K[block_m]
        return cls("sm90", design_sm90.W_FOLD_K, x1, True, fast_math, design_sm90.W_FOLD_TOP, mma,
                   None if x1 == design_sm90.X_FOLD_K else design_sm90.X_FOLD_K)

    def for_l2(self) -> Numerics:
        """These numerics with the L2 GEMM's activation fold as ``x_fold_k`` (``l2_x_fold_k``,
        when set)."""
        if self.l2_x_fold_k is None:
            return self
        return replace(self, x_fold_k=self.l2_x_fold_k, l2_x_fold_k=None)

    @property
    def group_k(self) -> int | str:
        """Width of the K groups whose FP32 partial sums are accumulated: 32, a fold width
        (``x_fold_k`` when the weights are folded per row), or ``"row"`` when both operands
        are folded per row (the GEMM's whole K)."""
        if self.w_fold_k is None or self.x_fold_k is None:
            return BLOCK_K
        return self.x_fold_k  # (both "row": block_scaled_gemm reads it as K)


# ============================================================================ weights

@runtime_checkable
class ExpertWeights(Protocol):
    """A source of per-expert weights (lets huge models run without holding all experts).

    Attributes ``num_experts``, ``hidden`` (H), ``intermediate`` (I) and a method
    ``expert(e)`` returning either the MXFP4 checkpoint rows of expert ``e``:
    ``(w1 uint8 [2I, H/2], sf1 uint8 [2I, H/32], w2 uint8 [H, I/2], sf2 uint8 [H, I/32])``
    (gate rows then up rows), or float weights ``(w1 [2I, H], w2 [H, I])`` (accepted by
    :func:`moe_reference` only).
    """

    num_experts: int
    hidden: int
    intermediate: int

    def expert(self, e: int) -> tuple[torch.Tensor, ...]: ...


class TensorExpertWeights:
    """:class:`ExpertWeights` over in-memory MXFP4 checkpoint tensors (validated).

    Args:
        l1_weights: ``(w1 uint8|int8 [E, 2I, H/2], sf1 uint8 [E, 2I, H/32] or int32
            [E, 2I, H/128] packed)``.
        l2_weights: ``(w2 [E, H, I/2], sf2 [E, H, I/32] or [E, H, I/128] int32)``.
    Raises:
        InputError: shapes/dtypes (names ``l1_weights``, ``l1_weights_sf``, ...).
    """

    def __init__(self, l1_weights, l2_weights):
        if not (isinstance(l1_weights, (tuple, list)) and len(l1_weights) == 2):
            raise InputError("l1_weights", "a (weights, scales) pair", type(l1_weights).__name__)
        if not (isinstance(l2_weights, (tuple, list)) and len(l2_weights) == 2):
            raise InputError("l2_weights", "a (weights, scales) pair", type(l2_weights).__name__)
        w1, sf1 = l1_weights
        w2, sf2 = l2_weights
        e, n1, h = check_mxfp4_weights(w1, sf1, "l1_weights")
        if n1 % 2 != 0:
            raise InputError("l1_weights", "an even dim 1 (gate rows then up rows)",
                             f"shape {tuple(w1.shape)}")
        inter = n1 // 2
        check_mxfp4_weights(w2, sf2, "l2_weights", rows=h, k=inter)
        if w2.shape[0] != e:
            raise InputError("l2_weights", f"{e} experts like l1_weights", f"shape {tuple(w2.shape)}")
        self.num_experts, self.hidden, self.intermediate = e, h, inter
        self._w1, self._w2 = w1, w2
        self._sf1 = unpack_ue8m0(sf1) if sf1.dtype == torch.int32 else sf1
        self._sf2 = unpack_ue8m0(sf2) if sf2.dtype == torch.int32 else sf2
        self.device = w1.device

    def expert(self, e: int):
        return self._w1[e], self._sf1[e], self._w2[e], self._sf2[e]


class SyntheticWeights:
    """Deterministic random weights generated per expert on demand (for big shapes).

    Expert ``e`` draws ``W1 ~ N(0, 1/H)`` ``[2I, H]`` and ``W2 ~ N(0, 1/I)`` ``[H, I]``
    from a generator seeded with ``seed * 1_000_003 + (e % distinct)`` (so with
    ``distinct`` set, experts repeat every ``distinct`` ids and generation stays cheap).
    With ``outliers`` a fraction ``1/256`` of entries is multiplied by 32.

    Args:
        num_experts, hidden, intermediate: the layer shape (H, I multiples of 32).
        seed: integer seed.
        distinct: number of distinct experts (None: all distinct).
        outliers: add outlier entries.
        mode: ``"mxfp4"`` (``expert()`` returns the quantized checkpoint rows) or
            ``"float"`` (returns the float32 weights).
        rounding: E2M1 rounding used for ``"mxfp4"`` (see :func:`megamoe.formats.encode_e2m1`).
    """

    def __init__(self, num_experts: int, hidden: int, intermediate: int, seed: int = 0,
                 distinct: int | None = None, outliers: bool = False, mode: str = "mxfp4",
                 rounding: str = "deepgemm"):
        if mode not in ("mxfp4", "float"):
            raise InputError("mode", "'mxfp4' or 'float'", mode)
        if hidden % BLOCK_K or intermediate % BLOCK_K:
            raise InputError("hidden", "hidden and intermediate multiples of 32",
                             (hidden, intermediate))
        self.num_experts, self.hidden, self.intermediate = num_experts, hidden, intermediate
        self.seed, self.distinct, self.outliers, self.mode = seed, distinct, outliers, mode
        self.rounding = rounding
        self.device = torch.device("cpu")
        self._cache: dict[int, tuple] = {}

    def float_expert(self, e: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Float32 ``(W1 [2I, H], W2 [H, I])`` of expert ``e``."""
        k = e % self.distinct if self.distinct else e
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + k)
        h, i = self.hidden, self.intermediate
        w1 = torch.randn((2 * i, h), generator=g) / math.sqrt(h)
        w2 = torch.randn((h, i), generator=g) / math.sqrt(i)
        if self.outliers:
            for w in (w1, w2):
                m = torch.rand(w.shape, generator=g) < (1.0 / 256)
                w[m] *= 32.0
        return w1, w2

    def expert(self, e: int):
        k = e % self.distinct if self.distinct else e
        if k in self._cache:
            return self._cache[k]
        w1, w2 = self.float_expert(e)
        if self.mode == "float":
            out = (w1, w2)
        else:
            p1, s1 = quantize_e2m1_blocks(w1, rounding=self.rounding)
            p2, s2 = quantize_e2m1_blocks(w2, rounding=self.rounding)
            out = (p1, s1, p2, s2)
        if self.distinct:
            self._cache[k] = out
        return out


def quantize_weights(l1: torch.Tensor, l2: torch.Tensor, rounding: str = "deepgemm"):
    """Float expert weights -> MXFP4 checkpoint (E2M1 + UE8M0 per 32 along K).

    Args:
        l1: float ``[E, 2I, H]`` (gate rows then up rows).
        l2: float ``[E, H, I]``.
        rounding: E2M1 rounding, ``"deepgemm"`` (ties toward zero, DeepGEMM's
            ``per_token_cast_to_fp4``) or ``"rne"``.
    Returns:
        ``((w1 uint8 [E, 2I, H/2], sf1 uint8 [E, 2I, H/32]),
        (w2 uint8 [E, H, I/2], sf2 uint8 [E, H, I/32]))`` -- low nibble first.
    Raises:
        InputError: dtype, rank, K not a multiple of 32, or mismatched shapes.
    """
    _check_tensor(l1, "l1", dtypes=(torch.float32, torch.float64, torch.bfloat16, torch.float16),
                  ndim=3, contiguous=False)
    _check_tensor(l2, "l2", dtypes=(torch.float32, torch.float64, torch.bfloat16, torch.float16),
                  ndim=3, contiguous=False)
    e, n1, h = l1.shape
    if l2.shape[0] != e or l2.shape[1] != h or n1 != 2 * l2.shape[2]:
        raise InputError("l2", f"shape ({e}, {h}, {n1 // 2}) to match l1 {tuple(l1.shape)}",
                         f"shape {tuple(l2.shape)}")
    for nm, t in (("l1", l1), ("l2", l2)):
        if t.shape[-1] % BLOCK_K:
            raise InputError(nm, "last dimension (K) a multiple of 32", f"shape {tuple(t.shape)}")
    return (quantize_e2m1_blocks(l1, rounding=rounding),
            quantize_e2m1_blocks(l2, rounding=rounding))


def _as_source(l1_weights, l2_weights) -> ExpertWeights:
    if isinstance(l1_weights, ExpertWeights) and not isinstance(l1_weights, (tuple, list)):
        if l2_weights is not None:
            raise InputError("l2_weights", "None when l1_weights is an ExpertWeights source",
                             type(l2_weights).__name__)
        return l1_weights
    return TensorExpertWeights(l1_weights, l2_weights)


# ============================================================================ pre-dispatch

def mega_moe_pre_dispatch(x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor,
                          buf_x: torch.Tensor | None = None, buf_x_sf: torch.Tensor | None = None,
                          buf_topk_idx: torch.Tensor | None = None,
                          buf_topk_weights: torch.Tensor | None = None,
                          *, num_experts: int | None = None):
    """Quantize a rank's tokens for dispatch (SGLang ``mega_moe_pre_dispatch``, seed 000).

    ``x`` is quantized per 32 elements with :func:`megamoe.formats.quantize_e4m3_blocks`
    (DeepGEMM ``per_token_cast_to_fp8(x, use_ue8m0=True, gran_k=32,
    use_packed_ue8m0=True)``, the recipe ``tests/test_mega_moe.py`` feeds the kernel); the
    scale bytes are packed four per int32; ids become int64 and weights float32.

    Args:
        x: ``bfloat16`` (or float16/float32) ``[T, H]``, H a multiple of 128, contiguous.
        topk_idx: integer ``[T, k]`` expert ids, ``-1`` for an unused slot.
        topk_weights: float ``[T, k]``.
        buf_x, buf_x_sf, buf_topk_idx, buf_topk_weights: optional caller buffers with at
            least T rows (``float8_e4m3fn [M, H]``, ``int32 [M, H/128]``, ``int64 [M, k]``,
            ``float32 [M, k]``); rows T.. of the top-k buffers are set to -1 / 0, the x
            buffers' extra rows are left untouched.  Missing ones are allocated (T rows).
        num_experts: when given, ids must lie in [-1, num_experts).
    Returns:
        ``(x_fp8, x_sf, topk_idx, topk_weights)`` -- the buffers when given.
    Raises:
        InputError: wrong dtype/shape/device, non-contiguous, ids out of range, buffers
            too small.
    """
    _check_tensor(x, "x", dtypes=(torch.bfloat16, torch.float16, torch.float32), ndim=2)
    t, h = x.shape
    if h % 128:
        raise InputError("x", "hidden (dim 1) a multiple of 128", f"shape {tuple(x.shape)}")
    k = _check_topk(topk_idx, topk_weights, t, x.device, num_experts)
    q, sf = quantize_e4m3_blocks(x) if t else (
        torch.empty((0, h), dtype=torch.float8_e4m3fn, device=x.device),
        torch.empty((0, h // 32), dtype=torch.uint8, device=x.device))
    packed = pack_ue8m0(sf)
    specs = (("buf_x", buf_x, torch.float8_e4m3fn, h, q),
             ("buf_x_sf", buf_x_sf, torch.int32, h // 128, packed),
             ("buf_topk_idx", buf_topk_idx, torch.int64, k, topk_idx.long()),
             ("buf_topk_weights", buf_topk_weights, torch.float32, k, topk_weights.float()))
    outs = []
    for name, buf, dt, cols, val in specs:
        if buf is None:
            outs.append(val.contiguous())
            continue
        _check_tensor(buf, name, dtypes=(dt,), ndim=2)
        if buf.shape[1] != cols or buf.shape[0] < t:
            raise InputError(name, f"shape (>= {t}, {cols})", f"shape {tuple(buf.shape)}")
        if buf.device != x.device:
            raise InputError(name, f"device {x.device}", str(buf.device))
        buf[:t].copy_(val)
        if name == "buf_topk_idx":
            buf[t:].fill_(-1)
        elif name == "buf_topk_weights":
            buf[t:].zero_()
        outs.append(buf)
    return tuple(outs)


def _check_topk(topk_idx, topk_weights, t: int, device, num_experts: int | None) -> int:
    _check_tensor(topk_idx, "topk_idx", dtypes=(torch.int64, torch.int32), ndim=2)
    _check_tensor(topk_weights, "topk_weights",
                  dtypes=(torch.float32, torch.bfloat16, torch.float16), ndim=2)
    if topk_idx.shape[0] != t:
        raise InputError("topk_idx", f"{t} rows (one per token)", f"shape {tuple(topk_idx.shape)}")
    if tuple(topk_weights.shape) != tuple(topk_idx.shape):
        raise InputError("topk_weights", f"shape {tuple(topk_idx.shape)} like topk_idx",
                         f"shape {tuple(topk_weights.shape)}")
    for nm, tt in (("topk_idx", topk_idx), ("topk_weights", topk_weights)):
        if tt.device != device:
            raise InputError(nm, f"device {device} (like x)", str(tt.device))
    if topk_idx.numel():
        lo, hi = int(topk_idx.min()), int(topk_idx.max())
        top = num_experts if num_experts is not None else None
        if lo < -1 or (top is not None and hi >= top):
            raise InputError("topk_idx", f"values in [-1, {top if top is not None else 'E'})",
                             f"values in [{lo}, {hi}]")
    return topk_idx.shape[1]


# ============================================================================ GEMM core

_E2M1_PAIR_TABLES: dict = {}


def _decode_e2m1_rows(packed: torch.Tensor, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Packed E2M1 ``[N, K/2]`` -> ``[N, K]`` values (unscaled, exact) in ``dtype``.

    One lookup per byte in a 256 x 2 table built from :data:`megamoe.formats.E2M1_VALUES`
    (low nibble = even element); torch has no ``float4_e2m1fn_x2`` conversion kernels."""
    key = (packed.device, dtype)
    tab = _E2M1_PAIR_TABLES.get(key)
    if tab is None:
        v = torch.tensor(E2M1_VALUES, dtype=dtype)
        b = torch.arange(256)
        tab = torch.stack([v[b & 15], v[b >> 4]], dim=1).to(packed.device)
        _E2M1_PAIR_TABLES[key] = tab
    p = packed.view(torch.uint8) if packed.dtype == torch.int8 else packed
    return torch.nn.functional.embedding(p.long(), tab).reshape(p.shape[0], p.shape[1] * 2)


def _fold(vals: torch.Tensor, scales: torch.Tensor, fold: int, top: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Fold per-32 scales into E4M3 values per ``fold``-wide group.

    vals float64 [n, K] (decoded, unscaled), scales float64 [n, K/32] -> (E4M3-rounded
    float64 values of ``vals * 2^(s_i - s_max + top)``, float64 ``2^(s_max - top)``
    [n, K/fold]); ``s_max`` over the 32-groups with a nonzero value (1 if none)."""
    n, k = vals.shape
    per = fold // BLOCK_K
    s = scales.reshape(n, k // fold, per)
    nonzero = (vals.reshape(n, k // fold, per, BLOCK_K) != 0).any(dim=-1)
    smax = torch.where(nonzero, s, torch.zeros((), dtype=s.dtype, device=s.device)).amax(dim=-1)
    smax = torch.where(smax > 0, smax, torch.ones((), dtype=s.dtype, device=s.device))
    ratio = s / smax.unsqueeze(-1) * 2.0 ** top  # exact powers of two (float64 holds 2^-254)
    v = vals.reshape(n, k // fold, per, BLOCK_K) * ratio.unsqueeze(-1)
    folded = decode_e4m3(cast_to_e4m3(v), torch.float64).reshape(n, k)
    return folded, smax / 2.0 ** top


def _fold_is_exact(packed: torch.Tensor, sf: torch.Tensor, fold: int, top: int) -> bool:
    """Whether :func:`_fold` of E2M1 rows keeps every value exact: each 32-group holding a
    nonzero value lies at most ``8 + top`` binades below its fold group's largest (0.5 and
    1.5 x 2^-8 are E4M3 subnormals; one binade lower they round)."""
    n, kb = sf.shape
    nonzero = ((packed.view(torch.uint8) & 0x77).reshape(n, kb, -1) != 0).any(dim=-1)
    s = torch.where(nonzero, sf.to(torch.int32), torch.full((), -1, dtype=torch.int32, device=sf.device))
    s = s.reshape(n, kb // (fold // BLOCK_K), -1)
    smax = s.amax(dim=-1, keepdim=True)
    return bool(((s < 0) | (smax - s <= 8 + top)).all())


#: The H200's FP8 ``wgmma`` (E4M3 x E4M3 -> FP32), one k32 step onto an accumulator ``c``, as
#: fitted to the tensor core (``benchmarks/device/wgmma_acc_probe.cu`` + ``benchmarks/
#: wgmma_acc_fit.py``, 2026-12-01; every one of 2,097,152 results reproduced bit for bit): the
#: largest exponent ``E`` among the 32 products (each product's ``e_a + e_b``, an E4M3 subnormal
#: counting as exponent -6) and ``c`` (``floor(log2|c|)``); every product and ``c`` truncated
#: toward zero to a multiple of ``2^(E - 13)``; the exact sum of those truncated toward zero to
#: 14 significant bits.
H200_WGMMA_ALIGN_BITS = 13
H200_WGMMA_SUM_BITS = 14


def _e4m3_exponent(v: torch.Tensor) -> torch.Tensor:
    """int16 exponent of E4M3 values as the tensor core aligns them (subnormals -6; zeros -64,
    so that a product with a zero never sets the largest exponent)."""
    _, ex = torch.frexp(v)
    e = torch.clamp(ex - 1, min=-6).to(torch.int16)
    return torch.where(v == 0, torch.full((), -64, dtype=torch.int16, device=v.device), e)


def _f32_exponent(x: torch.Tensor) -> torch.Tensor:
    """floor(log2|x|) of normal FP32 values, from the bits (int32)."""
    return ((x.view(torch.int32) >> 23) & 0xFF) - 127


def _f32_pow2(e: torch.Tensor) -> torch.Tensor:
    """2^e as FP32 from the bits, e int in [-126, 127]."""
    return ((e.to(torch.int32) + 127) << 23).view(torch.float32)


def h200_wgmma_partials(a_vals: torch.Tensor, b_vals: torch.Tensor, group: int,
                        max_chunk_bytes: int = 1 << 28) -> torch.Tensor:
    """Per-group partial sums of ``A @ B^T`` as the H200's FP8 ``wgmma`` forms them.

    Each ``group``-wide K group is a chain of ``group / 32`` k32 steps (``wgmma.m64nNk32``
    E4M3 x E4M3 -> F32) starting from a zero accumulator, as this project's SM90 kernel issues
    them (``csrc/megamoe/mma_sm90.cuh``: a 64-K group is two chained steps, the first with
    scale-d 0).  One step onto an accumulator ``c``: ``E`` = the largest of the 32 products'
    exponents (``e_a + e_b``; an E4M3 subnormal counts as -6) and of ``floor(log2|c|)``; each
    product and ``c`` truncated toward zero to a multiple of ``2^(E - 13)``; their exact sum
    truncated toward zero to 14 significant bits.  Fitted on an H200 to 2,097,152 WGMMA
    results of four operand kinds (one step from zero, two and four chained, one onto a given
    accumulator), all reproduced bit for bit (``benchmarks/device/wgmma_acc_probe.cu``,
    ``benchmarks/wgmma_acc_fit.py``; published descriptions of Hopper's FP8 accumulation speak
    of about 13-14 kept bits, e.g. the DeepSeek-V3 report, section 3.3.2).  Overflow, NaN and
    FP32 subnormal results are not modelled.

    Args:
        a_vals: float ``[m, K]`` E4M3 values (unscaled; must be E4M3 values).
        b_vals: float ``[n, K]`` E4M3 values.
        group: K group width, a multiple of 32 dividing K.
        max_chunk_bytes: bound on the temporaries (n is processed in chunks).
    Returns:
        float32 ``[K / group, m, n]``; exact in FP32 (14 significant bits).
    Raises:
        InputError: an operand that is not a 2-D float tensor of E4M3 values (E4M3 *bytes* must
            be decoded first), K of the two operands differ, ``group`` is not an int multiple
            of 32 dividing K, or ``max_chunk_bytes`` is not a positive int.
    """
    for nm, t in (("a_vals", a_vals), ("b_vals", b_vals)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2 or not (t.is_floating_point() or t.dtype == torch.float8_e4m3fn):
            raise InputError(nm, "a 2-D float tensor of E4M3 values (decode E4M3 bytes first: "
                             "bytes.view(torch.float8_e4m3fn))",
                             f"{t.dtype} tensor of shape {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__)
    m, k = a_vals.shape
    n = b_vals.shape[0]
    if b_vals.shape[1] != k:
        raise InputError("b_vals", f"[n, {k}] (the K of a_vals)", tuple(b_vals.shape))
    if not isinstance(group, int) or isinstance(group, bool) or group <= 0 or group % BLOCK_K or k % group:
        raise InputError("group", f"an int, a multiple of 32 dividing K = {k}", repr(group))
    if not isinstance(max_chunk_bytes, int) or isinstance(max_chunk_bytes, bool) or max_chunk_bytes <= 0:
        raise InputError("max_chunk_bytes", "a positive int", repr(max_chunk_bytes))
    dev = a_vals.device
    a = a_vals.to(torch.float32)  # E4M3 x E4M3 products are exact in FP32 (8 bits, 2^-18..2^18)
    b = b_vals.to(torch.float32)
    for nm, t in (("a_vals", a), ("b_vals", b)):
        bad = t != t.to(torch.float8_e4m3fn).to(torch.float32)  # (NaN != NaN: refused too)
        if bool(bad.any()):
            raise InputError(nm, "E4M3 values (finite, representable in float8_e4m3fn)",
                             f"{float(t[bad][0])} at {tuple(int(i) for i in bad.nonzero()[0])}")
    ea, eb = _e4m3_exponent(a), _e4m3_exponent(b)
    out = torch.empty((k // group, m, n), dtype=torch.float32, device=dev)
    nc = max(1, min(n, max_chunk_bytes // max(1, m * BLOCK_K * 10)))
    floor = torch.full((), -100, dtype=torch.int16, device=dev)
    for g in range(k // group):
        for n0 in range(0, n, nc):
            n1 = min(n, n0 + nc)
            acc = torch.zeros((m, n1 - n0), dtype=torch.float32, device=dev)
            for k0 in range(g * group, (g + 1) * group, BLOCK_K):
                ks = slice(k0, k0 + BLOCK_K)
                prod = a[:, None, ks] * b[None, n0:n1, ks]                       # [m, nc, 32]
                e = (ea[:, None, ks] + eb[None, n0:n1, ks]).amax(dim=-1)         # [m, nc]
                e = torch.maximum(e, torch.where(acc != 0, _f32_exponent(acc).to(torch.int16), floor))
                q = _f32_pow2(e.clamp(min=-100) - H200_WGMMA_ALIGN_BITS)
                # every term is a multiple of q below 2^15 q: the sums are exact in FP32
                s = prod.div_(q[..., None]).trunc_().sum(dim=-1).add_(torch.trunc(acc / q)).mul_(q)
                # truncated toward zero to 14 significant bits: the low 23 - 13 fraction bits cleared
                acc = (s.view(torch.int32) & ~((1 << (24 - H200_WGMMA_SUM_BITS)) - 1)).view(torch.float32)
            out[g, :, n0:n1] = acc
    return out


def block_scaled_gemm(a_vals: torch.Tensor, a_scales: torch.Tensor,
                      b_packed: torch.Tensor, b_sf: torch.Tensor,
                      numerics: Numerics, max_chunk_bytes: int = 1 << 28) -> torch.Tensor:
    """``A @ B^T`` with the kernel's block-scaled FP32 accumulation (see :class:`Numerics`).

    Exact per-group partial sums: float64 when a fold rounds values, when 128-wide (or wider)
    groups are accumulated, or when ``torch.get_float32_matmul_precision() != "highest"``;
    otherwise (per-32 groups, a weight fold only where it is exact: then each group's partial
    is the unfolded one times a power of two) two FP32 batched matmuls over a magnitude split
    of A that are provably exact (see the code comment); both give the same bits.  Runs on the device of the inputs (CPU and CUDA give the same
    bits; checked on an H200 with torch 2.11).

    Args:
        a_vals: float64 ``[m, K]`` decoded E4M3 values (unscaled; must be E4M3 values).
        a_scales: float64 ``[m, K/32]`` decoded UE8M0 scales.
        b_packed: packed E2M1 ``uint8 [N, K/2]``.
        b_sf: UE8M0 bytes ``uint8 [N, K/32]``.
        numerics: fold settings (``x_fold_k`` applies to A, ``w_fold_k`` to B).
        max_chunk_bytes: bound on the float64 temporaries (N is processed in chunks).
    Returns:
        float32 ``[m, N]``.
    Raises:
        InputError: K not a multiple of a fold width.
    """
    m, k = a_vals.shape
    n = b_packed.shape[0]
    x_fold, w_fold = (k if f == "row" else f for f in (numerics.x_fold_k, numerics.w_fold_k))
    for nm, f in (("numerics.x_fold_k", x_fold), ("numerics.w_fold_k", w_fold)):
        if f is not None and k % f:
            raise InputError(nm, f"a divisor of K = {k}", f)
    p = k if numerics.group_k == "row" else numerics.group_k
    groups = k // p
    if x_fold is not None:
        a_vals, a_s = _fold(a_vals, a_scales, x_fold)
        if p == BLOCK_K:  # the other operand is per-32: broadcast the folded group scale
            a_s = a_s.repeat_interleave(x_fold // BLOCK_K, dim=1)
    else:
        a_s = a_scales
    a_g = a_vals.reshape(m, groups, p).transpose(0, 1)          # [G, m, p]
    a_s = a_s.transpose(0, 1).unsqueeze(-1)                     # [G, m, 1]
    # Fast exact path: 32-wide groups of E4M3 x E2M1.  Every product is a multiple of
    # 2^-10 below 2^11.4 and |group sum| < 2^17.  Splitting A at |a| = 2^-3 makes each half's
    # partial sums exact in FP32 in any order: entries >= 2^-3 are multiples of 2^-6, so
    # their products are multiples of 2^-7 (17 + 7 = 24 bits); entries < 2^-3 give sums
    # < 2^5 in multiples of 2^-10 (15 bits).  The FP32 sum of the two halves is the exact
    # sum rounded once; when both scales lie in [2^-58, 2^55] every scaled value stays a
    # normal FP32 number (|sum| in [2^-10, 2^17)), so scaling in FP32 is exact too and the
    # result equals the float64 route's.  Otherwise the halves go through float64.
    # A weight fold takes this path too where it is exact (every folded value an E4M3 value):
    # then each 32-group's partial is the unfolded one times a power of two, bit for bit.
    if numerics.mma == "h200_wgmma":
        return _block_scaled_gemm_h200(a_vals, a_s, b_packed, b_sf, numerics, p, w_fold, max_chunk_bytes)
    fast = p == BLOCK_K and torch.get_float32_matmul_precision() == "highest"
    if fast:
        a32 = a_g.to(torch.float32).contiguous()
        a_hi = torch.where(a32.abs() >= 0.125, a32, torch.zeros((), device=a32.device))
        a_lo = a32 - a_hi
        a_ok = bool(((a_s >= 2.0 ** -58) & (a_s <= 2.0 ** 55)).all()) if a_s.numel() else True
        a_s32 = a_s.to(torch.float32)
    out = torch.empty((m, n), dtype=torch.float32, device=a_vals.device)
    per_row = max(k * 8 * 2, groups * max(m, 1) * 8 * 3)
    nc = max(1, min(n, max_chunk_bytes // per_row))
    for n0 in range(0, n, nc):
        n1 = min(n, n0 + nc)
        bs = decode_ue8m0(b_sf[n0:n1], torch.float64)
        fold_here = w_fold is not None and (p != BLOCK_K or not _fold_is_exact(
            b_packed[n0:n1], b_sf[n0:n1], w_fold, numerics.w_fold_top))
        if fast and not fold_here:
            bv = _decode_e2m1_rows(b_packed[n0:n1], torch.float32)
            b_g = bv.reshape(n1 - n0, groups, p).permute(1, 2, 0)
            hi, lo = torch.bmm(a_hi, b_g), torch.bmm(a_lo, b_g)     # each exact in FP32
            b_ok = bool(((bs >= 2.0 ** -58) & (bs <= 2.0 ** 55)).all()) if bs.numel() else True
            if a_ok and b_ok:
                part = hi.add_(lo)                                  # exact sum, rounded once
                part.mul_(a_s32).mul_(bs.to(torch.float32).transpose(0, 1).unsqueeze(1))
                acc = part[0].clone()
                for g in range(1, groups):
                    acc.add_(part[g])
                out[:, n0:n1] = acc
                continue
            part = hi.double()
            part.add_(lo)                                           # float64, exact
        else:
            bv = _decode_e2m1_rows(b_packed[n0:n1])
            if fold_here:
                bv, bs = _fold(bv, bs, w_fold, numerics.w_fold_top)
                if p != w_fold:  # one scale per row (or fold group), repeated per partial-sum group
                    bs = bs.repeat_interleave(w_fold // p, dim=1)
            b_g = bv.reshape(n1 - n0, groups, p).permute(1, 2, 0)   # [G, p, nc]
            part = torch.bmm(a_g, b_g)                              # exact in float64
        # scales are powers of two: multiplying by each in turn is exact in float64
        part.mul_(a_s).mul_(bs.transpose(0, 1).unsqueeze(1))
        part = part.to(torch.float32)
        acc = part[0].clone()
        for g in range(1, groups):
            acc.add_(part[g])
        out[:, n0:n1] = acc
    return out


def _block_scaled_gemm_h200(a_vals, a_s, b_packed, b_sf, numerics, p, w_fold, max_chunk_bytes):
    """block_scaled_gemm with ``numerics.mma == "h200_wgmma"``: the partials of
    :func:`h200_wgmma_partials` (FP32) times both (power-of-two) scales, summed in K order in
    FP32 -- what the kernel's ``acc = fma(part, 2^sx, acc)`` and its final row scale give."""
    m, k = a_vals.shape
    n = b_packed.shape[0]
    out = torch.empty((m, n), dtype=torch.float32, device=a_vals.device)
    nc = max(1, min(n, max_chunk_bytes // max(1, k * 8 * 2)))
    a_s32 = a_s.to(torch.float32)
    for n0 in range(0, n, nc):
        n1 = min(n, n0 + nc)
        bs = decode_ue8m0(b_sf[n0:n1], torch.float64)
        bv = _decode_e2m1_rows(b_packed[n0:n1])
        if w_fold is not None:
            bv, bs = _fold(bv, bs, w_fold, numerics.w_fold_top)
            if p != w_fold:
                bs = bs.repeat_interleave(w_fold // p, dim=1)
        part = h200_wgmma_partials(a_vals, bv, p, max_chunk_bytes)
        part.mul_(a_s32).mul_(bs.to(torch.float32).transpose(0, 1).unsqueeze(1))
        acc = part[0].clone()
        for g in range(1, part.shape[0]):
            acc.add_(part[g])
        out[:, n0:n1] = acc
    return out


# ============================================================================ epilogue

_LOG2E_F32 = torch.tensor(math.log2(math.e), dtype=torch.float32)


def _silu_f32(gate: torch.Tensor, fast_math: bool) -> torch.Tensor:
    if fast_math:
        t = (-gate) * _LOG2E_F32.to(gate.device)
        e = torch.exp2(t.double()).float()
        e = torch.where(e.abs() < torch.finfo(torch.float32).tiny, torch.zeros_like(e), e)
        denom = 1.0 + e
        return gate * (1.0 / denom)
    e = torch.exp((-gate).double()).float()
    denom = 1.0 + e
    return gate / denom


def l1_epilogue(acc: torch.Tensor, topk_weight: torch.Tensor, activation_clamp: float | None,
                numerics: Numerics) -> tuple[torch.Tensor, torch.Tensor]:
    """The L1 epilogue on FP32 accumulators (checkpoint order: gate columns then up).

    Args:
        acc: float32 ``[m, 2I]``: columns ``[0, I)`` gate, ``[I, 2I)`` up.
        topk_weight: float32 ``[m]``, the routed item's top-k weight.
        activation_clamp: ``c`` or None.
        numerics: ``bf16_before_swiglu`` and ``fast_math`` are used.
    Returns:
        ``(q float8_e4m3fn [m, I], sf uint8 [m, I/32])`` -- the L2 activations.
    """
    inter = acc.shape[1] // 2
    gate, up = acc[:, :inter], acc[:, inter:]
    if numerics.bf16_before_swiglu:
        gate, up = round_to_bf16(gate), round_to_bf16(up)
    if activation_clamp is not None:
        c = float(activation_clamp)
        if numerics.bf16_before_swiglu:  # the constant is converted to BF16 by the kernel
            c = float(torch.tensor(c, dtype=torch.float32).to(torch.bfloat16).float())
        else:
            c = float(torch.tensor(c, dtype=torch.float32))
        ct = torch.tensor(c, dtype=torch.float32, device=acc.device)
        gate = torch.fmin(gate, ct)
        up = torch.fmin(torch.fmax(up, -ct), ct)
    silu = _silu_f32(gate, numerics.fast_math)
    h = (silu * up) * topk_weight.float().unsqueeze(1)
    return quantize_e4m3_epilogue(h)


# ============================================================================ forwards

def _check_inputs(x, x_sf, topk_idx, topk_weights, src: ExpertWeights, name_sfx: str = ""):
    """Validate the activation inputs; return (T, k, quantized?)."""
    h = src.hidden
    _check_tensor(x, "x" + name_sfx, dtypes=(torch.float8_e4m3fn, torch.bfloat16, torch.float16,
                                             torch.float32, torch.float64), ndim=2)
    t = x.shape[0]
    if x.shape[1] != h:
        raise InputError("x" + name_sfx, f"shape (T, {h}) (hidden of the weights)",
                         f"shape {tuple(x.shape)}")
    quantized = x.dtype == torch.float8_e4m3fn
    if quantized:
        if x_sf is None:
            raise InputError("x_sf" + name_sfx, "UE8M0 scales for FP8 x", "None")
        _check_tensor(x_sf, "x_sf" + name_sfx, dtypes=(torch.int32, torch.uint8), ndim=2)
        per = BLOCK_K * (4 if x_sf.dtype == torch.int32 else 1)
        want = (t, -(-h // per))
        if tuple(x_sf.shape) != want or h % per:
            raise InputError("x_sf" + name_sfx, f"shape {want} with hidden a multiple of {per}",
                             f"shape {tuple(x_sf.shape)}")
        if x_sf.device != x.device:
            raise InputError("x_sf" + name_sfx, f"device {x.device} (like x)", str(x_sf.device))
    elif x_sf is not None:
        raise InputError("x_sf" + name_sfx, "None for a float x (use mega_moe_pre_dispatch "
                         "to quantize)", f"{x_sf.dtype} tensor")
    k = _check_topk(topk_idx, topk_weights, t, x.device, src.num_experts)
    dev = getattr(src, "device", x.device)
    if torch.device(dev) != x.device:
        raise InputError("l1_weights", f"device {x.device} (like x)", str(dev))
    return t, k, quantized


def _x_rows(x, x_sf, rows: torch.Tensor):
    """Decoded (values float64, scales float64) of x rows, or (exact float64, None)."""
    if x.dtype == torch.float8_e4m3fn:
        sf = x_sf[rows]
        sf = unpack_ue8m0(sf) if sf.dtype == torch.int32 else sf
        return decode_e4m3(x[rows], torch.float64), decode_ue8m0(sf, torch.float64)
    return x[rows].double(), None


def _expert_quantized(src, e, xv, xs, w_rows, clamp, numerics, chunk_rows):
    """Quantized forward of routed rows of expert e -> bfloat16 [m, H]."""
    w1, sf1, w2, sf2 = _expert_mxfp4(src, e)
    m = xv.shape[0]
    out = torch.empty((m, src.hidden), dtype=torch.bfloat16, device=xv.device)
    for r0 in range(0, m, chunk_rows):
        r1 = min(m, r0 + chunk_rows)
        if xs is None:  # float x: quantize the rows the way pre-dispatch would
            q, s = quantize_e4m3_blocks(xv[r0:r1].float())
            a_v, a_s = decode_e4m3(q, torch.float64), decode_ue8m0(s, torch.float64)
        else:
            a_v, a_s = xv[r0:r1], xs[r0:r1]
        acc1 = block_scaled_gemm(a_v, a_s, w1, sf1, numerics)
        q2, s2 = l1_epilogue(acc1, w_rows[r0:r1], clamp, numerics)
        acc2 = block_scaled_gemm(decode_e4m3(q2, torch.float64), decode_ue8m0(s2, torch.float64),
                                 w2, sf2, numerics.for_l2())
        out[r0:r1] = acc2.to(torch.bfloat16)
    return out


def _expert_mxfp4(src, e):
    ws = src.expert(e)
    if len(ws) != 4:
        raise InputError("l1_weights", "MXFP4 weights (w1, sf1, w2, sf2) for the quantized "
                         "reference", f"{len(ws)} tensors from expert({e})")
    w1, sf1, w2, sf2 = ws
    sf1 = unpack_ue8m0(sf1) if sf1.dtype == torch.int32 else sf1
    sf2 = unpack_ue8m0(sf2) if sf2.dtype == torch.int32 else sf2
    h, i = src.hidden, src.intermediate
    for nm, t, shape in (("l1_weights", w1, (2 * i, h // 2)), ("l1_weights_sf", sf1, (2 * i, h // 32)),
                         ("l2_weights", w2, (h, i // 2)), ("l2_weights_sf", sf2, (h, i // 32))):
        if tuple(t.shape) != shape or t.dtype not in (torch.uint8, torch.int8):
            raise InputError(f"{nm}[{e}]", f"uint8 tensor of shape {shape}",
                             f"{t.dtype} tensor of shape {tuple(t.shape)}")
    return w1, sf1, w2, sf2


def _expert_exact(src, e, xv, xs, w_rows, clamp, chunk_rows, max_chunk_bytes=1 << 28):
    """Exact float64 forward of routed rows of expert e -> float64 [m, H]."""
    ws = src.expert(e)
    h, inter = src.hidden, src.intermediate
    x = xv if xs is None else (xv.reshape(xv.shape[0], -1, BLOCK_K) * xs.unsqueeze(-1)).reshape(xv.shape)

    def rows_of(which, n0, n1):
        if len(ws) == 2:
            return (ws[0] if which == 1 else ws[1])[n0:n1].double()
        p, s = (ws[0], ws[1]) if which == 1 else (ws[2], ws[3])
        s = unpack_ue8m0(s) if s.dtype == torch.int32 else s
        v = _decode_e2m1_rows(p[n0:n1])
        sc = decode_ue8m0(s[n0:n1], torch.float64)
        return (v.reshape(n1 - n0, -1, BLOCK_K) * sc.unsqueeze(-1)).reshape(n1 - n0, -1)

    def matmul(a, which, n, k):
        nc = max(1, min(n, max_chunk_bytes // (k * 8 * 2)))
        return torch.cat([a @ rows_of(which, n0, min(n, n0 + nc)).T for n0 in range(0, n, nc)], 1)

    gu = matmul(x, 1, 2 * inter, h)
    g, u = gu[:, :inter], gu[:, inter:]
    if clamp is not None:
        g = torch.clamp(g, max=clamp)
        u = torch.clamp(u, -clamp, clamp)
    hact = g * torch.sigmoid(g) * u * w_rows.double().unsqueeze(1)
    return matmul(hact, 2, h, inter)


def _routed_items(topk_idx: torch.Tensor, e: int) -> tuple[torch.Tensor, torch.Tensor]:
    tok, slot = torch.nonzero(topk_idx == e, as_tuple=True)
    return tok, slot


def _forward(x, x_sf, topk_idx, topk_weights, l1_weights, l2_weights, clamp, numerics,
             chunk_rows, exact: bool):
    src = _as_source(l1_weights, l2_weights)
    if not isinstance(numerics, Numerics):
        raise InputError("numerics", "a megamoe.reference.Numerics", type(numerics).__name__)
    if _clamp_bad(clamp):
        raise InputError("activation_clamp", "None or a positive number", clamp)
    if not isinstance(chunk_rows, int) or chunk_rows <= 0:
        raise InputError("chunk_rows", "a positive integer", chunk_rows)
    t, k, _ = _check_inputs(x, x_sf, topk_idx, topk_weights, src)
    h = src.hidden
    if exact:
        y = torch.zeros((t, h), dtype=torch.float64, device=x.device)
    else:
        ys = torch.zeros((t, k, h), dtype=torch.bfloat16, device=x.device)
    if t == 0:
        return y if exact else torch.empty((0, h), dtype=torch.bfloat16, device=x.device)
    experts = torch.unique(topk_idx[topk_idx >= 0]).tolist()
    for e in experts:
        tok, slot = _routed_items(topk_idx, e)
        xv, xs = _x_rows(x, x_sf, tok)
        w_rows = topk_weights[tok, slot].float()
        if exact:
            y.index_add_(0, tok, _expert_exact(src, e, xv, xs, w_rows, clamp, chunk_rows))
        else:
            ys[tok, slot] = _expert_quantized(src, e, xv, xs, w_rows, clamp, numerics, chunk_rows)
    if exact:
        return y
    return _combine(ys, topk_idx)


def _combine(ys: torch.Tensor, topk_idx: torch.Tensor) -> torch.Tensor:
    """Sum valid slots in FP32 in ascending slot order from +0.0, round to BF16."""
    t, k, h = ys.shape
    acc = torch.zeros((t, h), dtype=torch.float32, device=ys.device)
    for s in range(k):
        valid = (topk_idx[:, s] >= 0).unsqueeze(1)
        acc = acc + torch.where(valid, ys[:, s].float(), torch.zeros((), device=ys.device))
    return acc.to(torch.bfloat16)


def moe_reference(x: torch.Tensor, x_sf: torch.Tensor | None, topk_idx: torch.Tensor,
                  topk_weights: torch.Tensor, l1_weights, l2_weights=None, *,
                  activation_clamp: float | None = None,
                  numerics: Numerics = Numerics.sm100(), chunk_rows: int = 256) -> torch.Tensor:
    """Exact MoE forward in float64 on the dequantized inputs.

    ``y_t = sum_{slots s, topk_idx[t,s] >= 0} w_ts * W2_e (silu(min(g, c)) * clamp(u, -c, c))``
    with ``[g; u] = W1_e x_t``, every input decoded exactly (E4M3 x UE8M0, E2M1 x UE8M0).

    Args:
        x: ``float8_e4m3fn [T, H]`` (with ``x_sf``) or a float ``[T, H]`` used as is.
        x_sf: ``int32 [T, H/128]`` packed UE8M0 (or ``uint8 [T, H/32]``); None for float x.
        topk_idx: ``int64`` (or int32) ``[T, k]`` expert ids, ``-1`` = unused slot.
        topk_weights: ``float32 [T, k]``.
        l1_weights: ``(w1 uint8 [E, 2I, H/2], sf1 uint8 [E, 2I, H/32])`` MXFP4 checkpoint
            (gate rows then up rows), or an :class:`ExpertWeights` source (then
            ``l2_weights`` is None); a source may return float weights.
        l2_weights: ``(w2 uint8 [E, H, I/2], sf2 uint8 [E, H, I/32])``.
        activation_clamp: ``c`` or None.
        numerics: accepted for signature compatibility with :func:`moe_reference_quantized`
            (ignored: this path is exact).
        chunk_rows: routed rows per expert processed at once.
    Returns:
        ``float64 [T, H]`` (zeros for tokens with no valid slot; ``[0, H]`` for T == 0).
    Raises:
        InputError: bad dtype/shape/device/contiguity, ids outside [-1, E), K not a
            multiple of 32 (names the tensor).
    """
    return _forward(x, x_sf, topk_idx, topk_weights, l1_weights, l2_weights, activation_clamp,
                    numerics, chunk_rows, exact=True)


def moe_reference_quantized(x: torch.Tensor, x_sf: torch.Tensor | None, topk_idx: torch.Tensor,
                            topk_weights: torch.Tensor, l1_weights, l2_weights=None, *,
                            activation_clamp: float | None = None,
                            numerics: Numerics = Numerics.sm100(),
                            chunk_rows: int = 256) -> torch.Tensor:
    """The kernel's quantized forward, step by step (see the module docstring).

    Arguments as :func:`moe_reference`, except that the weights must be MXFP4 and a float
    ``x`` is first quantized like :func:`mega_moe_pre_dispatch` (per row, so results do not
    depend on the other tokens).
    Returns:
        ``bfloat16 [T, H]``.
    Raises:
        InputError: as :func:`moe_reference`; a weight source returning float weights.
    """
    return _forward(x, x_sf, topk_idx, topk_weights, l1_weights, l2_weights, activation_clamp,
                    numerics, chunk_rows, exact=False)


def moe_reference_quantized_ep(xs: Sequence[torch.Tensor], x_sfs: Sequence[torch.Tensor],
                               topk_idxs: Sequence[torch.Tensor],
                               topk_weights: Sequence[torch.Tensor], l1_weights,
                               l2_weights=None, *, activation_clamp: float | None = None,
                               numerics: Numerics = Numerics.sm100(),
                               chunk_rows: int = 256) -> list[torch.Tensor]:
    """Expert-parallel quantized forward over R = ``len(xs)`` ranks in one process.

    Rank ``r`` owns experts ``[r*E/R, (r+1)*E/R)``.  Dispatch: every rank pulls, for each
    local expert, the routed (token, slot) rows of all source ranks (source-rank order,
    then token order); each rank computes its experts; the BF16 L2 rows are written back
    into the source rank's combine buffer ``[T_src, k, H]`` at (token, slot); combine
    reduces each rank's buffer as in :func:`moe_reference_quantized`.  Bitwise equal to
    the single-rank forward on the concatenated tokens.

    Args:
        xs, x_sfs, topk_idxs, topk_weights: per-rank lists of the arguments of
            :func:`moe_reference_quantized` (global expert ids; the same k everywhere).
        l1_weights, l2_weights: all experts (as :func:`moe_reference_quantized`).
    Returns:
        list of ``bfloat16 [T_r, H]``, one per rank.
    Raises:
        InputError: list lengths differ, E not divisible by R, and every per-rank check
            (tensor names carry the rank, e.g. ``x[1]``).
    """
    src = _as_source(l1_weights, l2_weights)
    if not isinstance(numerics, Numerics):
        raise InputError("numerics", "a megamoe.reference.Numerics", type(numerics).__name__)
    r = len(xs)
    for nm, lst in (("x_sfs", x_sfs), ("topk_idxs", topk_idxs), ("topk_weights", topk_weights)):
        if len(lst) != r:
            raise InputError(nm, f"{r} entries (one per rank, like xs)", len(lst))
    if r == 0 or src.num_experts % r:
        raise InputError("xs", f"a number of ranks dividing num_experts = {src.num_experts}", r)
    if _clamp_bad(activation_clamp):
        raise InputError("activation_clamp", "None or a positive number", activation_clamp)
    ks = set()
    for i in range(r):
        t, k, _ = _check_inputs(xs[i], x_sfs[i], topk_idxs[i], topk_weights[i], src, f"[{i}]")
        ks.add(k)
    if len(ks) > 1:
        raise InputError("topk_idxs", "the same top-k on every rank", sorted(ks))
    k = ks.pop()
    h = src.hidden
    per_rank = src.num_experts // r
    combine = [torch.zeros((xs[i].shape[0], k, h), dtype=torch.bfloat16, device=xs[i].device)
               for i in range(r)]
    for dst in range(r):
        for e in range(dst * per_rank, (dst + 1) * per_rank):
            pulls = []
            for s in range(r):
                tok, slot = _routed_items(topk_idxs[s], e)
                if tok.numel():
                    pulls.append((s, tok, slot))
            if not pulls:
                continue
            # the pool of expert e on rank dst: rows from every source rank
            vals, scs, ws = [], [], []
            for s, tok, slot in pulls:
                xv, xsc = _x_rows(xs[s], x_sfs[s], tok)
                vals.append(xv)
                scs.append(xsc)
                ws.append(topk_weights[s][tok, slot].float())
            pool_x = torch.cat(vals)
            pool_s = None if scs[0] is None else torch.cat(scs)
            out = _expert_quantized(src, e, pool_x, pool_s, torch.cat(ws), activation_clamp,
                                    numerics, chunk_rows)
            # write back into the source ranks' combine buffers
            o = 0
            for s, tok, slot in pulls:
                combine[s][tok, slot] = out[o:o + tok.numel()]
                o += tok.numel()
    return [_combine(combine[i], topk_idxs[i]) if xs[i].shape[0] else
            torch.empty((0, h), dtype=torch.bfloat16, device=xs[i].device) for i in range(r)]


def _clamp_bad(c) -> bool:
    return c is not None and not (isinstance(c, (int, float)) and not isinstance(c, bool) and c > 0)
