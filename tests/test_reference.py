"""megamoe.reference against an independent numpy / float64 re-implementation written here."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from megamoe import reference as R
from megamoe.errors import InputError
from megamoe.formats import pack_ue8m0, unpack_ue8m0

E, H, I, T, K = 4, 256, 128, 10, 3
CLAMP = 10.0

# ----------------------------------------------------------------- independent numerics

E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                 -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def _e4m3_pos_table() -> np.ndarray:
    """Positive E4M3 values by byte 0..126 (monotonic in the byte)."""
    out = []
    for b in range(127):
        e, m = b >> 3, b & 7
        out.append(2.0 ** -6 * m / 8 if e == 0 else 2.0 ** (e - 7) * (1 + m / 8))
    return np.array(out)


POS = _e4m3_pos_table()


def np_e4m3(v: np.ndarray) -> np.ndarray:
    """Saturating RNE to E4M3, returned as float64 values (NaN stays NaN)."""
    a = np.minimum(np.abs(v), 448.0)
    i = np.clip(np.searchsorted(POS, a), 1, 126)
    lo, hi = POS[i - 1], POS[i]
    pick_hi = (a - lo > hi - a) | ((a - lo == hi - a) & (i % 2 == 0))
    mag = np.where(pick_hi, hi, lo)
    mag = np.where(a <= 0, 0.0, mag)
    out = np.copysign(mag, v)
    return np.where(np.isnan(v), np.nan, out)


def np_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 (nearest-even) -> float32, by integer rounding of the bit pattern."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    out = (r & 0xFFFFFFFF).astype(np.uint32).view(np.float32)
    return np.where(np.isnan(x), np.float32(np.nan), out)


def dec_w(packed: np.ndarray, sf: np.ndarray):
    """(unscaled values [N, K], scales [N, K/32]) of packed E2M1 + UE8M0 bytes."""
    lo, hi = packed & 15, packed >> 4
    codes = np.stack([lo, hi], -1).reshape(packed.shape[0], -1)
    return E2M1[codes], np.exp2(sf.astype(np.float64) - 127)


def gemm(av, asc, wv, wsc, group=32):
    """FP32 accumulation of exactly formed, scaled per-group partial sums, in K order."""
    m, k = av.shape
    acc = None
    for g in range(k // group):
        sl = slice(g * group, (g + 1) * group)
        p = av[:, sl] @ wv[:, sl].T
        p = (p * asc[:, g][:, None] * wsc[:, g][None, :]).astype(np.float32)
        acc = p if acc is None else (acc + p).astype(np.float32)
    return acc


def requant(h: np.ndarray):
    """Per-32 amax -> power-of-two scale (amax * fp32(1/448), rounded up) -> E4M3."""
    hb = h.reshape(h.shape[0], -1, 32)
    amax = np.abs(hb).max(-1)
    scaled = (amax * np.float32(np.float32(1) / np.float32(448))).astype(np.float32)
    e = np.zeros(scaled.shape)
    for idx in np.ndindex(scaled.shape):
        s = float(scaled[idx])
        mant, ex = math.frexp(s)
        e[idx] = -127 if s == 0 else (ex - 1 if mant == 0.5 else ex)
    sf_inv = np.exp2(-e).astype(np.float32)
    q = np_e4m3((hb * sf_inv[..., None]).astype(np.float32).astype(np.float64))
    # the stored UE8M0 is 2^e (byte 0 when the block is all zero)
    return q.reshape(h.shape), np.exp2(e)


def independent_quantized(xq, xsf_bytes, idx, wts, w1, s1, w2, s2, clamp):
    """The kernel numerics of the reference design, re-derived in numpy."""
    xv = np.asarray(xq, dtype=np.float64)
    xs = np.exp2(xsf_bytes.astype(np.float64) - 127)
    t, k = idx.shape
    ys = np.zeros((t, k, H), dtype=np.float32)
    for tok in range(t):
        for s in range(k):
            e = idx[tok, s]
            if e < 0:
                continue
            a, asc = xv[tok:tok + 1], xs[tok:tok + 1]
            acc = gemm(a, asc, *dec_w(w1[e], s1[e]))
            g, u = np_bf16(acc[:, :I]), np_bf16(acc[:, I:])
            if clamp is not None:
                g = np.fmin(g, np.float32(clamp))
                u = np.fmin(np.fmax(u, np.float32(-clamp)), np.float32(clamp))
            ex = np.exp(-g.astype(np.float64)).astype(np.float32)
            silu = (g / (np.float32(1) + ex)).astype(np.float32)
            hh = ((silu * u).astype(np.float32) * np.float32(wts[tok, s])).astype(np.float32)
            q, qs = requant(hh)
            out = gemm(q, qs, *dec_w(w2[e], s2[e]))
            ys[tok, s] = np_bf16(out)[0]
    y = np.zeros((t, H), dtype=np.float32)
    for s in range(k):
        y = np.where((idx[:, s] >= 0)[:, None], (y + ys[:, s]).astype(np.float32), y)
    return np_bf16(y)


def independent_exact(xq, xsf_bytes, idx, wts, w1, s1, w2, s2, clamp):
    x = np.asarray(xq, dtype=np.float64) * np.repeat(np.exp2(xsf_bytes - 127.0), 32, axis=1)
    y = np.zeros((idx.shape[0], H))
    for tok in range(idx.shape[0]):
        for s in range(idx.shape[1]):
            e = idx[tok, s]
            if e < 0:
                continue
            v1, c1 = dec_w(w1[e], s1[e])
            v2, c2 = dec_w(w2[e], s2[e])
            gu = (np.repeat(c1, 32, 1) * v1) @ x[tok]
            g, u = gu[:I], gu[I:]
            if clamp is not None:
                g, u = np.minimum(g, clamp), np.clip(u, -clamp, clamp)
            hh = g / (1 + np.exp(-g)) * u * wts[tok, s]
            y[tok] += (np.repeat(c2, 32, 1) * v2) @ hh
    return y


# ----------------------------------------------------------------- fixtures

def make_case(seed=0, t=T, outlier=False):
    g = torch.Generator().manual_seed(seed)
    l1 = torch.randn((E, 2 * I, H), generator=g) / math.sqrt(H) * 4
    l2 = torch.randn((E, H, I), generator=g) / math.sqrt(I)
    (w1, s1), (w2, s2) = R.quantize_weights(l1, l2)
    x = torch.randn((t, H), generator=g)
    if outlier:
        x[:, 7] *= 100.0
    scores = torch.randn((t, E), generator=g)
    wts, idx = torch.topk(scores.softmax(-1), K, dim=-1)
    idx = idx.clone()
    if t > 2:
        idx[1, 2] = -1
        idx[2, 0] = -1
    xq, xsf, idx, wts = R.mega_moe_pre_dispatch(x.to(torch.bfloat16), idx, wts)
    return dict(x=xq, x_sf=xsf, topk_idx=idx, topk_weights=wts, w=((w1, s1), (w2, s2)))


def run_q(c, **kw):
    return R.moe_reference_quantized(c["x"], c["x_sf"], c["topk_idx"], c["topk_weights"],
                                     *c["w"], **kw)


def to_np(c):
    (w1, s1), (w2, s2) = c["w"]
    xq = c["x"].float().numpy()
    xsb = unpack_ue8m0(c["x_sf"]).numpy()
    return (xq, xsb, c["topk_idx"].numpy(), c["topk_weights"].numpy(),
            w1.numpy(), s1.numpy(), w2.numpy(), s2.numpy())


# ----------------------------------------------------------------- tests

@pytest.mark.parametrize("clamp", [CLAMP, None])
def test_quantized_matches_independent_reimplementation(clamp):
    c = make_case(seed=1)
    got = run_q(c, activation_clamp=clamp).float().numpy().astype(np.float64)
    want = independent_quantized(*to_np(c), clamp).astype(np.float64)
    rel = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert rel <= 1e-3
    assert (got == want).mean() >= 0.99  # in practice bit-exact


def test_exact_matches_independent_float64():
    c = make_case(seed=2, outlier=True)
    got = R.moe_reference(c["x"], c["x_sf"], c["topk_idx"], c["topk_weights"], *c["w"],
                          activation_clamp=CLAMP).numpy()
    want = independent_exact(*to_np(c), CLAMP)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) <= 1e-12
    # the quantized path is a few percent away (FP8 intermediates), not more
    q = run_q(c, activation_clamp=CLAMP).double().numpy()
    assert np.linalg.norm(q - want) / np.linalg.norm(want) < 0.06


def test_block_scaled_gemm_fold_matches_independent():
    g = torch.Generator().manual_seed(5)
    k = 256
    # per-32 scales that differ a lot inside a 128 group, so folding loses bits
    a = torch.randn((3, k), generator=g) * torch.exp2(torch.arange(k) // 32 * -3.0)
    from megamoe.formats import quantize_e4m3_blocks, decode_e4m3, decode_ue8m0
    q, qs = quantize_e4m3_blocks(a)
    w = torch.randn((40, k), generator=g) * torch.exp2(torch.arange(k).flip(0) // 32 * -2.0)
    from megamoe.formats import quantize_e2m1_blocks
    wp, ws = quantize_e2m1_blocks(w.reshape(1, 40, k))
    av, asc = decode_e4m3(q, torch.float64), decode_ue8m0(qs, torch.float64)
    got = R.block_scaled_gemm(av, asc, wp[0], ws[0], R.Numerics.sm90(128)).numpy()
    wv, wsc = dec_w(wp[0].numpy(), ws[0].numpy())

    def fold(v, s):
        s4 = s.reshape(s.shape[0], -1, 4)
        smax = s4.max(-1)
        f = np_e4m3(v.reshape(v.shape[0], -1, 4, 32) * (s4 / smax[..., None])[..., None])
        return f.reshape(v.shape), smax

    fa, fas = fold(av.numpy(), asc.numpy())
    fw, fws = fold(wv, wsc)
    want = gemm(fa, fas, fw, fws, group=128)
    assert np.array_equal(got, want)
    unfolded = R.block_scaled_gemm(av, asc, wp[0], ws[0], R.Numerics.sm100()).numpy()
    assert not np.array_equal(got, unfolded)  # the fold really changes the numbers here
    assert np.array_equal(unfolded, gemm(av.numpy(), asc.numpy(), wv, wsc))


ROW_FOLD = R.Numerics("sm90", "row", None, w_fold_top=6)  # the SM90 kernel's weight fold alone


def test_block_scaled_gemm_row_fold_matches_independent():
    """The SM90 kernel's weight fold alone (``Numerics("sm90", "row", None, w_fold_top=6)``: per
    row, values x 2^(s - s_max + 6) rounded to E4M3, 2^(s_max - 6) on each 32-wide partial, s_max
    over the groups with a nonzero value) against numpy: bitwise the per-32 result when the row's
    nonzero groups span <= 14 binades, rounded small groups (and different numbers) when they
    span more."""
    g = torch.Generator().manual_seed(6)
    k = 256
    import megamoe.formats as F
    q, qs = F.quantize_e4m3_blocks(torch.randn((3, k), generator=g))
    av, asc = F.decode_e4m3(q, torch.float64), F.decode_ue8m0(qs, torch.float64)
    for spread, exact in ((-1.0, True), (-1.5, True), (-3.0, False)):  # 8 groups: ~7, ~11, ~21 binades
        w = torch.randn((40, k), generator=g) * torch.exp2(torch.arange(k) // 32 * spread)
        wp, ws = F.quantize_e2m1_blocks(w.reshape(1, 40, k))
        wp, ws = wp[0].clone(), ws[0].clone()
        wp[5, 16:32] = 0                          # row 5, group 1 all zero, with the largest scale:
        ws[5, 1] = 200                            # it must not set s_max
        got = R.block_scaled_gemm(av, asc, wp, ws, ROW_FOLD).numpy()
        wv, wsc = dec_w(wp.numpy(), ws.numpy())
        g32 = wv.reshape(40, -1, 32)
        smax = np.where((g32 != 0).any(-1), wsc, 0).max(-1, keepdims=True)
        d = np.log2(smax / wsc)[(g32 != 0).any(-1)]
        assert (d.max() <= 14) == exact  # the case is what it says
        fw = np_e4m3(g32 * (wsc / smax * 64.0)[..., None]).reshape(wv.shape)
        want = gemm(av.numpy(), asc.numpy(), fw, np.broadcast_to(smax / 64.0, wsc.shape))
        assert np.array_equal(got, want)
        per32 = R.block_scaled_gemm(av, asc, wp, ws, R.Numerics.sm90()).numpy()
        assert np.array_equal(got, per32) == exact, spread


def test_block_scaled_gemm_kernel_numerics_match_independent():
    """Numerics.sm90_kernel(): the weight fold per row (top 6) and the activation fold per 64-K
    group (``x_fold_k = 64``: in each pair of 32-groups, those with a nonzero value re-encoded
    with the larger scale, an all-zero group never setting it), 64-deep partial sums formed
    exactly, times the activation group's scale and the weight row's, rounded to FP32 and summed
    in FP32 in K order -- against numpy. Activations: a pair 10 binades apart, a pair 30 apart
    (the small group's values vanish), an all-zero group carrying the largest scale byte."""
    g = torch.Generator().manual_seed(8)
    k = 256
    import megamoe.formats as F
    q, qs = F.quantize_e4m3_blocks(torch.randn((3, k), generator=g))
    q, qs = q.view(torch.uint8).clone(), qs.clone()
    qs[0, 1] -= 10                         # row 0: pair 0 ten binades apart (values < 16 round)
    qs[1, 3] -= 30                         # row 1: pair 1 thirty binades apart
    q[2, 64:96] = 0                        # row 2: group 2 all zero ...
    qs[2, 2] = 250                         # ... with the largest scale: it must not set s_max
    av, asc = F.decode_e4m3(q, torch.float64), F.decode_ue8m0(qs, torch.float64)
    w = torch.randn((40, k), generator=g) * torch.exp2(torch.arange(k) // 32 * -1.0)
    wp, ws = F.quantize_e2m1_blocks(w.reshape(1, 40, k))
    got = R.block_scaled_gemm(av, asc, wp[0], ws[0], R.Numerics.sm90_kernel()).numpy()
    # numpy: fold the activations per 64, the weights per row (top 6), 64-wide groups
    a64, s64 = av.numpy().reshape(3, -1, 2, 32), asc.numpy().reshape(3, -1, 2)
    nz = (a64 != 0).any(-1)
    smax = np.where(nz, s64, 0).max(-1)
    smax = np.where(nz.any(-1), smax, 1.0)
    fa = np_e4m3(a64 * (s64 / smax[..., None])[..., None]).reshape(3, k)
    wv, wsc = dec_w(wp[0].numpy(), ws[0].numpy())
    g32 = wv.reshape(40, -1, 32)
    wmax = np.where((g32 != 0).any(-1), wsc, 0).max(-1, keepdims=True)
    fw = np_e4m3(g32 * (wsc / wmax * 64.0)[..., None]).reshape(wv.shape)
    want = gemm(fa, smax, fw, np.broadcast_to(wmax / 64.0, (40, k // 64)), group=64)
    assert np.array_equal(got, want)
    assert (fa[1, 96:128] == 0).all() and not (av.numpy()[1, 96:128] == 0).all()  # 30 binades: gone
    assert np.array_equal(fa[2, 96:128], av.numpy()[2, 96:128])  # its partner kept its own scale
    row_only = R.block_scaled_gemm(av, asc, wp[0], ws[0], ROW_FOLD).numpy()
    assert not np.array_equal(got[0], row_only[0])  # rounded small values change row 0's numbers
    # the byte-level fold of the kernel's pools gives the same values and group scales
    from megamoe.layouts import fold_e4m3_scales_for_sm90
    fb, fs = fold_e4m3_scales_for_sm90(q, qs)
    assert np.array_equal(F.decode_e4m3(fb, torch.float64).numpy(), fa)
    assert np.array_equal(F.decode_ue8m0(fs, torch.float64).numpy().reshape(3, -1, 2)[..., 0],
                          np.where(nz.any(-1), smax, s64[..., 0]))


def test_numerics_constructors_and_validation():
    assert R.Numerics.sm100() == R.Numerics("sm100", None, None, True, False)
    s = R.Numerics.sm90(128)
    assert (s.arch, s.w_fold_k, s.x_fold_k, s.bf16_before_swiglu) == ("sm90", 128, 128, True)
    assert R.Numerics.sm90().group_k == 32 and s.group_k == 128
    with pytest.raises(InputError, match=r"^numerics.w_fold_k: expected None, 'row' or a positive multiple of 32, got 48$"):
        R.Numerics("sm90", 48, None)
    k = R.Numerics.sm90_kernel()
    assert (k.arch, k.w_fold_k, k.x_fold_k, k.w_fold_top, k.group_k) == ("sm90", "row", 64, 6, 64)
    assert R.Numerics("sm90", "row", None, w_fold_top=6).group_k == 32
    for w, x in ((64, 128), (64, "row")):
        with pytest.raises(InputError, match=r"^numerics.x_fold_k: expected equal to w_fold_k"):
            R.Numerics("sm90", w, x)
    with pytest.raises(InputError, match=r"^numerics.x_fold_k: expected .*, got 'row'$"):
        R.Numerics("sm90", 64, "row")
    for top, fold in ((7, "row"), (-1, "row"), (1.0, "row"), (True, "row"), (2, None)):
        with pytest.raises(InputError, match=r"^numerics.w_fold_top: expected an int 0\.\.6"):
            R.Numerics("sm90", fold, None, w_fold_top=top)
    # a string is shown as one
    with pytest.raises(InputError, match=r"^numerics.w_fold_top: expected .*, got '6'$"):
        R.Numerics("sm90", "row", None, w_fold_top="6")
    with pytest.raises(InputError, match=r"^numerics.w_fold_k: expected None, 'row' or a positive multiple of 32, got 'ROW'$"):
        R.Numerics("sm90", "ROW", None)
    with pytest.raises(InputError, match=r"^numerics.arch"):
        R.Numerics("sm80")
    # flags are bools: "no" would act as True
    with pytest.raises(InputError, match=r"^numerics.bf16_before_swiglu: expected True or False, got 'no'$"):
        R.Numerics("sm90", bf16_before_swiglu="no")
    with pytest.raises(InputError, match=r"^numerics.fast_math: expected True or False, got 2$"):
        R.Numerics.sm90_kernel(fast_math=2)
    # sm90 without folding is numerically the SM100 path
    c = make_case(seed=3)
    assert torch.equal(run_q(c, activation_clamp=CLAMP),
                       run_q(c, activation_clamp=CLAMP, numerics=R.Numerics.sm90()))


def test_expert_parallel_is_bitwise_single_rank():
    c = make_case(seed=4, t=13)
    single = run_q(c, activation_clamp=CLAMP)
    for cuts in ([0, 6, 13], [0, 3, 3, 9, 13]):  # 2 ranks; 4 ranks with an empty one
        sl = [slice(a, b) for a, b in zip(cuts[:-1], cuts[1:])]
        ys = R.moe_reference_quantized_ep([c["x"][s] for s in sl], [c["x_sf"][s] for s in sl],
                                          [c["topk_idx"][s] for s in sl],
                                          [c["topk_weights"][s] for s in sl], *c["w"],
                                          activation_clamp=CLAMP)
        assert len(ys) == len(sl) and ys[1].shape[0] == sl[1].stop - sl[1].start
        assert torch.equal(torch.cat(ys), single)


def test_minus_one_slots_contribute_nothing_and_zero_tokens():
    c = make_case(seed=6)
    y = run_q(c)
    # dropping the -1 slots' columns (slot order kept) gives the same bits
    idx, w = c["topk_idx"].clone(), c["topk_weights"].clone()
    w[idx < 0] = 1e30  # a weight on a -1 slot is never read
    y2 = R.moe_reference_quantized(c["x"], c["x_sf"], idx, w, *c["w"])
    assert torch.equal(y, y2)
    only = c["topk_idx"].clone()
    only[0] = -1
    y3 = R.moe_reference_quantized(c["x"], c["x_sf"], only, c["topk_weights"], *c["w"])
    assert torch.equal(y3[0], torch.zeros(H, dtype=torch.bfloat16))
    e = R.moe_reference_quantized(c["x"][:0], c["x_sf"][:0], c["topk_idx"][:0],
                                  c["topk_weights"][:0], *c["w"])
    assert e.shape == (0, H) and e.dtype == torch.bfloat16
    assert R.moe_reference(c["x"][:0], c["x_sf"][:0], c["topk_idx"][:0],
                           c["topk_weights"][:0], *c["w"]).shape == (0, H)


@pytest.mark.parametrize("bad", ["nan", "inf"])
def test_nan_inf_stay_in_their_token(bad):
    c = make_case(seed=7)
    clean = run_q(c)
    x = c["x"].clone()
    xsf = c["x_sf"].clone()
    if bad == "nan":
        x.view(torch.uint8)[4, 3] = 0x7F  # E4M3 NaN
    else:
        b = unpack_ue8m0(xsf)
        b[4, 0] = 254  # a huge scale: the token overflows to Inf in FP32
        xsf = pack_ue8m0(b)
    y = R.moe_reference_quantized(x, xsf, c["topk_idx"], c["topk_weights"], *c["w"])
    others = torch.arange(T) != 4
    assert torch.equal(y[others], clean[others])
    assert not torch.isfinite(y[4].float()).all()
    ye = R.moe_reference(x, xsf, c["topk_idx"], c["topk_weights"], *c["w"])
    ye_clean = R.moe_reference(c["x"], c["x_sf"], c["topk_idx"], c["topk_weights"], *c["w"])
    assert torch.equal(ye[others], ye_clean[others])
    if bad == "nan":  # (2^127 scales do not overflow the float64 exact path)
        assert not torch.isfinite(ye[4]).all()


def test_pre_dispatch_into_buffers():
    g = torch.Generator().manual_seed(8)
    x = torch.randn((5, 256), generator=g).to(torch.bfloat16)
    idx = torch.randint(0, 8, (5, 2), generator=g, dtype=torch.int32)
    w = torch.rand((5, 2), generator=g).to(torch.bfloat16)
    bx = torch.zeros((8, 256), dtype=torch.float8_e4m3fn)
    bsf = torch.zeros((8, 2), dtype=torch.int32)
    bi = torch.zeros((8, 2), dtype=torch.int64)
    bw = torch.ones((8, 2), dtype=torch.float32)
    out = R.mega_moe_pre_dispatch(x, idx, w, bx, bsf, bi, bw, num_experts=8)
    assert out[0] is bx and out[3] is bw
    q, sf, i2, w2 = R.mega_moe_pre_dispatch(x, idx, w)
    assert torch.equal(bx[:5].view(torch.uint8), q.view(torch.uint8)) and torch.equal(bsf[:5], sf)
    assert torch.equal(bi[:5], idx.long()) and (bi[5:] == -1).all() and (bw[5:] == 0).all()
    assert i2.dtype == torch.int64 and w2.dtype == torch.float32 and sf.shape == (5, 2)
    # independent check of one block: amax / 448 rounded up to a power of two
    blk = x[2, 32:64].float()
    e = math.ceil(math.log2(max(blk.abs().max().item(), 1e-4) / 448))
    assert unpack_ue8m0(sf)[2, 1].item() == e + 127
    with pytest.raises(InputError, match=r"^buf_x_sf: expected shape"):
        R.mega_moe_pre_dispatch(x, idx, w, bx, torch.zeros((8, 3), dtype=torch.int32))
    with pytest.raises(InputError, match=r"^topk_idx: expected values in \[-1, 4\)"):
        R.mega_moe_pre_dispatch(x, idx, w, num_experts=4)


def test_bad_inputs_name_the_tensor():
    c = make_case(seed=9)
    args = [c["x"], c["x_sf"], c["topk_idx"], c["topk_weights"], *c["w"]]

    def call(i, v, fn=R.moe_reference_quantized):
        a = list(args)
        a[i] = v
        return fn(*a)

    with pytest.raises(InputError, match=r"^x: expected dtype"):
        call(0, c["x"].view(torch.uint8))
    with pytest.raises(InputError, match=r"^x: expected a contiguous tensor"):
        call(0, torch.zeros((H, T)).to(torch.float8_e4m3fn).t())
    with pytest.raises(InputError, match=r"^x_sf: expected shape \(10, 2\)"):
        call(1, c["x_sf"][:, :1].contiguous())
    bad = c["topk_idx"].clone()
    bad[0, 0] = E
    with pytest.raises(InputError, match=r"^topk_idx: expected values in \[-1, 4\), got values in"):
        call(2, bad)
    with pytest.raises(InputError, match=r"^topk_idx: expected device"):
        call(2, torch.empty((T, K), dtype=torch.int64, device="meta"))
    with pytest.raises(InputError, match=r"^topk_weights: expected shape"):
        call(3, c["topk_weights"][:, :2].contiguous())
    (w1, s1), (w2, s2) = c["w"]
    with pytest.raises(InputError, match=r"^l2_weights_sf: expected shape"):
        call(5, (w2, s2[:, :, :2].contiguous()))
    with pytest.raises(InputError, match=r"^l1_weights: expected K = 2 \* shape\[2\] a multiple of 32"):
        call(4, (torch.zeros((E, 2 * I, 24), dtype=torch.uint8), torch.zeros((E, 2 * I, 1), dtype=torch.uint8)))
    with pytest.raises(InputError, match=r"^activation_clamp"):
        R.moe_reference(*args, activation_clamp=-1.0)
    with pytest.raises(InputError, match=r"^x\[1\]: expected shape"):
        R.moe_reference_quantized_ep([c["x"], c["x"][:, :128].contiguous()], [c["x_sf"]] * 2,
                                     [c["topk_idx"]] * 2, [c["topk_weights"]] * 2, *c["w"])
    with pytest.raises(InputError, match=r"^xs: expected a number of ranks dividing"):
        R.moe_reference_quantized_ep([c["x"]] * 3, [c["x_sf"]] * 3, [c["topk_idx"]] * 3,
                                     [c["topk_weights"]] * 3, *c["w"])


def test_float_x_and_lazy_weights():
    src = R.SyntheticWeights(E, H, I, seed=3)
    (w1, s1), (w2, s2) = R.quantize_weights(*[torch.stack(ws) for ws in
                                              zip(*[src.float_expert(e) for e in range(E)])])
    g = torch.Generator().manual_seed(1)
    x = torch.randn((4, H), generator=g).to(torch.bfloat16)
    idx = torch.tensor([[0, 1], [2, 3], [3, -1], [1, 0]])
    w = torch.rand((4, 2), generator=g)
    xq, xsf, _, _ = R.mega_moe_pre_dispatch(x, idx, w)
    a = R.moe_reference_quantized(xq, xsf, idx, w, src)
    b = R.moe_reference_quantized(xq, xsf, idx, w, (w1, s1), (w2, s2))
    c = R.moe_reference_quantized(x, None, idx, w, (w1, s1), (w2, s2))  # pre-dispatch inside
    assert torch.equal(a, b) and torch.equal(a, c)
    fsrc = R.SyntheticWeights(E, H, I, seed=3, mode="float")
    exact_float = R.moe_reference(x, None, idx, w, fsrc)
    rel = (a.double() - exact_float).norm() / exact_float.norm()
    assert rel < 0.3  # FP4 weights (~12% rms per element, twice) + FP8 activations


_V4PRO_SCRIPT = r"""
import json, resource, sys, time, torch
from megamoe import reference as R
torch.manual_seed(0)
E, H, I, T, K = 384, 7168, 3072, 64, 6
class Src:  # random MXFP4 bytes, one expert shared by all ids (an ExpertWeights source)
    num_experts, hidden, intermediate = E, H, I
    def __init__(self):
        g = torch.Generator().manual_seed(1)
        b = lambda *s: torch.randint(0, 256, s, generator=g, dtype=torch.int32).to(torch.uint8)
        sf = lambda *s: torch.randint(118, 123, s, generator=g, dtype=torch.int32).to(torch.uint8)
        self.w = (b(2 * I, H // 2), sf(2 * I, H // 32), b(H, I // 2), sf(H, I // 32))
    def expert(self, e):
        return self.w
src = Src()
assert isinstance(src, R.ExpertWeights)
x = torch.randn(T, H).to(torch.bfloat16)
# 64 tokens, top-6 over 6 of the 384 experts, 64 rows per expert (bounded CPU time;
# peak memory is per expert and grows with the rows per expert, not with the experts)
idx = torch.stack([torch.randperm(6) * 64 + 5 for _ in range(T)])
w = torch.rand(T, K)
xq, xsf, idx, w = R.mega_moe_pre_dispatch(x, idx, w, num_experts=E)
t0 = time.time()
y = R.moe_reference_quantized(xq, xsf, idx, w, src, activation_clamp=10.0)
print(json.dumps({"rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
                  "s": time.time() - t0, "finite": bool(torch.isfinite(y.float()).all()),
                  "shape": list(y.shape)}))
"""


@pytest.mark.slow
def test_v4_pro_64_tokens_within_8_gib():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))] + sys.path))
    out = subprocess.run([sys.executable, "-c", _V4PRO_SCRIPT], capture_output=True, text=True,
                         env=env, timeout=600, check=True)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["shape"] == [64, 7168] and res["finite"]
    assert res["rss_gib"] < 8.0


