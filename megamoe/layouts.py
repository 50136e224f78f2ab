"""Weight and scale-factor layouts: MXFP4 checkpoint <-> what the kernels read.

Checkpoint layout (the input of every transform, what :func:`megamoe.reference.
quantize_weights` produces):

* L1 weights ``[E, 2I, H/2]`` ``uint8`` packed E2M1 (low nibble first), rows ``[0, I)`` are
  the gate projection and rows ``[I, 2I)`` the up projection; K (= H) is the last dim.
* L1 scales ``[E, 2I, H/32]`` ``uint8`` UE8M0, K-major (contiguous along K).
* L2 weights ``[E, H, I/2]`` ``uint8``, L2 scales ``[E, H, I/32]`` ``uint8``.

SM100 kernel layout (DeepGEMM ``fp8_fp4_mega_moe``; sources at commit 891d57b):

1. Scales are packed four per int32 along K and stored **MN-major** with a TMA-aligned MN
   stride: logical shape ``[E, MN, K/128]`` int32, strides ``(MN_al * K/128, 1, MN_al)``
   with ``MN_al`` = MN rounded up to 4 int32s (16 bytes) -- ``transform_sf_into_required_
   layout(sf, n, k, (1, 32), num_groups)`` in ``tests/test_mega_moe.py`` ->
   ``get_mn_major_tma_aligned_packed_ue8m0_tensor`` (``csrc/apis/layout.hpp``,
   ``check_sf_layout`` in ``csrc/utils/layout.hpp``).
2. L1 only: gate and up rows are **interleaved at 8-row granularity**, ``[gate 0..7, up 0..7,
   gate 8..15, up 8..15, ...]``, for the weights and the scales alike, so that every
   128-row N block holds 64 gate rows and the 64 matching up rows and the epilogue can pair
   them in registers (``_interleave_l1_weights`` in ``deep_gemm/mega/__init__.py``; the
   epilogue comment "Unified L1 epilogue: SwiGLU in-place using granularity 8 interleaved
   weights" in ``impls/sm100_fp8_fp4_mega_moe.cuh``).
3. Scales (L1 and L2) are **transposed for UTCCP** inside every 128 MN rows: viewing the 128
   rows as ``[4, 32]`` and storing them as ``[32, 4]``, so stored row ``4*i + j`` holds
   logical row ``32*j + i`` (``_transpose_sf_for_utccp`` in ``deep_gemm/mega/__init__.py``;
   ``tcgen05.cp`` copies the 32x128-bit scale tile into TMEM in that order).
4. Packed FP4 weights keep their ``[E, N, K/2]`` K-major bytes; DeepGEMM types them
   ``int8`` (``torch.int8`` in ``tests/test_mega_moe.py``): ``t.view(torch.int8)``.

SM90 layout (this project's Hopper kernel, see :func:`transform_weights_for_sm90`): Hopper
has no FP4 or block-scaled MMA, so the kernel loads the packed E2M1 bytes and their UE8M0
bytes and decodes E2M1 into E4M3 ``wgmma`` register fragments.  It needs the same 8-row
gate/up interleave, so its epilogue pairs gate/up exactly like SM100's; one byte permutation
inside every 64-byte K block of a row (:func:`permute_e2m1_for_sm90_rs`), so that a thread's
fragment of all four k32 steps is one 16-byte chunk, and a nibble permutation inside every
4-byte word (magnitudes as byte selectors, signs where the decode ORs them in); and **tiles**: the bytes of one
128-row N block x one 128-element K block are contiguous (``[E, N/128, K/128, 128, 64]``,
scales ``[E, N/128, K/128, 128, 4]``), so the producer loads a stage's weights and scales
with two TMA bulk copies (``cp.async.bulk``).  No UTCCP transpose (no TMEM).  The scale
bytes the SM90 kernel reads are not the UE8M0 bytes but the weight *fold*
(:func:`fold_e2m1_scales_for_sm90`): every row's per-32 scales relative to the row's
largest, as offsets into a table of E4M3 decodings, and one FP32 scale per row.  Applied
once when the SM90 kernel object is built.

Every transform has an inverse and round-trips bit-exactly; all raise
:class:`megamoe.errors.InputError` naming the tensor on a bad shape or dtype.
"""

from __future__ import annotations

import torch

from megamoe.errors import InputError
from megamoe.formats import (
    BLOCK_K,
    E2M1_VALUES,
    UE8M0_BIAS,
    _check_tensor,
    cast_to_e4m3,
    decode_e4m3,
    pack_ue8m0,
    unpack_ue8m0,
)

