"""Number formats of the MegaMoE recipe ``(1, 1, 32)``: FP8 E4M3, FP4 E2M1, UE8M0, packing.

Everything here is plain torch and runs on any device (CPU or CUDA).  Element decode uses
torch's own dtypes: ``torch.float8_e4m3fn`` (E4M3) and ``torch.float8_e8m0fnu`` (UE8M0) are
reinterpreted with ``Tensor.view`` and converted by torch.  ``torch.float4_e2m1fn_x2`` exists
(torch >= 2.8) but is a storage-only dtype: torch 2.9-2.13 implement no conversion kernels
for it (``"copy_kernel" not implemented for 'Float4_e2m1fn_x2'``), so E2M1 is decoded and
encoded with the 16-entry table :data:`E2M1_VALUES`; packed bytes produced here can be
reinterpreted with ``t.view(torch.float4_e2m1fn_x2)`` (same nibble order, see below).

Formats
-------
* **E4M3** (``float8_e4m3fn``): 1 sign, 4 exponent (bias 7), 3 mantissa bits, no infinity,
  ``0x7F``/``0xFF`` are NaN, max finite 448, smallest subnormal 2^-9.  Casts here saturate:
  values are clamped to [-448, 448] before torch's round-to-nearest-even cast, so +-Inf
  becomes +-448 and NaN stays NaN.  This is the CUDA ``__nv_fp8x4_e4m3`` constructor's
  ``__NV_SATFINITE`` behaviour used by the kernel's L1 epilogue, and it makes the result
  independent of the torch version (older torch casts overflow to NaN, newer saturate).
* **E2M1** (FP4): 1 sign, 2 exponent (bias 1), 1 mantissa bit; magnitudes
  {0, 0.5, 1, 1.5, 2, 3, 4, 6}; no NaN/Inf.  Two codes per byte, **low nibble first**:
  element ``2j`` in bits 0-3 of byte ``j``, element ``2j+1`` in bits 4-7 (DeepGEMM
  ``deep_gemm/utils/math.py::per_token_cast_to_fp4``, commit 891d57b: ``codes[..., 0] |
  codes[..., 1] << 4``).
* **UE8M0** (``float8_e8m0fnu``): an unsigned byte ``b`` meaning 2^(b-127); ``0xFF`` is NaN;
  there is no zero (``0x00`` is 2^-127).  One scale per 32 consecutive elements along K.
* **Packed UE8M0**: four scale bytes in one int32, **scale of K group 4j+i in byte i (bits
  8i..8i+7)** of int32 ``j`` -- little-endian, i.e. ``uint8[..., 4n].view(int32)`` on a
  little-endian machine (DeepGEMM ``deep_gemm/utils/math.py::pack_ue8m0_to_int``, commit
  891d57b: ``(sf.view(int) >> 23).to(uint8).view(int)``).  Packing here is arithmetic, so it
  does not depend on the host byte order.

Scale rules (both round the scale *up* to a power of two so the block's amax fits)
--------------------------------------------------------------------------------
* Input / weight quantization, :func:`quantize_e4m3_blocks` / :func:`quantize_e2m1_blocks`:
  ``sf = ceil_pow2(max(amax, 1e-4) / fmax)`` with the UE8M0 byte clamped to [1, 254], then
  ``q = cast(x * (1 / sf))`` (DeepGEMM ``per_token_cast_to_fp8`` / ``per_token_cast_to_fp4``
  with ``use_ue8m0=True, gran_k=32`` and ``ceil_to_ue8m0``, ``deep_gemm/utils/math.py``,
  commit 891d57b; ``tests/test_mega_moe.py`` uses exactly these to make the kernel's inputs,
  and SGLang's ``mega_moe_pre_dispatch`` is checked against ``per_token_cast_to_fp8``).
* L1-epilogue re-quantization, :func:`quantize_e4m3_epilogue`: ``scaled = amax *
  fp32(1/448)`` (one FP32 multiply), ``e = exponent_field(scaled) - 127 + (mantissa != 0)``
  with no clamp, ``sf = 2^e``, ``sf_inv = 2^-e`` built by shifting ``e + 127`` into the
  exponent field (wrapping like the kernel's 32-bit integer arithmetic), ``q =
  satfinite_e4m3(v * sf_inv)``, stored byte ``= bits(sf) >> 23`` truncated to 8 bits
  (``deep_gemm/include/deep_gemm/common/math.cuh::get_e4m3_sf_and_sf_inv``,
  ``fast_log2_ceil``, ``fast_pow2`` and the L1 epilogue of
  ``impls/sm100_fp8_fp4_mega_moe.cuh``, commit 891d57b).  For amax == 0 the kernel's ``sf``
  is 0.0 (stored byte 0) and ``sf_inv`` is 2^127.

All bad input raises :class:`megamoe.errors.InputError` (a ``ValueError``) naming the tensor.
"""

