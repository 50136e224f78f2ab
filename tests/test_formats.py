"""megamoe.formats against independent tables and implementations written here (numpy)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from megamoe import formats as F
from megamoe.errors import InputError


# ----------------------------------------------------------------- independent tables

def e2m1_value(code: int) -> float:
    """E2M1 by its definition: sign bit 3, exponent bits 2-1 (bias 1), mantissa bit 0."""
    s, e, m = code >> 3, (code >> 1) & 3, code & 1
    mag = m * 0.5 if e == 0 else 2.0 ** (e - 1) * (1 + m / 2)
    return -mag if s else mag


def e4m3_value(byte: int) -> float:
    """E4M3 (fn) by its definition: bias 7, subnormals, S.1111.111 is NaN, no Inf."""
    s, e, m = byte >> 7, (byte >> 3) & 15, byte & 7
    if e == 15 and m == 7:
        return math.nan
    mag = 2.0 ** -6 * (m / 8) if e == 0 else 2.0 ** (e - 7) * (1 + m / 8)
    return -mag if s else mag


E4M3 = np.array([e4m3_value(b) for b in range(256)])
FINITE = [b for b in range(256) if not math.isnan(E4M3[b])]


def e4m3_rne(x: np.ndarray) -> np.ndarray:
    """Saturating RNE to E4M3 by brute force over the table: nearest value, ties -> even byte."""
    out = np.empty(x.shape, dtype=np.uint8)
    vals = np.array([E4M3[b] for b in FINITE])
    codes = np.array(FINITE)
    for i, v in enumerate(x.reshape(-1)):
        if math.isnan(v):
            out.reshape(-1)[i] = 0x7F
            continue
        v = min(max(v, -448.0), 448.0)
        d = np.abs(vals - v)
        best = np.flatnonzero(d == d.min())
        cands = codes[best]
        if len(set(E4M3[c] for c in cands)) > 1:  # a true tie between two values
            cands = [c for c in cands if c % 2 == 0]
        # +0 / -0 both match 0: keep the sign of v
        c = [c for c in cands if (c >= 128) == (math.copysign(1, v) < 0)] or list(cands)
        out.reshape(-1)[i] = c[0]
    return out


def ceil_pow2_exp(x: float) -> int:
    """Smallest e with 2**e >= x (x > 0), by frexp."""
    m, e = math.frexp(x)  # x = m * 2**e, 0.5 <= m < 1
    return e - 1 if m == 0.5 else e


# ----------------------------------------------------------------- E2M1

def test_every_e2m1_code_point():
    codes = torch.arange(16, dtype=torch.uint8)
    want = torch.tensor([e2m1_value(c) for c in range(16)])
    assert torch.equal(F.decode_e2m1(codes), want)
    assert torch.equal(F.e2m1_table(), want)
    # sign of -0 kept by the table
    assert math.copysign(1, F.decode_e2m1(torch.tensor([8], dtype=torch.uint8)).item()) < 0
    # re-encoding into E4M3 is exact for every code (both nibble positions)
    packed = F.pack_e2m1(torch.cat([codes, codes.flip(0)]).reshape(1, 32))
    dec = F.e2m1_to_e4m3(packed).float().reshape(-1)
    assert torch.equal(dec, torch.cat([want, want.flip(0)]))
    # encode(decode(c)) == c except -0 -> +0
    for rounding in ("deepgemm", "rne"):
        back = F.encode_e2m1(want, rounding)
        assert back.tolist() == [c if c != 8 else 0 for c in range(16)]


def _e2m1_round_indep(v: float, rounding: str) -> int:
    mags = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    a = min(abs(v), 6.0)
    d = [abs(a - m) for m in mags]
    best = [i for i, x in enumerate(d) if x == min(d)]
    if len(best) == 1:
        i = best[0]
    else:  # tie between two neighbours
        i = best[0] if rounding == "deepgemm" else [b for b in best if b % 2 == 0][0]
    return i | (8 if (v < 0 and i != 0) else 0)


@pytest.mark.parametrize("rounding", ["deepgemm", "rne"])
def test_encode_e2m1_midpoints_and_sweep(rounding):
    mids = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    xs = mids + [-m for m in mids] + list(np.linspace(-8, 8, 4001)) + [6.5, -100.0, 1e-9, -1e-9]
    x = torch.tensor(xs, dtype=torch.float32)
    got = F.encode_e2m1(x, rounding).tolist()
    want = [_e2m1_round_indep(float(v), rounding) for v in x.tolist()]
    assert got == want
    if rounding == "deepgemm":
        assert F.encode_e2m1(torch.tensor([0.75, 5.0]), rounding).tolist() == [1, 6]
    else:
        assert F.encode_e2m1(torch.tensor([0.75, 5.0]), rounding).tolist() == [2, 6]


def test_pack_e2m1_low_nibble_first_and_round_trip():
    c = torch.tensor([[1, 2, 15, 0]], dtype=torch.uint8)
    assert F.pack_e2m1(c).tolist() == [[0x21, 0x0F]]
    rnd = torch.randint(0, 16, (3, 5, 64), dtype=torch.uint8)
    assert torch.equal(F.unpack_e2m1(F.pack_e2m1(rnd)), rnd)
    if F.HAS_TORCH_FP4:  # same bytes can be typed as torch's packed fp4 dtype
        assert F.pack_e2m1(rnd).view(torch.float4_e2m1fn_x2).shape == (3, 5, 32)


# ----------------------------------------------------------------- E4M3

def test_e4m3_decode_all_bytes():
    got = F.decode_e4m3(torch.arange(256, dtype=torch.int32).to(torch.uint8), torch.float64)
    want = torch.tensor(E4M3)
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    ok = ~torch.isnan(want)
    assert torch.equal(got[ok], want[ok])


def test_e4m3_cast_sweep_against_table():
    finite = np.array([E4M3[b] for b in FINITE])
    pos = np.unique(finite[finite > 0])
    mids = (pos[1:] + pos[:-1]) / 2  # every tie
    rng = np.random.default_rng(0)
    sweep = np.concatenate([
        pos, -pos, mids, -mids, mids * (1 + 2 ** -20), mids * (1 - 2 ** -20),
        [0.0, -0.0, 2.0 ** -10, 2.0 ** -10 * 1.001, 448.0, 460.0, 464.0, 470.0, 1e6, -1e6,
         math.inf, -math.inf, math.nan],
        rng.standard_normal(2000) * 10.0 ** rng.uniform(-4, 3, 2000),
    ]).astype(np.float32)
    got = F.cast_to_e4m3(torch.from_numpy(sweep)).view(torch.uint8).numpy()
    want = e4m3_rne(sweep.astype(np.float64))
    assert (got == want).all(), sweep[got != want][:10]


# ----------------------------------------------------------------- UE8M0

def test_ue8m0_rounding_at_and_above_powers_of_two():
    ks = np.arange(-126, 128)
    exact = np.ldexp(np.float32(1), ks).astype(np.float32)
    above = np.nextafter(exact, np.float32(np.inf), dtype=np.float32)
    got_exact = F.ue8m0_ceil(torch.from_numpy(exact)).numpy().astype(int)
    got_above = F.ue8m0_ceil(torch.from_numpy(above)).numpy().astype(int)
    assert (got_exact == ks + 127).all()
    assert (got_above == np.minimum(ks + 128, 254)).all()
    # a value between powers rounds up
    assert F.ue8m0_ceil(torch.tensor([3.0, 0.75, 1.5])).tolist() == [129, 127, 128]
    # clamp range [1, 254] (DeepGEMM ceil_to_ue8m0) vs raw kernel bytes
    z = torch.tensor([0.0, 1e-45, math.inf])
    assert F.ue8m0_ceil(z).tolist() == [1, 1, 254]
    assert F.ue8m0_ceil(z, clamp=False).tolist() == [0, 1, 255]


def test_ue8m0_decode_all_bytes():
    b = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    got = F.decode_ue8m0(b, torch.float64)
    assert math.isnan(got[255].item())
    assert torch.equal(got[:255], torch.tensor([2.0 ** (i - 127) for i in range(255)],
                                                dtype=torch.float64))


def test_pack_ue8m0_byte_order_and_round_trip():
    b = torch.tensor([[1, 2, 3, 255, 127, 0, 0, 128]], dtype=torch.uint8)
    words = F.pack_ue8m0(b)
    assert words.dtype == torch.int32 and words.shape == (1, 2)
    w0 = 1 | 2 << 8 | 3 << 16 | 255 << 24
    assert words[0, 0].item() == w0 - 2 ** 32
    assert words[0, 1].item() == (127 | 128 << 24) - 2 ** 32
    rnd = torch.randint(0, 256, (4, 3, 16), dtype=torch.int32).to(torch.uint8)
    assert torch.equal(F.unpack_ue8m0(F.pack_ue8m0(rnd)), rnd)
    if np.little_endian:
        assert torch.equal(F.pack_ue8m0(rnd), rnd.view(torch.int32))


# ----------------------------------------------------------------- block quantizers

def indep_quant_e4m3(x: np.ndarray):
    """DeepGEMM per_token_cast_to_fp8(use_ue8m0, gran_k=32) re-derived in numpy float32."""
    xb = x.astype(np.float32).reshape(x.shape[0], -1, 32)
    amax = np.maximum(np.abs(xb).max(-1), np.float32(1e-4))
    sf_bytes = np.zeros(amax.shape, dtype=np.uint8)
    q = np.zeros(xb.shape, dtype=np.uint8)
    for idx in np.ndindex(amax.shape):
        r = np.float32(amax[idx]) / np.float32(448.0)
        e = min(max(ceil_pow2_exp(float(r)), -126), 127)
        sf_bytes[idx] = e + 127
        inv = np.float32(2.0 ** -e)
        q[idx] = e4m3_rne((xb[idx] * inv).astype(np.float64))
    return q.reshape(x.shape), sf_bytes


def _nasty(shape, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp(torch.randn(shape, generator=g) * 3)
    x[0, :32] = 0.0                      # all-zero block
    x[1, 5] = 3000.0                     # outlier
    x[2, 40:72] = 2.0 ** -20             # tiny block
    return x


def test_quantize_e4m3_blocks_bit_exact():
    x = _nasty((4, 128), 1).to(torch.bfloat16).float()
    q, sf = F.quantize_e4m3_blocks(x)
    wq, wsf = indep_quant_e4m3(x.numpy())
    assert (q.view(torch.uint8).numpy() == wq).all()
    assert (sf.numpy() == wsf).all()
    # requantizing the dequantized values with the same scales reproduces the codes
    deq = F.dequantize_e4m3_blocks(q, sf)
    inv = (1.0 / F.decode_ue8m0(sf)).repeat_interleave(32, dim=1)
    assert torch.equal(F.cast_to_e4m3(deq * inv).view(torch.uint8), q.view(torch.uint8))
    # and a block whose amax is not on a power-of-two boundary gets the same scale back
    _, sf2 = F.quantize_e4m3_blocks(deq)
    assert ((sf2 == sf) | (sf2 == sf - 1) | (sf == 1)).all()
    # packed scales are accepted too
    assert torch.equal(F.dequantize_e4m3_blocks(q, F.pack_ue8m0(sf)), F.dequantize_e4m3_blocks(q, sf))


@pytest.mark.parametrize("rounding", ["deepgemm", "rne"])
def test_quantize_e2m1_blocks_bit_exact(rounding):
    x = _nasty((3, 64), 2)
    packed, sf = F.quantize_e2m1_blocks(x, rounding=rounding)
    xb = x.numpy().astype(np.float32).reshape(3, -1, 32)
    amax = np.maximum(np.abs(xb).max(-1), np.float32(1e-4))
    for idx in np.ndindex(amax.shape):
        e = min(max(ceil_pow2_exp(float(np.float32(amax[idx]) / np.float32(6.0))), -126), 127)
        assert sf.numpy()[idx] == e + 127
        want = [_e2m1_round_indep(float(v), rounding) for v in (xb[idx] * np.float32(2.0 ** -e))]
        got = F.unpack_e2m1(packed).reshape(3, -1, 32)[idx].tolist()
        assert got == want
    # dequantize: exact products of table values and scales
    deq = F.dequantize_e2m1_blocks(packed, sf, torch.float64)
    codes = F.unpack_e2m1(packed).numpy()
    want = np.vectorize(e2m1_value)(codes).reshape(3, -1, 32) * \
        np.exp2(sf.numpy().astype(np.float64) - 127)[..., None]
    assert np.array_equal(deq.numpy().reshape(3, -1, 32), want)
    # round trip error bound: at most half a step of the largest E2M1 gap (1.0 * scale)
    step = torch.from_numpy(np.exp2(sf.numpy().astype(np.float64) - 127)).repeat_interleave(32, 1)
    assert ((deq - x.double()).abs() <= step + 1e-30).all()


def test_quantize_e4m3_epilogue_bit_exact():
    g = torch.Generator().manual_seed(3)
    v = torch.randn((6, 96), generator=g) * torch.tensor([1e-3, 1.0, 300.0, 1e5, 1.0, 1.0]).unsqueeze(1)
    v[4, :32] = 0.0
    v[5, 32:64] = -0.0
    v[5, 0] = 448.0 * 2.0 ** 3  # amax*1/448 lands on a power of two
    q, sf = F.quantize_e4m3_epilogue(v)
    inv448 = np.float32(1.0) / np.float32(448.0)
    vb = v.numpy().reshape(6, -1, 32)
    for idx in np.ndindex(vb.shape[:2]):
        amax = np.float32(np.abs(vb[idx]).max())
        scaled = np.float32(amax * inv448)
        if scaled == 0:
            assert sf[idx].item() == 0
            assert (q.view(torch.uint8).reshape(6, -1, 32)[idx].numpy() & 0x7F == 0).all()
            continue
        e = ceil_pow2_exp(float(scaled))
        assert sf[idx].item() == e + 127
        want = e4m3_rne((vb[idx] * np.float32(2.0 ** -e)).astype(np.float64))
        assert (q.view(torch.uint8).reshape(6, -1, 32)[idx].numpy() == want).all()


def test_bf16_rounding_is_nearest_even():
    one = 1.0
    ulp = 2.0 ** -7
    x = torch.tensor([one + ulp / 2, one + 3 * ulp / 2, one + ulp / 2 + 2 ** -20])
    assert F.round_to_bf16(x).tolist() == [one, one + 2 * ulp, one + ulp]


# ----------------------------------------------------------------- bad input

def test_bad_inputs_name_the_tensor():
    with pytest.raises(InputError, match=r"^x: expected last dimension a multiple of 32"):
        F.quantize_e4m3_blocks(torch.zeros(2, 48))
    with pytest.raises(InputError, match=r"^x: expected dtype"):
        F.quantize_e2m1_blocks(torch.zeros(2, 64, dtype=torch.int32))
    with pytest.raises(InputError, match=r"^sf: expected last dimension a multiple of 4"):
        F.pack_ue8m0(torch.zeros(2, 6, dtype=torch.uint8))
    with pytest.raises(InputError, match=r"^codes: expected dtype torch.uint8"):
        F.decode_e2m1(torch.zeros(3))
    with pytest.raises(InputError, match=r"^sf: expected scales of shape"):
        F.dequantize_e4m3_blocks(torch.zeros(2, 64).to(torch.float8_e4m3fn),
                                 torch.zeros(2, 3, dtype=torch.uint8))
    with pytest.raises(InputError, match=r"^rounding:"):
        F.encode_e2m1(torch.zeros(2), "up")
    assert issubclass(InputError, ValueError)


@pytest.mark.parametrize("block, got", [(0, "0"), (-32, "-32"), (2.5, r"2\.5"), (32.0, r"32\.0"), (True, "True"),
                                        ("32", "'32'"), (None, "None")])
@pytest.mark.parametrize("fn", ["quantize_e4m3_blocks", "quantize_e2m1_blocks", "quantize_e4m3_epilogue"])
def test_block_must_be_a_positive_int(fn, block, got):
    """block=0 was a ZeroDivisionError, block=-32 a torch RuntimeError, 32.0 a float reshape."""
    with pytest.raises(InputError, match=r"^block: expected a positive integer \(elements per scale, 32 in the "
                                         rf"MegaMoE recipe\), got {got}$"):
        getattr(F, fn)(torch.randn(2, 64), block=block)


def test_block_other_than_32_still_works():
    q, sf = F.quantize_e4m3_blocks(torch.randn(2, 64), block=16)
    assert q.shape == (2, 64) and sf.shape == (2, 4)


def test_e2m1_codes_above_15_are_refused():
    """pack_e2m1 used to mask 200 to code 8 (-0.0); decode_e2m1 ignored the high bits."""
    bad = torch.tensor([1, 2, 200, 3], dtype=torch.uint8)
    with pytest.raises(InputError, match=r"^codes: expected E2M1 codes 0\.\.15 \(one per uint8\), "
                                         r"got a code 200 at index \(2,\)$"):
        F.pack_e2m1(bad)
    with pytest.raises(InputError, match=r"^codes: expected E2M1 codes 0\.\.15 \(one per uint8\), got a code 16"):
        F.decode_e2m1(torch.tensor([[0, 16]], dtype=torch.uint8))
    ok = torch.arange(16, dtype=torch.uint8)
    assert torch.equal(F.unpack_e2m1(F.pack_e2m1(ok)), ok)
    assert F.pack_e2m1(torch.zeros(0, dtype=torch.uint8)).shape == (0,)


@pytest.mark.parametrize("call", [
    lambda d: F.decode_e4m3(torch.zeros(4, dtype=torch.uint8), d),
    lambda d: F.decode_e2m1(torch.zeros(4, dtype=torch.uint8), d),
    lambda d: F.decode_ue8m0(torch.zeros(4, dtype=torch.uint8), d),
    lambda d: F.e2m1_table(dtype=d),
    lambda d: F.dequantize_e4m3_blocks(*F.quantize_e4m3_blocks(torch.randn(1, 32)), d),
    lambda d: F.dequantize_e2m1_blocks(*F.quantize_e2m1_blocks(torch.randn(1, 32)), d),
])
def test_output_dtype_must_be_float(call):
    with pytest.raises(InputError, match=r"^dtype: expected torch\.float32, torch\.float64, torch\.bfloat16 or "
                                         r"torch\.float16, got torch\.int32$"):
        call(torch.int32)
    with pytest.raises(InputError, match=r"^dtype: expected .*got 'float32'$"):
        call("float32")


def test_ue8m0_ceil_clamp_must_be_bool():
    with pytest.raises(InputError, match=r"^clamp: expected True or False, got 'no'$"):
        F.ue8m0_ceil(torch.ones(2), clamp="no")