__all__ = [
    "GATE_UP_GRANULARITY", "UTCCP_ROWS", "SM90_TILE_N", "SM90_TILE_K",
    "interleave_gate_up", "deinterleave_gate_up",
    "utccp_transpose_sf", "utccp_untranspose_sf",
    "to_mn_major", "to_k_major", "is_mn_major",
    "transform_weights_for_mega_moe", "untransform_weights_for_mega_moe",
    "transform_weights_for_sm90", "untransform_weights_for_sm90",
    "permute_e2m1_for_sm90_rs", "unpermute_e2m1_for_sm90_rs",
    "SM90_FOLD_TOP", "SM90_FOLD_ROWS", "sm90_fold_table", "fold_e2m1_scales_for_sm90",
    "fold_e4m3_scales_for_sm90",
    "check_mxfp4_weights",
]

#: Gate/up interleave granularity in rows (``_interleave_l1_weights(gran=8)``).
GATE_UP_GRANULARITY = 8
#: Rows per UTCCP scale tile (``[4, 32] -> [32, 4]``).
UTCCP_ROWS = 128

_BYTE_DTYPES = (torch.uint8, torch.int8)


def _check_gran(gran: object) -> int:
    """Interleave granularity: an ``int`` >= 1 (not ``bool``, not a float: nothing is rounded)."""
    if not (isinstance(gran, int) and not isinstance(gran, bool) and gran >= 1):
        raise InputError("gran", f"a positive integer (rows per gate/up group, {GATE_UP_GRANULARITY} for the "
                         "kernels)", repr(gran) if isinstance(gran, str) else gran)
    return gran


