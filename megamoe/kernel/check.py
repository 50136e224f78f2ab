"""Inputs and an independent reference for the SM90 kernel (torch, float64 GEMMs).

``reference_sm90`` implements the numerics the kernel really runs (``design_sm90.W_FOLD_K =
"row"``, ``W_FOLD_TOP = 6``, ``X_FOLD_K = 64``): weight values folded per row as E4M3 of
``E2M1 x 2^(s - s_max + 6)`` times ``2^(s_max - 6)`` (``s_max`` over the row's 32-groups with a
nonzero value), activation values folded per 64-K group the same way (:func:`fold_x`, no
offset; x per 128 at block_m 128: ``design_sm90.L1_X_FOLD_K``), FP32-level accumulation
(float64 here), gate/up rounded to BF16 then clamped, SiLU in FP32, times the top-k weight,
per-32 amax -> UE8M0 (``ceil(log2(amax / 448))``) -> E4M3 (RNE, saturating) -> the 64-K fold, L2 in float64 rounded to BF16 per (token, slot), combine in
FP32 over the valid slots in slot order, BF16 out. It is the check used until/beside
``megamoe.reference.moe_reference_quantized``. ``reference_sm90(..., mma="h200_wgmma")`` forms
the GEMMs as the H200's tensor core does (:func:`gemm_sm90_h200`) and gives the kernel's
output bit for bit.
"""

from __future__ import annotations

import math

E2M1_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def _torch():
    import torch
    return torch


def ue8m0_exponent(amax):
    """ceil(log2(amax / 448)) from the FP32 bits, as the kernel computes it (int32 tensor)."""
    torch = _torch()
    scaled = (amax.to(torch.float32) * torch.tensor(1.0 / 448.0, dtype=torch.float32, device=amax.device))
    bits = scaled.view(torch.int32)
    return (bits >> 23) - 127 + ((bits & 0x7FFFFF) != 0).to(torch.int32)


def quantize_e4m3_per32(v):
    """FP32 [..., K] -> (E4M3 bytes uint8 [..., K], UE8M0 bytes uint8 [..., K/32])."""
    torch = _torch()
    shp = v.shape
    g = v.to(torch.float32).reshape(*shp[:-1], shp[-1] // 32, 32)
    l = ue8m0_exponent(g.abs().amax(-1))
    inv = torch.ldexp(torch.ones_like(g[..., 0]), (-l).to(torch.float32)) if False else torch.pow(2.0, (-l).to(torch.float32))
    q = (g * inv[..., None]).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8).reshape(shp)
    return q, (l + 127).clamp(0, 255).to(torch.uint8)