from __future__ import annotations

import torch

from megamoe.errors import InputError, shown

__all__ = [
    "BLOCK_K", "E4M3_MAX", "E2M1_MAX", "UE8M0_BIAS", "E2M1_VALUES",
    "HAS_TORCH_FP4",
    "cast_to_e4m3", "decode_e4m3",
    "e2m1_table", "decode_e2m1", "e2m1_to_e4m3", "encode_e2m1", "pack_e2m1", "unpack_e2m1",
    "decode_ue8m0", "ue8m0_ceil", "pack_ue8m0", "unpack_ue8m0",
    "quantize_e4m3_blocks", "dequantize_e4m3_blocks",
    "quantize_e2m1_blocks", "dequantize_e2m1_blocks",
    "quantize_e4m3_epilogue", "round_to_bf16",
]

#: Elements per UE8M0 scale along K (the ``32`` of recipe ``(1, 1, 32)``).
BLOCK_K = 32
#: Largest finite E4M3 magnitude.
E4M3_MAX = 448.0
#: Largest E2M1 magnitude.
E2M1_MAX = 6.0
#: UE8M0 exponent bias: byte ``b`` means ``2**(b - 127)``.
UE8M0_BIAS = 127
#: Value of each E2M1 code 0..15 (bit 3 = sign, bits 2-1 = exponent, bit 0 = mantissa).
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
               -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
#: Whether this torch has the storage dtype ``float4_e2m1fn_x2`` (it has no cast kernels).
HAS_TORCH_FP4 = hasattr(torch, "float4_e2m1fn_x2")

_FP32_INV_448 = torch.tensor(1.0 / 448.0, dtype=torch.float32).item()  # fp32(1/448), as a float


# ----------------------------------------------------------------------------- checks

def _desc(t: object) -> str:
    if isinstance(t, torch.Tensor):
        return f"{t.dtype} tensor of shape {tuple(t.shape)} on {t.device}"
    return type(t).__name__


def _check_tensor(t: object, name: str, *, dtypes: tuple | None = None, ndim: int | None = None,
                  min_ndim: int | None = None, contiguous: bool = True) -> torch.Tensor:
    """Validate a tensor argument; raise :class:`InputError` naming ``name`` otherwise."""
    if not isinstance(t, torch.Tensor):
        raise InputError(name, "a torch.Tensor", _desc(t))
    if dtypes is not None and t.dtype not in dtypes:
        raise InputError(name, "dtype " + " or ".join(str(d) for d in dtypes), str(t.dtype))
    if ndim is not None and t.dim() != ndim:
        raise InputError(name, f"{ndim} dimensions", f"shape {tuple(t.shape)}")
    if min_ndim is not None and t.dim() < min_ndim:
        raise InputError(name, f"at least {min_ndim} dimension{'s' if min_ndim != 1 else ''}", f"shape {tuple(t.shape)}")
    if contiguous and not t.is_contiguous():
        raise InputError(name, "a contiguous tensor", f"strides {tuple(t.stride())}")
    return t


def _check_last_dim_multiple(t: torch.Tensor, name: str, multiple: int) -> None:
    if t.dim() == 0 or t.shape[-1] % multiple != 0:
        raise InputError(name, f"last dimension a multiple of {multiple}",
                         f"shape {tuple(t.shape)}")


_FLOAT_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def _check_block(block: object, name: str = "block") -> int:
    """Elements per scale: an ``int`` >= 1 (not ``bool``, not a float: nothing is rounded)."""
    if not (isinstance(block, int) and not isinstance(block, bool) and block >= 1):
        raise InputError(name, f"a positive integer (elements per scale, {BLOCK_K} in the MegaMoE recipe)",
                         shown(block))
    return block