def interleave_gate_up(t: torch.Tensor, gran: int = GATE_UP_GRANULARITY,
                       name: str = "t") -> torch.Tensor:
    """``[E, 2I, ...]`` with gate rows then up rows -> rows interleaved every ``gran``.

    Output row order: gate ``0..gran-1``, up ``0..gran-1``, gate ``gran..2gran-1``, ...
    Works for weights (``[E, 2I, H/2]`` bytes) and scales (``uint8 [E, 2I, H/32]`` or
    ``int32 [E, 2I, H/128]``); the output keeps ``t``'s strides (``empty_like``), so an
    MN-major scale tensor stays MN-major.

    Raises:
        InputError: ``gran`` not a positive ``int``, fewer than 2 dims, or ``2I`` not a
            multiple of ``2*gran``.
    """
    _check_tensor(t, name, min_ndim=2, contiguous=False)
    _check_gran(gran)
    g, n, *rest = t.shape
    if n % (2 * gran) != 0:
        raise InputError(name, f"dim 1 (2*intermediate) a multiple of {2 * gran}",
                         f"shape {tuple(t.shape)}")
    half = n // 2
    gate = t[:, :half].reshape(g, half // gran, gran, *rest)
    up = t[:, half:].reshape(g, half // gran, gran, *rest)
    return torch.empty_like(t).copy_(torch.stack([gate, up], dim=2).reshape(t.shape))


def deinterleave_gate_up(t: torch.Tensor, gran: int = GATE_UP_GRANULARITY,
                         name: str = "t") -> torch.Tensor:
    """Inverse of :func:`interleave_gate_up`: back to ``[gate rows | up rows]``.

    Raises:
        InputError: as :func:`interleave_gate_up`.
    """
    _check_tensor(t, name, min_ndim=2, contiguous=False)
    _check_gran(gran)
    g, n, *rest = t.shape
    if n % (2 * gran) != 0:
        raise InputError(name, f"dim 1 (2*intermediate) a multiple of {2 * gran}",
                         f"shape {tuple(t.shape)}")
    v = t.reshape(g, n // (2 * gran), 2, gran, *rest)
    out = torch.cat([v[:, :, 0].reshape(g, n // 2, *rest), v[:, :, 1].reshape(g, n // 2, *rest)],
                    dim=1)
    return torch.empty_like(t).copy_(out)


def _check_sf_rows(sf: torch.Tensor, name: str) -> None:
    _check_tensor(sf, name, dtypes=(torch.int32,), ndim=3, contiguous=False)
    if sf.shape[1] % UTCCP_ROWS != 0:
        raise InputError(name, f"dim 1 (MN) a multiple of {UTCCP_ROWS}", f"shape {tuple(sf.shape)}")


def utccp_transpose_sf(sf: torch.Tensor, name: str = "sf") -> torch.Tensor:
    """UTCCP transpose of packed scales: inside each 128 rows ``[4, 32] -> [32, 4]``.

    Args:
        sf: ``int32 [E, MN, K/128]`` (any strides), MN a multiple of 128.
    Returns:
        same shape and strides; output row ``128*b + 4*i + j`` = input row ``128*b + 32*j + i``.
    Raises:
        InputError: dtype, rank, or MN not a multiple of 128.
    """
    _check_sf_rows(sf, name)
    g, mn, pk = sf.shape
    out = sf.reshape(g, mn // UTCCP_ROWS, 4, 32, pk).transpose(2, 3).reshape(g, mn, pk)
    return torch.empty_like(sf).copy_(out)


def utccp_untranspose_sf(sf: torch.Tensor, name: str = "sf") -> torch.Tensor:
    """Inverse of :func:`utccp_transpose_sf` (``[32, 4] -> [4, 32]`` in each 128 rows)."""
    _check_sf_rows(sf, name)
    g, mn, pk = sf.shape
    out = sf.reshape(g, mn // UTCCP_ROWS, 32, 4, pk).transpose(2, 3).reshape(g, mn, pk)
    return torch.empty_like(sf).copy_(out)


def to_mn_major(sf: torch.Tensor, name: str = "sf") -> torch.Tensor:
    """Same values, MN-major TMA-aligned storage: strides ``(K' * MN_al, 1, MN_al)``.

    Args:
        sf: ``[E, MN, K']`` or ``[MN, K']`` tensor (any dtype, any strides).
    Returns:
        a tensor equal to ``sf`` whose MN dim has stride 1 and whose K' stride is MN rounded
        up to a multiple of 16 bytes (as DeepGEMM's ``check_sf_layout`` requires).
    """
    _check_tensor(sf, name, contiguous=False)
    if sf.dim() not in (2, 3):
        raise InputError(name, "2 or 3 dimensions", f"shape {tuple(sf.shape)}")
    squeeze = sf.dim() == 2
    s = sf.unsqueeze(0) if squeeze else sf
    g, mn, k = s.shape
    per = max(1, 16 // s.element_size())
    mn_al = (mn + per - 1) // per * per
    buf = torch.zeros((g, k, mn_al), dtype=s.dtype, device=s.device)
    buf[:, :, :mn].copy_(s.transpose(1, 2))
    out = buf[:, :, :mn].transpose(1, 2)
    return out[0] if squeeze else out


def is_mn_major(sf: torch.Tensor) -> bool:
    """Whether ``sf``'s MN dim (``-2``) has stride 1 (or size 1)."""
    return sf.dim() >= 2 and (sf.stride(-2) == 1 or sf.shape[-2] == 1)


def to_k_major(sf: torch.Tensor, name: str = "sf") -> torch.Tensor:
    """Inverse of :func:`to_mn_major`: the same values, contiguous (K-major)."""
    _check_tensor(sf, name, contiguous=False)
    return sf.contiguous()


def check_mxfp4_weights(w: torch.Tensor, sf: torch.Tensor, name: str,
                        rows: int | None = None, k: int | None = None, *,
                        dims: tuple[str, str] = ("N", "K"), source: str | None = None) -> tuple[int, int, int]:
    """Validate one MXFP4 checkpoint pair; return ``(E, N, K)``.

    Args:
        w: packed E2M1 ``uint8``/``int8`` ``[E, N, K/2]``, contiguous.
        sf: UE8M0 ``uint8 [E, N, K/32]`` (or packed ``int32 [E, N, K/128]``).
        name: prefix for error messages (``"l1_weights"`` -> ``"l1_weights"`` and
            ``"l1_weights_sf"``).
        rows, k: expected N and K when known.
        dims, source: where ``rows`` / ``k`` come from, for the message: the names of N and K
            (``("H", "I")``) and the tensor they were read off; with ``source`` a mismatch
            reads ``expected shape (E, H=256, I/2=64) with <source>``.
    Raises:
        InputError: wrong dtype, rank, shapes, K not a multiple of 32, non-contiguous;
            ``rows`` / ``k`` neither None nor a positive ``int``.
    """
    for arg, v in (("rows", rows), ("k", k)):
        if v is not None and not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
            raise InputError(arg, "None or a positive integer", repr(v) if isinstance(v, str) else v)
    _check_tensor(w, name, dtypes=_BYTE_DTYPES, ndim=3)
    _check_tensor(sf, name + "_sf", dtypes=(torch.uint8, torch.int32), ndim=3, contiguous=False)
    e, n, kh = w.shape
    kk = kh * 2
    if source is not None and ((rows is not None and n != rows) or (k is not None and kk != k)):
        dn, dk = dims
        raise InputError(name, f"shape (E, {dn if rows is None else f'{dn}={rows}'}, "
                         f"{dk}/2{'' if k is None else f'={k // 2}'}) with {source}", f"shape {tuple(w.shape)}")
    if rows is not None and n != rows:
        raise InputError(name, f"shape (E, {rows}, K/2)", f"shape {tuple(w.shape)}")
    if k is not None and kk != k:
        raise InputError(name, f"shape (E, N, {k // 2})", f"shape {tuple(w.shape)}")
    if kk % BLOCK_K != 0:
        raise InputError(name, f"K = 2 * shape[2] a multiple of {BLOCK_K}", f"shape {tuple(w.shape)}")
    per = BLOCK_K * (4 if sf.dtype == torch.int32 else 1)
    want = (e, n, -(-kk // per))
    if tuple(sf.shape) != want:
        raise InputError(name + "_sf", f"shape {want}", f"shape {tuple(sf.shape)}")
    return e, n, kk


def transform_weights_for_mega_moe(
    l1_weights: tuple[torch.Tensor, torch.Tensor],
    l2_weights: tuple[torch.Tensor, torch.Tensor],
) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """MXFP4 checkpoint -> SM100 kernel layout (DeepGEMM ``transform_weights_for_mega_moe``
    after ``transform_sf_into_required_layout``).

    Args:
        l1_weights: ``(w1 [E, 2I, H/2] uint8|int8, sf1 [E, 2I, H/32] uint8)``.
        l2_weights: ``(w2 [E, H, I/2] uint8|int8, sf2 [E, H, I/32] uint8)``.
    Returns:
        ``((w1', sf1'), (w2, sf2'))``: ``w1'`` gate/up interleaved every 8 rows (same
        dtype); ``sf1'`` ``int32 [E, 2I, H/128]`` packed, interleaved, UTCCP-transposed,
        MN-major; ``w2`` unchanged (a contiguous copy); ``sf2'`` ``int32 [E, H, I/128]``
        packed, UTCCP-transposed, MN-major.
    Raises:
        InputError: shapes/dtypes (2I and H must be multiples of 128; K multiples of 128).
    """
    (w1, sf1), (w2, sf2) = l1_weights, l2_weights
    e, n1, h = check_mxfp4_weights(w1, sf1, "l1_weights")
    _, _, inter = check_mxfp4_weights(w2, sf2, "l2_weights")
    if n1 != 2 * inter:
        raise InputError("l1_weights", f"dim 1 == 2 * intermediate = {2 * inter}", f"shape {tuple(w1.shape)}")
    check_mxfp4_weights(w2, sf2, "l2_weights", rows=h, dims=("H", "I"),
                        source=f"H from l1_weights (E, 2I, H/2) = {tuple(w1.shape)}")
    if w2.shape[0] != e:
        raise InputError("l2_weights", f"{e} experts like l1_weights", f"shape {tuple(w2.shape)}")
    for nm, t, kk in (("l1_weights_sf", sf1, h), ("l2_weights_sf", sf2, inter)):
        if t.dtype != torch.uint8:
            raise InputError(nm, "uint8 UE8M0 bytes (checkpoint layout)", str(t.dtype))
        if kk % 128 != 0 or t.shape[1] % UTCCP_ROWS != 0:
            raise InputError(nm, "K and MN multiples of 128", f"shape {tuple(t.shape)}")
    w1t = interleave_gate_up(w1.contiguous(), name="l1_weights")
    sf1t = to_mn_major(pack_ue8m0(sf1.contiguous()), "l1_weights_sf")
    sf1t = utccp_transpose_sf(interleave_gate_up(sf1t, name="l1_weights_sf"), "l1_weights_sf")
    sf2t = utccp_transpose_sf(to_mn_major(pack_ue8m0(sf2.contiguous()), "l2_weights_sf"),
                              "l2_weights_sf")
    return (w1t, sf1t), (w2.contiguous().clone(), sf2t)


def untransform_weights_for_mega_moe(
    l1_weights: tuple[torch.Tensor, torch.Tensor],
    l2_weights: tuple[torch.Tensor, torch.Tensor],
) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """Inverse of :func:`transform_weights_for_mega_moe`: back to the MXFP4 checkpoint
    layout (``uint8`` scale bytes, K-major, gate rows then up rows; weights keep dtype)."""
    (w1, sf1), (w2, sf2) = l1_weights, l2_weights
    _check_tensor(w1, "l1_weights", dtypes=_BYTE_DTYPES, ndim=3, contiguous=False)
    _check_tensor(w2, "l2_weights", dtypes=_BYTE_DTYPES, ndim=3, contiguous=False)
    sf1u = deinterleave_gate_up(utccp_untranspose_sf(sf1, "l1_weights_sf"), name="l1_weights_sf")
    sf2u = utccp_untranspose_sf(sf2, "l2_weights_sf")
    return ((deinterleave_gate_up(w1.contiguous(), name="l1_weights"),
             unpack_ue8m0(sf1u.contiguous())),
            (w2.contiguous().clone(), unpack_ue8m0(sf2u.contiguous())))


#: Rows (N) and K elements of one SM90 weight tile: one stage's weights, one bulk copy.
SM90_TILE_N = 128
SM90_TILE_K = 128


def _sm90_tiles(t: torch.Tensor, row_bytes: int) -> torch.Tensor:
    """``[E, N, K*row_bytes/128]`` rows -> ``[E, N/128, K/128, 128, row_bytes]`` tiles."""
    e, n, c = t.shape
    return t.view(e, n // SM90_TILE_N, SM90_TILE_N, c // row_bytes, row_bytes).permute(0, 1, 3, 2, 4).contiguous()


def _sm90_untiles(t: torch.Tensor) -> torch.Tensor:
    e, nb, kb, rows, row_bytes = t.shape
    return t.permute(0, 1, 3, 2, 4).reshape(e, nb * rows, kb * row_bytes)


def transform_weights_for_sm90(
    l1_weights: tuple[torch.Tensor, torch.Tensor],
    l2_weights: tuple[torch.Tensor, torch.Tensor],
) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """MXFP4 checkpoint -> the SM90 kernel's weight tiles (see the module docstring).

    For each GEMM: rows gate/up-interleaved every 8 (L1 only, :func:`interleave_gate_up`),
    bytes of every 64-byte K block in register-fragment order
    (:func:`permute_e2m1_for_sm90_rs`), then cut into tiles of 128 rows x 128 K elements
    stored contiguously, N block major, then K block: tile ``(e, j, kb)`` is the stage the
    producer loads for expert ``e``, N block ``j``, K block ``kb`` (8192 weight bytes, 512
    scale bytes, each one ``cp.async.bulk``).

    Args:
        l1_weights: ``(w1 [E, 2I, H/2] uint8|int8, sf1 [E, 2I, H/32] uint8)``.
        l2_weights: ``(w2 [E, H, I/2], sf2 [E, H, I/32] uint8)``.
    Returns:
        ``((w1t [E, 2I/128, H/128, 128, 64], sf1t [E, 2I/128, H/128, 128, 4]),
        (w2t [E, H/128, I/128, 128, 64], sf2t [E, H/128, I/128, 128, 4]))``, new contiguous
        tensors on the inputs' device, dtypes kept.
    Raises:
        InputError: shapes/dtypes, L2 not ``[E, H, I/2]`` for L1's ``[E, 2I, H/2]`` (same E),
            or N (2I, H) or K (H, I) not multiples of 128.
    """
    (w1, sf1), (w2, sf2) = l1_weights, l2_weights
    e, n1, h = check_mxfp4_weights(w1, sf1, "l1_weights")
    e2, _, _ = check_mxfp4_weights(w2, sf2, "l2_weights", rows=h, k=n1 // 2, dims=("H", "I"),  # [E, H, I/2]
                                   source=f"H and I from l1_weights (E, 2I, H/2) = {tuple(w1.shape)}")
    if e2 != e:
        raise InputError("l2_weights", f"{e} experts (as l1_weights)", f"shape {tuple(w2.shape)}")
    for nm, t in (("l1_weights_sf", sf1), ("l2_weights_sf", sf2)):
        if t.dtype != torch.uint8:
            raise InputError(nm, "uint8 UE8M0 bytes (checkpoint layout)", str(t.dtype))
    for nm, t in (("l1_weights", w1), ("l2_weights", w2)):
        if t.shape[1] % SM90_TILE_N or (2 * t.shape[2]) % SM90_TILE_K:
            raise InputError(nm, f"[E, N, K/2] with N and K multiples of {SM90_TILE_N}", tuple(t.shape))
    w1 = interleave_gate_up(w1.contiguous(), name="l1_weights")
    sf1 = interleave_gate_up(sf1.contiguous(), name="l1_weights_sf")
    return tuple((_sm90_tiles(permute_e2m1_for_sm90_rs(w, nm), 64), _sm90_tiles(sf.contiguous(), 4))
                 for nm, w, sf in (("l1_weights", w1, sf1), ("l2_weights", w2, sf2)))


def untransform_weights_for_sm90(
    l1_weights: tuple[torch.Tensor, torch.Tensor],
    l2_weights: tuple[torch.Tensor, torch.Tensor],
) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """Inverse of :func:`transform_weights_for_sm90`: tiles -> checkpoint ``[E, N, K/2]``,
    ``[E, N, K/32]`` (new tensors).

    Raises:
        InputError: a tensor that is not 5-dimensional ``[E, N/128, K/128, 128, 64 | 4]``.
    """
    out = []
    for nm, (w, sf) in (("l1_weights", l1_weights), ("l2_weights", l2_weights)):
        for tn, t, rb in ((nm, w, 64), (nm + "_sf", sf, 4)):
            if t.dim() != 5 or tuple(t.shape[3:]) != (SM90_TILE_N, rb):
                raise InputError(tn, f"SM90 tiles [E, N/128, K/128, 128, {rb}]", tuple(t.shape))
        out.append((unpermute_e2m1_for_sm90_rs(_sm90_untiles(w), nm), _sm90_untiles(sf)))
    (w1, sf1), (w2, sf2) = out
    return ((deinterleave_gate_up(w1, name="l1_weights"), deinterleave_gate_up(sf1, name="l1_weights_sf")),
            (w2, sf2))


def _rs_view(w: torch.Tensor, name: str) -> torch.Tensor:
    _check_tensor(w, name, dtypes=(torch.uint8, torch.int8), contiguous=False)
    if w.dim() < 1 or w.shape[-1] % 64:
        raise InputError(name, "packed E2M1 [..., K/2] with K a multiple of 128", tuple(w.shape))
    return w.contiguous()


def _nibble_split(w: torch.Tensor) -> torch.Tensor:
    """Every 4-byte word: E2M1 codes ``c0..c7`` (``c_j`` in byte ``j // 2``, low nibble first)
    -> the word the SM90 decode reads (``csrc/megamoe/fp4.cuh``): nibble ``j`` holds the
    magnitude (low 3 bits) of ``c_j`` in its bits 0-2; the sign of ``c_j`` (j < 4) is bit
    ``8j + 7`` and the sign of ``c_{4+j}`` is bit ``8j + 3``, i.e. byte ``b`` =
    ``m_{2b} | s_{4+b} << 3 | m_{2b+1} << 4 | s_b << 7``."""
    x = w.view(*w.shape[:-1], w.shape[-1] // 4, 4)
    c = torch.stack((x & 0xF, x >> 4), dim=-1).reshape(*x.shape[:-1], 8)  # c0..c7
    m, s = c & 7, c >> 3
    return (m[..., 0::2] | (s[..., 4:] << 3) | (m[..., 1::2] << 4) | (s[..., :4] << 7)).reshape(w.shape)


def _nibble_join(w: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`_nibble_split`."""
    x = w.view(*w.shape[:-1], w.shape[-1] // 4, 4)
    m = torch.stack((x & 7, (x >> 4) & 7), dim=-1).reshape(*x.shape[:-1], 8)  # magnitudes c0..c7
    s = torch.cat(((x >> 7) & 1, (x >> 3) & 1), dim=-1)                        # signs c0..c7
    c = m | (s << 3)
    return (c[..., 0::2] | (c[..., 1::2] << 4)).reshape(w.shape)


def permute_e2m1_for_sm90_rs(w: torch.Tensor, name: str = "weights") -> torch.Tensor:
    """Packed E2M1 rows -> the SM90 kernel's register-fragment byte and nibble order.

    ``wgmma.m64nNk32`` with A in registers (8-bit types, CuTe ``ALayout_64x32``) gives the
    thread with ``t = lane % 4`` the K elements ``[4t, 4t+4)`` and ``[16+4t, 16+4t+4)`` of each
    k32 step, i.e. the packed bytes ``8p + 2t`` and ``8p + 2t + 1`` of every 8-byte piece
    ``p`` of a row's 64-byte (128-element) K block.  This moves byte ``8p + 2t + b`` of every K
    block to ``16t + 2p + b``: thread ``t`` reads its whole fragment as 16-byte chunk ``t``,
    and word ``q`` of that chunk decodes into its registers of step ``q``.  Then, inside
    every 4-byte word, the bits of the eight values ``c0..c7`` (in K order) are re-packed:
    nibble ``j`` holds the magnitude of ``c_j`` (bits 0-2, a byte selector of ``prmt``), the
    sign of ``c_j`` is bit ``8j + 7`` and that of ``c_{4+j}`` bit ``8j + 3`` (``j < 4``): the
    kernel turns ``c0..c3`` into its first register with one byte permute from a 8-byte
    table and a masked OR of the signs, and ``c4..c7`` into its second the same way on the
    word shifted (``csrc/megamoe/fp4.cuh``).

    Args:
        w: ``uint8``/``int8`` ``[..., K/2]`` packed E2M1 (element ``2i`` in the low nibble of
            byte ``i``), K a multiple of 128; e.g. ``[E, 2I, H/2]``.
    Returns:
        a new contiguous tensor of the same shape and dtype.
    Raises:
        InputError: not a byte tensor, or K/2 not a multiple of 64.
    """
    w = _rs_view(w, name)
    kb = w.shape[-1] // 64
    out = w.view(*w.shape[:-1], kb, 8, 4, 2).transpose(-3, -2).contiguous().view(w.shape)
    return _nibble_split(out.view(torch.uint8)).view(w.dtype)


def unpermute_e2m1_for_sm90_rs(w: torch.Tensor, name: str = "weights") -> torch.Tensor:
    """Inverse of :func:`permute_e2m1_for_sm90_rs` (same arguments and errors)."""
    w = _rs_view(w, name)
    kb = w.shape[-1] // 64
    w = _nibble_join(w.view(torch.uint8)).view(w.dtype)
    return w.view(*w.shape[:-1], kb, 4, 8, 2).transpose(-3, -2).contiguous().view(w.shape)


# ============================================================================ SM90 weight fold

#: The SM90 decode puts a row's largest per-32 scale at E2M1 x 2^6 (6 x 2^6 = 384 <= 448, the
#: largest finite E4M3), the row's other 32-groups 2^d lower (``d`` = that group's scale
#: exponent below the row's largest), so every E2M1 value of a group within 14 binades of its
#: row's largest is an exact E4M3 value (0.5 x 2^(6-14) = 2^-9, E4M3's smallest subnormal)
#: and ``Numerics(w_fold_k="row", w_fold_top=6)`` is then the per-32 numerics exactly.
SM90_FOLD_TOP = 6
#: Rows of :func:`sm90_fold_table`: ``d = 0..19``; from ``d = 19`` on, every E2M1 value
#: x 2^(6 - d) rounds to E4M3 zero (6 x 2^-13 < 2^-10, half the smallest subnormal).
SM90_FOLD_ROWS = 20


def sm90_fold_table() -> torch.Tensor:
    """The SM90 kernel's E2M1 -> E4M3 decode table, ``uint8 [20, 8]``.

    Row ``d``, byte ``c`` = the E4M3 bits of E2M1 magnitude code ``c`` (0, 0.5, 1, 1.5, 2, 3,
    4, 6) x 2^(6 - d), rounded to nearest-even with subnormals (:func:`megamoe.formats.
    cast_to_e4m3`, the rounding of :func:`megamoe.reference.block_scaled_gemm`'s fold).  The
    kernel copies it into shared memory and reads one row (8 bytes) per weight row, 32-group
    pair of registers: ``prmt`` selects byte ``c`` for each code (``csrc/megamoe/fp4.cuh``)."""
    d = torch.arange(SM90_FOLD_ROWS, dtype=torch.float64)[:, None]
    v = torch.tensor(E2M1_VALUES[:8], dtype=torch.float64)[None, :]
    return cast_to_e4m3(v * torch.exp2(SM90_FOLD_TOP - d)).view(torch.uint8).contiguous()


def fold_e2m1_scales_for_sm90(w: torch.Tensor, sf: torch.Tensor,
                              name: str = "weights") -> tuple[torch.Tensor, torch.Tensor]:
    """Per-32 UE8M0 weight scales -> the SM90 kernel's fold: table offsets and row exponents.

    For each row, ``s_max`` = the largest scale byte over the row's 32-groups that hold a
    nonzero E2M1 value (127 for a row of zeros; an all-zero group decodes to zeros whatever
    its scale).  Group ``g`` then decodes through table row ``d = min(max(s_max - s_g, 0),
    19)`` of :func:`sm90_fold_table` (values x 2^(6 - d)), and the row's FP32 result is
    multiplied once by ``2^(s_max - 127 - 6)`` (the kernel's row scale) instead of every
    32-group partial sum by ``2^(s_g - 127)``.  This is exactly
    ``megamoe.reference.Numerics(arch="sm90", w_fold_k="row", w_fold_top=6)``; when every
    group with a nonzero value lies within 14 binades of its row's largest (``d <= 14``) the
    decoded values are exact and the result is bitwise the per-32 one.

    A scale byte of 255 (NaN in the OCP MX formats) is taken as the number 2^128 here;
    :func:`megamoe.kernel.runtime.sm90_weights` refuses it before folding.

    Args:
        w: packed E2M1 ``uint8`` or ``int8`` ``[..., N, K/2]`` (checkpoint layout, element
            ``2i`` in the low nibble of byte ``i``), K a multiple of 32.
        sf: UE8M0 bytes ``uint8 [..., N, K/32]``.
    Returns:
        ``(offsets uint8 [..., N, K/32] = 8 d`` (byte offset of the table row),
        ``s_max uint8 [..., N])``, on ``sf``'s device.
    Raises:
        InputError: not byte tensors, fewer than 2 dimensions, K not a multiple of 32 (named
            ``name``), or ``sf`` not ``[..., N, K/32]`` for ``w`` (named ``name + "_sf"``).
    """
    _check_tensor(w, name, dtypes=_BYTE_DTYPES, min_ndim=2, contiguous=False)
    _check_tensor(sf, name + "_sf", dtypes=(torch.uint8,), min_ndim=2, contiguous=False)
    if w.shape[-1] % 16:
        raise InputError(name, "packed E2M1 [..., N, K/2] with K a multiple of 32", f"shape {tuple(w.shape)}")
    if tuple(sf.shape) != (*w.shape[:-1], w.shape[-1] // 16):
        raise InputError(name + "_sf", f"[..., N, K/32] UE8M0 bytes for {name} {tuple(w.shape)}", tuple(sf.shape))
    mag = w.view(torch.uint8) & 0x77  # both nibbles' magnitudes (a -0 code holds no value)
    nonzero = (mag.reshape(*sf.shape, 16) != 0).any(-1)
    s = sf.to(torch.int32)
    smax = torch.where(nonzero, s, torch.full_like(s, -1)).amax(-1) if s.shape[-1] else s.new_full(s.shape[:-1], -1)
    smax = torch.where(smax < 0, torch.full_like(smax, UE8M0_BIAS), smax)
    d = (smax.unsqueeze(-1) - s).clamp(0, SM90_FOLD_ROWS - 1)
    return (d * 8).to(torch.uint8), smax.to(torch.uint8)


def fold_e4m3_scales_for_sm90(x: torch.Tensor, x_sf: torch.Tensor, fold: int = 64,
                              name: str = "x") -> tuple[torch.Tensor, torch.Tensor]:
    """Per-32 UE8M0 activation scales -> the SM90 kernel's activation fold, bytes in, bytes out.

    What the kernel's pools hold (``Numerics.sm90_kernel()``, ``x_fold_k = 64``): the L1 pool
    as the dispatch warps pull each row, the L2 pool as the L1 epilogue quantizes it.  In every
    ``fold``-wide K group, ``s_max`` = the largest scale byte over its 32-groups that hold a
    nonzero E4M3 value; each of those groups' values is multiplied by ``2^(s_g - s_max)``
    (<= 1) and rounded to nearest-even E4M3 with subnormals (:func:`megamoe.formats.
    cast_to_e4m3`), and every scale byte of the group becomes ``s_max``.  A group with no
    nonzero value is kept as it is (values and scale bytes).  A scale byte of 255 (NaN in the
    OCP MX formats) counts as the largest: its partner group's values round to zero, as in
    the kernel.  The values equal those of
    :func:`megamoe.reference.block_scaled_gemm`'s fold of the A operand (``x_fold_k``); the
    kernel's promotion then multiplies each ``fold``-deep partial sum by one token scale.

    Args:
        x: E4M3 ``uint8``/``int8``/``float8_e4m3fn [..., K]`` (raw bytes), K a multiple of ``fold``.
        x_sf: UE8M0 bytes ``uint8 [..., K/32]``.
        fold: fold width, a positive multiple of 32.
    Returns:
        ``(values uint8 [..., K], scales uint8 [..., K/32])`` on ``x``'s device.
    Raises:
        InputError: wrong dtypes or fewer than 1 dimension, ``fold`` not a positive multiple of
            32, K not a multiple of ``fold`` (named ``name``), or ``x_sf`` not ``[..., K/32]``
            (named ``name + "_sf"``).
    """
    if isinstance(fold, bool) or not isinstance(fold, int) or fold <= 0 or fold % BLOCK_K:
        raise InputError("fold", "a positive multiple of 32", repr(fold))
    _check_tensor(x, name, dtypes=(*_BYTE_DTYPES, torch.float8_e4m3fn), min_ndim=1, contiguous=False)
    _check_tensor(x_sf, name + "_sf", dtypes=(torch.uint8,), min_ndim=1, contiguous=False)
    k = x.shape[-1]
    if k % fold:
        raise InputError(name, f"[..., K] E4M3 bytes with K a multiple of {fold}", f"shape {tuple(x.shape)}")
    if tuple(x_sf.shape) != (*x.shape[:-1], k // BLOCK_K):
        raise InputError(name + "_sf", f"[..., K/32] UE8M0 bytes for {name} {tuple(x.shape)}", tuple(x_sf.shape))
    per = fold // BLOCK_K
    xb = x.view(torch.uint8).reshape(*x_sf.shape[:-1], k // fold, per, BLOCK_K)
    s = x_sf.to(torch.int32).reshape(*x_sf.shape[:-1], k // fold, per)
    nonzero = ((xb & 0x7F) != 0).any(-1)
    any_nz = nonzero.any(-1, keepdim=True)
    smax = torch.where(nonzero, s, torch.full_like(s, -1)).amax(-1, keepdim=True)
    d = torch.where(nonzero, smax - s, torch.zeros_like(s))          # >= 0
    v = decode_e4m3(xb, torch.float64) * torch.exp2(-d.to(torch.float64)).unsqueeze(-1)
    folded = torch.where((d > 0).unsqueeze(-1), cast_to_e4m3(v).view(torch.uint8), xb)
    new_s = torch.where(any_nz, smax.expand_as(s), s)
    return folded.reshape(x.shape).contiguous(), new_s.to(torch.uint8).reshape(x_sf.shape).contiguous()