def test_fast_fp32_split_path_equals_float64_path():
    """Adversarial groups (448 next to 2^-9, E2M1 6 next to 0.5): the FP32 split used for
    32-wide E4M3 x E2M1 groups must give the float64 path's bits."""
    from megamoe.formats import cast_to_e4m3, decode_e4m3, decode_ue8m0, quantize_e2m1_blocks
    g = torch.Generator().manual_seed(11)
    k = 128
    mags = torch.tensor([448.0, 2.0 ** -9, 2.0 ** -7 * 3, 0.125, 0.1171875, 240.0, 1.0, 2.0 ** -6])
    a = mags[torch.randint(0, 8, (16, k), generator=g)] * torch.where(
        torch.rand((16, k), generator=g) < 0.5, -1.0, 1.0)
    av = decode_e4m3(cast_to_e4m3(a), torch.float64)
    wp, ws = quantize_e2m1_blocks(torch.randn((48, k), generator=g) * 3)
    # scales in the FP32-scaling range, then extreme ones (float64 fallback, subnormal and
    # overflowing FP32 results)
    for lo, hi in ((100, 150), (1, 40), (200, 255)):
        asc = decode_ue8m0(torch.randint(lo, hi, (16, k // 32), generator=g,
                                         dtype=torch.int32).to(torch.uint8), torch.float64)
        fast = R.block_scaled_gemm(av, asc, wp, ws, R.Numerics.sm100())
        prev = torch.get_float32_matmul_precision()
        try:
            torch.set_float32_matmul_precision("high")  # disables the FP32 split
            slow = R.block_scaled_gemm(av, asc, wp, ws, R.Numerics.sm100())
        finally:
            torch.set_float32_matmul_precision(prev)
        torch.testing.assert_close(fast, slow, rtol=0, atol=0, equal_nan=True)
        wv, wsc = dec_w(wp.numpy(), ws.numpy())
        with np.errstate(over="ignore", invalid="ignore"):
            want = gemm(av.numpy(), asc.numpy(), wv, wsc)
        assert np.array_equal(fast.numpy(), want, equal_nan=True)


def test_numerics_switches_change_the_epilogue():
    c = make_case(seed=12)
    base = run_q(c, activation_clamp=CLAMP)
    fp32 = run_q(c, activation_clamp=CLAMP, numerics=R.Numerics(bf16_before_swiglu=False))
    fast = run_q(c, activation_clamp=CLAMP, numerics=R.Numerics.sm100(fast_math=True))
    ex = R.moe_reference(c["x"], c["x_sf"], c["topk_idx"], c["topk_weights"], *c["w"],
                         activation_clamp=CLAMP)
    assert not torch.equal(base, fp32)
    for y in (base, fp32, fast):
        assert (y.double() - ex).norm() / ex.norm() < 0.06