def _check_out_dtype(dtype: object, name: str = "dtype") -> torch.dtype:
    """An output dtype: one of float16 / bfloat16 / float32 / float64 (never an integer dtype,
    which would truncate the decoded values)."""
    if dtype not in _FLOAT_DTYPES:
        raise InputError(name, "torch.float32, torch.float64, torch.bfloat16 or torch.float16", shown(dtype))
    return dtype


def _check_e2m1_codes(codes: torch.Tensor, name: str) -> None:
    """Unpacked E2M1 codes are 0..15 (one per byte): a larger byte is refused, not masked."""
    if codes.numel():
        hi = int(codes.max())
        if hi > 15:
            raise InputError(name, "E2M1 codes 0..15 (one per uint8)",
                             f"a code {hi} at index {tuple(int(i) for i in (codes == hi).nonzero()[0])}")


# ----------------------------------------------------------------------------- E4M3

def cast_to_e4m3(x: torch.Tensor) -> torch.Tensor:
    """Saturating round-to-nearest-even cast to E4M3.

    Args:
        x: float tensor (float16/bfloat16/float32/float64), any shape.
    Returns:
        ``torch.float8_e4m3fn`` tensor of the same shape: ``clamp(x, -448, 448)`` rounded to
        nearest-even with subnormals; NaN stays NaN, +-Inf becomes +-448.
    Raises:
        InputError: ``x`` is not a float tensor.
    """
    _check_tensor(x, "x", dtypes=_FLOAT_DTYPES, contiguous=False)
    if x.dtype == torch.float64:
        # float64 -> float32 can only round values that are far below E4M3's subnormal
        # range or far above 448 (clamped anyway), so the double rounding is harmless.
        x = x.float()
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def decode_e4m3(q: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Decode E4M3 to floats (exact).

    Args:
        q: ``float8_e4m3fn`` tensor, or ``uint8``/``int8`` raw bytes, any shape.
        dtype: output float dtype.
    Returns:
        tensor of ``q``'s shape in ``dtype`` (``0x7F``/``0xFF`` decode to NaN).
    Raises:
        InputError: ``q`` has another dtype, or ``dtype`` is not a float dtype.
    """
    _check_tensor(q, "q", dtypes=(torch.float8_e4m3fn, torch.uint8, torch.int8), contiguous=False)
    _check_out_dtype(dtype)
    if q.dtype != torch.float8_e4m3fn:
        q = q.view(torch.float8_e4m3fn)
    return q.to(torch.float32).to(dtype)


# ----------------------------------------------------------------------------- E2M1

def e2m1_table(device: torch.device | str | None = None,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The 16 E2M1 values indexed by code, as a ``[16]`` tensor (code 8 is -0.0).

    Raises:
        InputError: ``dtype`` is not a float dtype.
    """
    _check_out_dtype(dtype)
    return torch.tensor(E2M1_VALUES, dtype=dtype, device=device)


def decode_e2m1(codes: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Decode unpacked E2M1 codes (one code 0..15 per ``uint8``) to floats.

    Table-driven because torch has no conversion kernels for ``float4_e2m1fn_x2``.

    Args:
        codes: ``uint8`` tensor, values 0..15, any shape.
        dtype: output float dtype.
    Returns:
        tensor of ``codes``' shape.
    Raises:
        InputError: ``codes`` is not ``uint8`` or holds a value above 15 (a packed byte is
            not a code: :func:`unpack_e2m1` first), or ``dtype`` is not a float dtype.
    """
    _check_tensor(codes, "codes", dtypes=(torch.uint8,), contiguous=False)
    _check_e2m1_codes(codes, "codes")
    table = e2m1_table(codes.device, dtype)
    return table[codes.long()]


def encode_e2m1(x: torch.Tensor, rounding: str = "deepgemm") -> torch.Tensor:
    """Round floats (already divided by their scale) to E2M1 codes, saturating at +-6.

    Args:
        x: float tensor, any shape.
        rounding: ``"deepgemm"`` (default) reproduces DeepGEMM's
            ``_quantize_to_fp4_e2m1`` (``deep_gemm/utils/math.py``, commit 891d57b:
            ``torch.bucketize`` on the midpoints, so a magnitude exactly on a midpoint
            rounds *down* to the smaller magnitude, e.g. 0.75 -> 0.5, 1.75 -> 1.5); ``"rne"``
            rounds to nearest with ties to the even code (0.25 -> 0, 0.75 -> 1.0,
            1.75 -> 2.0, 2.5 -> 2.0, 3.5 -> 4.0, 5.0 -> 4.0).
    Returns:
        ``uint8`` codes 0..15 of ``x``'s shape.  A result of magnitude 0 gets code 0 (never
        -0); NaN encodes as code 7 (+6), as DeepGEMM's bucketize does (E2M1 has no NaN).
    Raises:
        InputError: bad dtype or unknown ``rounding``.
    """
    _check_tensor(x, "x", dtypes=_FLOAT_DTYPES, contiguous=False)
    if rounding not in ("deepgemm", "rne"):
        raise InputError("rounding", "'deepgemm' or 'rne'", rounding)
    ax = x.float().abs().clamp_max(E2M1_MAX)
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], device=x.device)
    if rounding == "deepgemm":
        idx = torch.bucketize(ax, mids)  # ties go to the lower bucket
    else:
        lo = torch.bucketize(ax, mids)
        hi = torch.bucketize(ax, mids, right=True)  # differs from lo only on a midpoint
        # on a tie pick the even code of the two neighbours (lo and lo+1)
        idx = torch.where((hi != lo) & (lo % 2 == 1), hi, lo)
    idx = torch.where(torch.isnan(ax), torch.full_like(idx, 7), idx)
    neg = (x < 0) & (idx != 0)
    return (idx | (neg.long() << 3)).to(torch.uint8)


def e2m1_to_e4m3(packed: torch.Tensor) -> torch.Tensor:
    """Re-encode packed E2M1 as E4M3 (exact: every E2M1 value is an E4M3 value).

    This is what a Hopper kernel does in shared memory before ``wgmma``.  A nibble
    ``s e1 e0 m`` becomes the E4M3 byte ``s | (e + 6) << 3 | m << 2`` for ``e > 0`` and
    ``0x30 * m`` (0.5 or 0) for ``e == 0``; torch then decodes the E4M3 bytes.  Faster than
    the table lookup of :func:`decode_e2m1` on large weights.

    Args:
        packed: ``uint8``/``int8 [..., K/2]`` packed E2M1 (low nibble first).
    Returns:
        ``float8_e4m3fn [..., K]``.
    """
    _check_tensor(packed, "packed", dtypes=(torch.uint8, torch.int8), min_ndim=1,
                  contiguous=False)
    c = unpack_e2m1(packed)
    e = (c >> 1) & 3
    m = c & 1
    sign = (c & 8) << 4
    normal = ((e + 6) << 3) | (m << 2)
    mag = torch.where(e == 0, m * 0x30, normal)
    # -0 (code 8) stays 0x80, i.e. E4M3 -0.0
    return (sign | mag).view(torch.float8_e4m3fn)


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """Pack E2M1 codes two per byte along the last dimension, low nibble first.

    Args:
        codes: ``uint8`` ``[..., K]`` (K even), values 0..15.
    Returns:
        ``uint8`` ``[..., K/2]``: byte j = ``codes[..., 2j] | codes[..., 2j+1] << 4``.
    Raises:
        InputError: bad dtype, odd K, or a code above 15 (refused, not masked).
    """
    _check_tensor(codes, "codes", dtypes=(torch.uint8,), min_ndim=1, contiguous=False)
    _check_last_dim_multiple(codes, "codes", 2)
    _check_e2m1_codes(codes, "codes")
    c = codes.reshape(*codes.shape[:-1], codes.shape[-1] // 2, 2)
    return (c[..., 0] | (c[..., 1] << 4)).contiguous()


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_e2m1`: ``uint8 [..., K/2]`` (or int8) -> codes ``uint8 [..., K]``."""
    _check_tensor(packed, "packed", dtypes=(torch.uint8, torch.int8), min_ndim=1,
                  contiguous=False)
    p = packed.view(torch.uint8) if packed.dtype == torch.int8 else packed
    out = torch.stack([p & 0x0F, p >> 4], dim=-1)
    return out.reshape(*p.shape[:-1], p.shape[-1] * 2)


# ----------------------------------------------------------------------------- UE8M0

def decode_ue8m0(sf: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Decode UE8M0 bytes to ``2**(b - 127)`` (``0xFF`` -> NaN) via ``float8_e8m0fnu``.

    Args:
        sf: ``uint8`` or ``float8_e8m0fnu`` tensor, any shape.
        dtype: output float dtype (float32 represents 2^-127 as a subnormal, exactly).
    Raises:
        InputError: other dtypes of ``sf``, or ``dtype`` not a float dtype.
    """
    _check_tensor(sf, "sf", dtypes=(torch.uint8, torch.float8_e8m0fnu), contiguous=False)
    _check_out_dtype(dtype)
    if sf.dtype == torch.uint8:
        sf = sf.view(torch.float8_e8m0fnu)
    return sf.to(torch.float32).to(dtype)


def ue8m0_ceil(x: torch.Tensor, clamp: bool = True) -> torch.Tensor:
    """UE8M0 byte of ``x`` rounded up to a power of two (``x`` >= 0, FP32).

    ``b = exponent_field(x) + (mantissa(x) != 0)``: exact powers of two map to themselves,
    anything just above goes to the next power (1.0 -> 127, 1.0000001 -> 128).  With
    ``clamp`` (DeepGEMM ``ceil_to_ue8m0``) the byte is clamped to [1, 254]; without it the
    raw 8-bit value is returned (the kernel's ``fast_log2_ceil``: 0.0 -> 0, FP32 subnormals
    -> 1, Inf -> 255, NaN -> 0 after the 8-bit truncation of ``(e + 127) << 23 >> 23``).

    Args:
        x: float tensor (converted to float32), any shape.
        clamp: a ``bool`` (see above).
    Returns:
        ``uint8`` tensor of ``x``'s shape.
    Raises:
        InputError: ``x`` is not a float tensor, or ``clamp`` is not a ``bool``.
    """
    _check_tensor(x, "x", dtypes=_FLOAT_DTYPES, contiguous=False)
    if not isinstance(clamp, bool):
        raise InputError("clamp", "True or False", shown(clamp))
    bits = x.float().abs().contiguous().view(torch.int32).long()
    exp = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).long()
    if clamp:
        exp = exp.clamp(1, 254)
    return (exp & 0xFF).to(torch.uint8)


def pack_ue8m0(sf: torch.Tensor) -> torch.Tensor:
    """Pack UE8M0 bytes four per int32 along the last dim (group 4j+i -> byte i of int j).

    Args:
        sf: ``uint8`` ``[..., G]`` with G a multiple of 4 (G = K/32).
    Returns:
        ``int32`` ``[..., G/4]`` (= ``[..., K/128]``), bit-identical to
        ``sf.view(torch.int32)`` on little-endian hosts and on CUDA.
    Raises:
        InputError: bad dtype or G not a multiple of 4.
    """
    _check_tensor(sf, "sf", dtypes=(torch.uint8,), min_ndim=1, contiguous=False)
    _check_last_dim_multiple(sf, "sf", 4)
    b = sf.reshape(*sf.shape[:-1], sf.shape[-1] // 4, 4).long()
    word = b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16) | (b[..., 3] << 24)
    word = torch.where(word >= 2 ** 31, word - 2 ** 32, word)
    return word.to(torch.int32).contiguous()


def unpack_ue8m0(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_ue8m0`: ``int32 [..., G/4]`` -> ``uint8 [..., G]``."""
    _check_tensor(packed, "packed", dtypes=(torch.int32,), min_ndim=1, contiguous=False)
    w = packed.long() & 0xFFFFFFFF
    b = torch.stack([(w >> (8 * i)) & 0xFF for i in range(4)], dim=-1)
    return b.reshape(*packed.shape[:-1], packed.shape[-1] * 4).to(torch.uint8)


# ----------------------------------------------------------------------------- blocks

def _blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    return x.reshape(*x.shape[:-1], x.shape[-1] // block, block)


def _scaled_blocks(x: torch.Tensor, block: int, fmt_max: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Checked ``x`` as FP32 blocks ``[..., K/block, block]`` divided by their UE8M0 scale
    ``ue8m0_ceil(max(amax, 1e-4) / fmt_max)``, and the scale bytes ``[..., K/block]``."""
    _check_tensor(x, "x", dtypes=_FLOAT_DTYPES, min_ndim=1, contiguous=False)
    _check_block(block)
    _check_last_dim_multiple(x, "x", block)
    xb = _blocks(x.float(), block)
    amax = xb.abs().amax(dim=-1).clamp(min=1e-4)
    sf = ue8m0_ceil(amax / fmt_max)
    inv = 1.0 / decode_ue8m0(sf)
    return xb * inv.unsqueeze(-1), sf


def quantize_e4m3_blocks(x: torch.Tensor, block: int = BLOCK_K) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-``block`` E4M3 quantization along the last dim with UE8M0 scales.

    Recipe (DeepGEMM ``per_token_cast_to_fp8(use_ue8m0=True, gran_k=32)``, commit 891d57b):
    ``amax = max(|x|, 1e-4)`` in FP32 per block, ``sf = ue8m0_ceil(amax / 448)`` clamped
    to bytes [1, 254], ``q = satfinite_e4m3(x_fp32 * fp32(1 / sf))``.

    Args:
        x: float tensor ``[..., K]``, K a multiple of ``block``.
        block: elements per scale (32 in the MegaMoE recipe).
    Returns:
        ``(q, sf)``: ``q`` ``float8_e4m3fn [..., K]``, ``sf`` ``uint8 [..., K/block]`` UE8M0.
    Raises:
        InputError: bad dtype, ``block`` not a positive ``int``, or K not a multiple of ``block``.
    """
    scaled, sf = _scaled_blocks(x, block, E4M3_MAX)
    return cast_to_e4m3(scaled).reshape(x.shape), sf


def dequantize_e4m3_blocks(q: torch.Tensor, sf: torch.Tensor,
                           dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``decode_e4m3(q) * 2**(sf - 127)`` per block.

    Args:
        q: ``float8_e4m3fn [..., K]``.
        sf: ``uint8 [..., K/32]`` UE8M0 bytes, or ``int32 [..., K/128]`` packed.
        dtype: output dtype (float32 or float64; both exact unless the scale underflows).
    Returns:
        ``[..., K]`` tensor in ``dtype``.
    Raises:
        InputError: dtypes or shapes that do not match, or ``dtype`` not a float dtype.
    """
    _check_tensor(q, "q", dtypes=(torch.float8_e4m3fn,), min_ndim=1, contiguous=False)
    _check_out_dtype(dtype)
    sf = _scale_bytes(sf, "sf")
    _check_scale_shape(q.shape, sf, "sf", 1)
    block = q.shape[-1] // sf.shape[-1]
    v = _blocks(decode_e4m3(q, dtype), block) * decode_ue8m0(sf, dtype).unsqueeze(-1)
    return v.reshape(q.shape)


def quantize_e2m1_blocks(x: torch.Tensor, block: int = BLOCK_K,
                         rounding: str = "deepgemm") -> tuple[torch.Tensor, torch.Tensor]:
    """Per-``block`` FP4 E2M1 quantization along the last dim (MXFP4 checkpoints).

    Recipe (DeepGEMM ``per_token_cast_to_fp4(use_ue8m0=True, gran_k=32)``, commit 891d57b):
    ``amax = max(|x|, 1e-4)``, ``sf = ue8m0_ceil(amax / 6)`` clamped to [1, 254],
    ``code = encode_e2m1(x * fp32(1 / sf), rounding)``, packed low nibble first.

    Args:
        x: float tensor ``[..., K]``, K a multiple of ``block``.
        block: elements per scale (32).
        rounding: see :func:`encode_e2m1` (``"deepgemm"`` default, or ``"rne"``).
    Returns:
        ``(packed, sf)``: ``uint8 [..., K/2]`` and UE8M0 ``uint8 [..., K/block]``.
    Raises:
        InputError: bad dtype, ``block`` not a positive ``int``, K not a multiple of ``block``,
            unknown rounding.
    """
    scaled, sf = _scaled_blocks(x, block, E2M1_MAX)
    return pack_e2m1(encode_e2m1(scaled, rounding).reshape(x.shape)), sf


def dequantize_e2m1_blocks(packed: torch.Tensor, sf: torch.Tensor,
                           dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Decode packed E2M1 ``uint8 [..., K/2]`` with UE8M0 ``uint8 [..., K/32]`` (or packed
    ``int32 [..., K/128]``) to ``[..., K]`` in ``dtype``.

    Raises:
        InputError: dtypes or shapes that do not match, or ``dtype`` not a float dtype.
    """
    _check_tensor(packed, "packed", dtypes=(torch.uint8, torch.int8), min_ndim=1,
                  contiguous=False)
    _check_out_dtype(dtype)
    sf = _scale_bytes(sf, "sf")
    k = packed.shape[-1] * 2
    _check_scale_shape((*packed.shape[:-1], k), sf, "sf", 1)
    block = k // sf.shape[-1]
    v = decode_e2m1(unpack_e2m1(packed), dtype)
    v = _blocks(v, block) * decode_ue8m0(sf, dtype).unsqueeze(-1)
    return v.reshape(*packed.shape[:-1], k)


def _scale_bytes(sf: torch.Tensor, name: str) -> torch.Tensor:
    _check_tensor(sf, name, dtypes=(torch.uint8, torch.int32), min_ndim=1, contiguous=False)
    return unpack_ue8m0(sf) if sf.dtype == torch.int32 else sf


def _check_scale_shape(shape, sf: torch.Tensor, name: str, unused: int) -> None:
    k = shape[-1]
    if tuple(sf.shape[:-1]) != tuple(shape[:-1]) or sf.shape[-1] == 0 \
            or k % sf.shape[-1] != 0 or (k // sf.shape[-1]) % BLOCK_K != 0:
        raise InputError(name, f"scales of shape {(*tuple(shape[:-1]), k // BLOCK_K)} "
                         f"(one UE8M0 per {BLOCK_K} elements)", f"shape {tuple(sf.shape)}")


# ----------------------------------------------------------------------------- epilogue

def round_to_bf16(x: torch.Tensor) -> torch.Tensor:
    """Round FP32 to BF16 (nearest-even, ``__float22bfloat162_rn``) and back to FP32."""
    return x.to(torch.bfloat16).to(torch.float32)


def _f32_from_bits(bits: torch.Tensor) -> torch.Tensor:
    """float32 tensor whose bit patterns are the low 32 bits of int64 ``bits``."""
    b = bits & 0xFFFFFFFF
    b = torch.where(b >= 2 ** 31, b - 2 ** 32, b)
    return b.to(torch.int32).view(torch.float32)


def quantize_e4m3_epilogue(v: torch.Tensor, block: int = BLOCK_K) -> tuple[torch.Tensor, torch.Tensor]:
    """The L1 epilogue's per-32 re-quantization of FP32 SwiGLU outputs, bit-exact.

    ``amax`` per block of 32 along the last dim (NaN propagates); ``scaled = amax *
    fp32(1/448)``; ``e = fast_log2_ceil(scaled)`` (no clamp); ``sf_inv = fast_pow2(-e)``;
    ``q = satfinite_e4m3(v * sf_inv)``; stored UE8M0 byte ``= (bits(fast_pow2(e)) >> 23) &
    0xFF``.  Source: ``get_e4m3_sf_and_sf_inv`` in ``deep_gemm/include/deep_gemm/common/
    math.cuh`` and the Linear1 branch of ``sm100_fp8_fp4_mega_moe.cuh`` (commit 891d57b).
    Differs from :func:`quantize_e4m3_blocks` (no 1e-4 floor, multiply by fp32(1/448)
    instead of dividing by 448, no [1, 254] clamp).

    Args:
        v: ``float32 [..., N]``, N a multiple of ``block``.
    Returns:
        ``(q, sf)``: ``float8_e4m3fn [..., N]``, ``uint8 [..., N/block]``.
    Raises:
        InputError: bad dtype, ``block`` not a positive ``int``, or N not a multiple of ``block``.
    """
    _check_tensor(v, "v", dtypes=(torch.float32,), min_ndim=1, contiguous=False)
    _check_block(block)
    _check_last_dim_multiple(v, "v", block)
    vb = _blocks(v, block)
    amax = vb.abs().amax(dim=-1)
    scaled = amax * torch.tensor(_FP32_INV_448, dtype=torch.float32, device=v.device)
    bits = scaled.contiguous().view(torch.int32).long() & 0xFFFFFFFF
    e = (bits >> 23) - 127 + ((bits & 0x7FFFFF) != 0).long()
    sf_bits = (e + 127) << 23
    sf_inv = _f32_from_bits((127 - e) << 23)
    stored = ((sf_bits & 0xFFFFFFFF) >> 23) & 0xFF
    q = cast_to_e4m3(vb * sf_inv.unsqueeze(-1)).reshape(v.shape)
    return q, stored.to(torch.uint8)