def dequant_e4m3(q, sf, dtype=None):
    torch = _torch()
    dtype = dtype or torch.float64
    shp = q.shape
    v = q.view(torch.float8_e4m3fn).to(dtype).reshape(*shp[:-1], shp[-1] // 32, 32)
    s = torch.pow(2.0, sf.to(dtype) - 127)
    return (v * s[..., None]).reshape(shp)


def dequant_e2m1(packed, sf, dtype=None):
    torch = _torch()
    dtype = dtype or torch.float64
    lut = torch.tensor(E2M1_VALUES, dtype=dtype, device=packed.device)
    lo = lut[(packed & 0xF).long()]
    hi = lut[(packed >> 4).long()]
    v = torch.stack([lo, hi], -1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)
    shp = v.shape
    s = torch.pow(2.0, sf.to(dtype) - 127)
    return (v.reshape(*shp[:-1], shp[-1] // 32, 32) * s[..., None]).reshape(shp)


def e2m1_folded_parts(packed, sf, top=6):
    """The SM90 kernel's decoded weights in two parts: float64 ``[N, K]`` E4M3 values (per row,
    each 32-group's E2M1 values x 2^(s - s_max + top) rounded to E4M3 by torch's float8 cast)
    and the float64 row scale ``[N, 1]`` 2^(s_max - top); ``s_max`` = the row's largest scale
    byte over groups with a nonzero value."""
    torch = _torch()
    v = dequant_e2m1(packed, torch.full_like(sf, 127))  # unscaled E2M1 values
    g = v.reshape(*sf.shape, 32)
    s = sf.to(torch.float64) - 127
    smax = torch.where((g != 0).any(-1), s, torch.full_like(s, -math.inf)).amax(-1, keepdim=True)
    smax = torch.where(torch.isinf(smax), torch.zeros_like(smax), smax)
    f = (g * torch.pow(2.0, s - smax + top)[..., None]).float().to(torch.float8_e4m3fn).to(torch.float64)
    return f.reshape(v.shape), torch.pow(2.0, smax - top)


def dequant_e2m1_folded(packed, sf, top=6):
    """float64 ``[N, K]`` weights as the SM90 kernel decodes them (:func:`e2m1_folded_parts`,
    values times row scale)."""
    f, rs = e2m1_folded_parts(packed, sf, top)
    return f * rs


def gemm_sm90_h200(q, sf, packed, w_sf, fold=64):
    """FP32 ``[m, N]`` = x ``[m, K]`` (E4M3 bytes folded per ``fold``, UE8M0 bytes ``[m, K/32]``)
    times the folded weights (``packed`` E2M1 ``[N, K/2]``, ``w_sf`` ``[N, K/32]``) transposed,
    as the SM90 kernel computes it on the H200: per ``fold``-wide K group the tensor core's
    partial (``megamoe.reference.h200_wgmma_partials``), ``acc = fma(part, 2^sx, acc)`` in K
    order from zero, then times the row scale (all in FP32)."""
    torch = _torch()
    from ..errors import require
    from ..reference import h200_wgmma_partials
    require(packed.dim() == 2 and packed.shape[1] * 2 == q.shape[-1], "packed",
            f"E2M1 weights [N, {q.shape[-1] // 2}] (the K of x, packed two per byte)", tuple(packed.shape))
    xv = q.view(torch.float8_e4m3fn).to(torch.float32)
    # the group's scale byte (a folded group's bytes are equal) as the kernel reads it: byte << 23
    sx = (sf[:, ::fold // 32].to(torch.int32) << 23).view(torch.float32)
    wv, rs = e2m1_folded_parts(packed, w_sf)
    parts = h200_wgmma_partials(xv, wv, fold)
    acc = torch.zeros(parts.shape[1:], dtype=torch.float32, device=q.device)
    for g in range(parts.shape[0]):
        acc = torch.addcmul(acc, parts[g], sx[:, g:g + 1])  # part x 2^sx is exact: one rounding, as fma
    return acc * rs.to(torch.float32).T


def fold_x(q, sf, fold=64):
    """E4M3 bytes ``uint8 [..., K]`` and UE8M0 bytes ``[..., K/32]`` as the SM90 kernel's pools
    hold them (``design_sm90.X_FOLD_K``; ``fold=None``: unchanged): per ``fold``-wide K group,
    the 32-groups with a nonzero value re-encoded with the largest of their scales (values
    x 2^(s - s_max), torch's float8 cast) and given that scale; groups of zeros kept. A second
    implementation of ``megamoe.layouts.fold_e4m3_scales_for_sm90``."""
    if fold is None:
        return q, sf
    from ..errors import require
    torch = _torch()
    require(isinstance(fold, int) and not isinstance(fold, bool) and fold > 0 and fold % 32 == 0, "fold",
            "a positive multiple of 32", repr(fold))
    require(q.shape[-1] % fold == 0 and tuple(sf.shape) == (*q.shape[:-1], q.shape[-1] // 32), "q",
            f"E4M3 bytes [..., K] with K a multiple of {fold} and scales [..., K/32]",
            f"{tuple(q.shape)} and {tuple(sf.shape)}")
    shp, per = q.shape, fold // 32
    v = q.view(torch.float8_e4m3fn).to(torch.float64).reshape(*shp[:-1], shp[-1] // fold, per, 32)
    s = sf.to(torch.int64).reshape(*shp[:-1], shp[-1] // fold, per)
    nz = (v != 0).any(-1)
    smax = torch.where(nz, s, torch.full_like(s, -1)).amax(-1, keepdim=True)
    d = torch.where(nz, smax - s, torch.zeros_like(s))
    f = (v * torch.pow(2.0, -d.to(torch.float64))[..., None]).to(torch.float32).to(torch.float8_e4m3fn)
    out = torch.where((d > 0)[..., None], f.view(torch.uint8), q.view(torch.uint8).reshape(v.shape))
    return out.reshape(shp), torch.where(smax >= 0, smax, s).to(torch.uint8).reshape(sf.shape)


def make_weights(E, H, I, device, seed=0, sf_lo=119, sf_hi=121):
    """Random MXFP4 weights: uniform random nibbles, UE8M0 scales in [sf_lo, sf_hi]."""
    torch = _torch()
    g = torch.Generator(device=device).manual_seed(seed)
    w1 = torch.randint(0, 256, (E, 2 * I, H // 2), dtype=torch.uint8, device=device, generator=g)
    w2 = torch.randint(0, 256, (E, H, I // 2), dtype=torch.uint8, device=device, generator=g)
    w1_sf = torch.randint(sf_lo, sf_hi + 1, (E, 2 * I, H // 32), dtype=torch.uint8, device=device, generator=g)
    w2_sf = torch.randint(sf_lo, sf_hi + 1, (E, H, I // 32), dtype=torch.uint8, device=device, generator=g)
    return w1, w1_sf, w2, w2_sf


def make_inputs(T, E, K, H, device, seed=1, routing="uniform", mask_frac=0.0):
    """x (E4M3 bytes + UE8M0 scales), topk_idx int32 [T, K] (distinct experts, -1 masked), weights.

    Raises:
        InputError: ``routing`` not one of ``uniform``, ``zipf``, ``one_expert``.
    """
    from ..errors import InputError
    from ..routing import RUN_KINDS
    if routing not in RUN_KINDS:
        raise InputError("routing", f"{', '.join(RUN_KINDS[:-1])} or {RUN_KINDS[-1]} (the kernel's input generator)",
                         routing)
    torch = _torch()
    g = torch.Generator(device=device).manual_seed(seed)
    xf = torch.randn(T, H, device=device, generator=g) * 2.0
    x, x_sf = quantize_e4m3_per32(xf)
    if routing == "uniform":
        scores = torch.rand(T, E, device=device, generator=g)
    elif routing == "zipf":
        ranks = torch.arange(1, E + 1, device=device, dtype=torch.float32)
        p = (1.0 / ranks) / (1.0 / ranks).sum()
        scores = torch.log(p)[None, :] - torch.log(-torch.log(torch.rand(T, E, device=device, generator=g)))
    elif routing == "one_expert":
        scores = torch.rand(T, E, device=device, generator=g)
        scores[:, 3] = 10.0
    idx = scores.topk(K, dim=-1).indices.to(torch.int32) if T > 0 else torch.zeros(0, K, dtype=torch.int32, device=device)
    w = torch.rand(T, K, device=device, generator=g) + 0.1
    if mask_frac > 0 and T > 0:
        m = torch.rand(T, K, device=device, generator=g) < mask_frac
        idx = torch.where(m, torch.full_like(idx, -1), idx)
    return x, x_sf, idx, w


def reference_sm90(x, x_sf, topk_idx, topk_w, w1, w1_sf, w2, w2_sf, clamp=None, return_l2_input=False,
                   mma="exact", block_m=None):
    """BF16 [T, H] output of the kernel's numerics (see module docstring). ``mma="h200_wgmma"``:
    both GEMMs as the H200's tensor core sums them (:func:`gemm_sm90_h200`) instead of exactly.
    ``block_m``: the launch's (``MegaMoEKernel.last_design.block_m``), which sets the L1 GEMM's
    activation fold (``design_sm90.L1_X_FOLD_K``: 128 at block_m 128); None: 64.

    Raises:
        InputError: ``mma`` or ``block_m`` not one of theirs; H or I not a multiple of 128;
            weights, scales, ids or top-k weights of other shapes than x's; an expert id
            outside [-1, E)."""
    torch = _torch()
    T, H = x.shape
    K = topk_idx.shape[1]
    I = w2.shape[2] * 2
    dev = x.device
    from ..errors import require
    from ..reference import Numerics
    require(mma in ("exact", "h200_wgmma"), "mma", "'exact' or 'h200_wgmma'", repr(mma))
    num = Numerics.sm90_kernel(block_m=block_m)  # the folds at this block_m (refuses another block_m)
    E = w1.shape[0]
    require(H % 128 == 0, "x", "E4M3 bytes [T, H] with H a multiple of 128 (the kernel's K block)",
            f"shape {tuple(x.shape)}")
    require(I % 128 == 0, "w2", "[E, H, I/2] packed E2M1 with I a multiple of 128 (the kernel's K block)",
            f"shape {tuple(w2.shape)}")
    require(tuple(w1.shape) == (E, 2 * I, H // 2) and tuple(w1_sf.shape) == (E, 2 * I, H // 32)
            and tuple(w2.shape) == (E, H, I // 2) and tuple(w2_sf.shape) == (E, H, I // 32), "w1",
            f"[E, 2I, H/2] packed E2M1 with [E, 2I, H/32] scales for x's H = {H} (and w2 [E, H, I/2])",
            f"w1 {tuple(w1.shape)}, w1_sf {tuple(w1_sf.shape)}, w2 {tuple(w2.shape)}, w2_sf {tuple(w2_sf.shape)}")
    require(tuple(topk_idx.shape) == (T, K) and tuple(topk_w.shape) == (T, K) and tuple(x_sf.shape) == (T, H // 32),
            "topk_idx", f"[T, k] ids and weights and x_sf [T, H/32] for x of shape {tuple(x.shape)}",
            f"topk_idx {tuple(topk_idx.shape)}, topk_w {tuple(topk_w.shape)}, x_sf {tuple(x_sf.shape)}")
    bad = topk_idx[(topk_idx < -1) | (topk_idx >= E)]
    require(bad.numel() == 0, "topk_idx", f"expert ids in [-1, {E})", f"{int(bad[0]) if bad.numel() else ''}")
    x1, x2 = num.x_fold_k, num.for_l2().x_fold_k
    fx, fxs = fold_x(x, x_sf, x1)
    xd = dequant_e4m3(fx, fxs)
    cb = torch.zeros(K, T, H, dtype=torch.bfloat16, device=dev)
    l2_in = {}
    flat = topk_idx.reshape(-1).long()
    cl = math.inf if clamp is None else float(torch.tensor(clamp).to(torch.bfloat16).float())
    for e in torch.unique(flat[flat >= 0]).tolist():
        items = (flat == e).nonzero().squeeze(1)
        t, k = items // K, items % K
        if mma == "h200_wgmma":
            h = gemm_sm90_h200(fx[t], fxs[t], w1[e], w1_sf[e], x1)
        else:
            h = xd[t] @ dequant_e2m1_folded(w1[e], w1_sf[e]).T
        gate = h[:, :I].to(torch.float32).to(torch.bfloat16).to(torch.float32)
        up = h[:, I:].to(torch.float32).to(torch.bfloat16).to(torch.float32)
        if math.isfinite(cl):
            gate = gate.clamp(max=cl)
            up = up.clamp(-cl, cl)
        silu = gate / (1.0 + torch.exp(-gate))
        v = (silu * up) * topk_w[t, k].to(torch.float32)[:, None]
        q, qsf = fold_x(*quantize_e4m3_per32(v), x2)
        if mma == "h200_wgmma":
            o = gemm_sm90_h200(q, qsf, w2[e], w2_sf[e], x2)
        else:
            o = dequant_e4m3(q, qsf) @ dequant_e2m1_folded(w2[e], w2_sf[e]).T
        cb[k, t] = o.to(torch.float32).to(torch.bfloat16)
        if return_l2_input:
            l2_in[e] = (t, k, q, qsf)
    valid = (topk_idx >= 0).T[:, :, None]
    y = torch.zeros(T, H, dtype=torch.float32, device=dev)
    for kk in range(K):
        y = y + torch.where(valid[kk], cb[kk].to(torch.float32), torch.zeros((), device=dev))
    y = y.to(torch.bfloat16)
    return (y, l2_in) if return_l2_input else y


def reference_exact(x, x_sf, topk_idx, topk_w, w1, w1_sf, w2, w2_sf, clamp=None):
    """Exact math on the dequantized inputs (no intermediate quantization), float64."""
    torch = _torch()
    T, H = x.shape
    K = topk_idx.shape[1]
    I = w2.shape[2] * 2
    xd = dequant_e4m3(x, x_sf)
    y = torch.zeros(T, H, dtype=torch.float64, device=x.device)
    flat = topk_idx.reshape(-1).long()
    for e in torch.unique(flat[flat >= 0]).tolist():
        items = (flat == e).nonzero().squeeze(1)
        t, k = items // K, items % K
        h = xd[t] @ dequant_e2m1(w1[e], w1_sf[e]).T
        gate, up = h[:, :I], h[:, I:]
        if clamp is not None:
            gate = gate.clamp(max=clamp)
            up = up.clamp(-clamp, clamp)
        v = gate * torch.sigmoid(gate) * up * topk_w[t, k].to(torch.float64)[:, None]
        y.index_add_(0, t, v @ dequant_e2m1(w2[e], w2_sf[e]).T)
    return y


#: Output tolerance (relative L2) of the SM90 kernel against :func:`reference_sm90` with exact
#: partial sums (``mma="exact"``). The H200's FP8 tensor cores truncate (``megamoe.reference.
#: h200_wgmma_partials``: products aligned with 13 fraction bits below the largest, the sum
#: kept to 14 significant bits), which flips roundings downstream: 0.2-0.7% of the E4M3 L2-pool
#: bytes differ from this reference's. Each such flip moves every output of its token a little.
#: Measured rel L2 9.7e-4 .. 3.9e-3 (H200, kernel v7.6, ``benchmarks/results/
#: kernel_numerics_h200.json``). With ``mma="h200_wgmma"`` the kernel's output is the
#: reference's bit for bit (same file; the GPU tests assert it).
REL_L2_TOL = 5e-3


def l2_pool_agreement(kernel, l2_in: dict) -> dict:
    """Compare the kernel's L2 pool (FP8 SwiGLU rows + UE8M0 scales, written by the L1
    epilogue) with ``reference_sm90(..., return_l2_input=True)``'s: fraction of equal bytes,
    the largest difference of the (unscaled) E4M3 values in units of the top binade's spacing
    (32: one rounding flip anywhere in the E4M3 range is at most 1.0), fraction of equal
    scales, rows compared."""
    torch = _torch()
    ws, R, I = kernel._ws, kernel._ws_key[1], kernel.I
    pool = ws["l2_pool"].cpu()
    psf = ws["l2_pool_sf"].permute(1, 0, 2).reshape(R, I // 32).cpu()
    where = {(t, s): r for r, (t, s) in enumerate(zip(ws["pool_token"].cpu().tolist(), ws["pool_slot"].cpu().tolist()))
             if t >= 0}
    got, want, gsf, wsf = [], [], [], []
    for t, k, q, qsf in l2_in.values():
        for i in range(t.numel()):
            r = where[(int(t[i]), int(k[i]))]
            got.append(pool[r]); want.append(q[i].cpu()); gsf.append(psf[r]); wsf.append(qsf[i].cpu().reshape(-1))
    if not got:
        return dict(bytes_equal=1.0, max_error_top_ulps=0.0, scales_equal=1.0, rows=0)
    g, w = torch.stack(got), torch.stack(want)
    dv = (g.view(torch.float8_e4m3fn).double() - w.view(torch.float8_e4m3fn).double()).abs()
    return dict(bytes_equal=(g == w).double().mean().item(), max_error_top_ulps=float(dv.max()) / 32.0,
                scales_equal=(torch.stack(gsf) == torch.stack(wsf)).double().mean().item(), rows=len(got))


def compare(out, ref) -> dict:
    """rel L2 error, fraction of elements off by > 1% (relative to max(|ref|, 0.1 rms)), NaN count."""
    torch = _torch()
    a = out.to(torch.float64)
    b = ref.to(torch.float64)
    if b.numel() == 0:
        return dict(rel_l2=0.0, frac_off_1pct=0.0, nan=0)
    rms = b.pow(2).mean().sqrt().clamp_min(1e-30)
    rel = ((a - b).norm() / b.norm().clamp_min(1e-30)).item()
    tol = 0.01 * torch.maximum(b.abs(), 0.1 * rms)
    off = ((a - b).abs() > tol).double().mean().item()
    return dict(rel_l2=rel, frac_off_1pct=off, nan=int(torch.isnan(a).sum().item()))
