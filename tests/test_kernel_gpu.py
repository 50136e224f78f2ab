"""GPU tests of the SM90 mega-kernel (skipped without an sm_90 GPU)."""

import gc
from collections import OrderedDict

import pytest

torch = pytest.importorskip("torch")
from megamoe.kernel import cuda_available  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not cuda_available(), reason="needs a CUDA GPU with sm_90+")]

from megamoe.design_sm90 import L1_X_FOLD_K, wave_lag
from megamoe.kernel import MegaMoEKernel, prepare_weights, KernelError  # noqa: E402
from megamoe.kernel.check import (make_weights, make_inputs, reference_sm90, reference_exact, compare,  # noqa: E402
                                  l2_pool_agreement, fold_x, REL_L2_TOL)
from megamoe.kernel.schedule import block_list, block_sequence, ticket_order_violation  # noqa: E402
from megamoe.kernel.trace import block_order  # noqa: E402

TINY = dict(E=8, K=2, H=256, I=128)
FLASH = dict(E=256, K=6, H=4096, I=2048)
#: Kernel objects kept between tests, least recently used dropped first. Each V4-Flash object holds
#: its own SM90 weight layout (~3 GiB) and buffers: with every one of the file's ~15 parameter sets
#: kept, the whole file ran the H200's 140 GB out of memory (session 43, OutOfMemoryError at its
#: 59th test). Weights are made and prepared once per shape and shared.
_MAX_KERNELS = 4
_cache: OrderedDict = OrderedDict()
_weights: dict = {}


def _kernel(shape, max_tokens, clamp=None, **kw):
    key = (tuple(shape.items()), max_tokens, clamp, tuple(kw.items()))
    if key in _cache:
        _cache.move_to_end(key)
        return _cache[key]
    skey = tuple(shape.items())
    if skey not in _weights:
        w = make_weights(shape["E"], shape["H"], shape["I"], "cuda", seed=7)
        _weights[skey] = (w, prepare_weights(*w))
    w, pw = _weights[skey]
    if len(_cache) >= _MAX_KERNELS:  # (one added at a time, so one dropped is enough)
        _cache.popitem(last=False)
        gc.collect()  # the dropped object's GPU memory back before the next allocation
        torch.cuda.empty_cache()
    k = MegaMoEKernel(shape["E"], shape["K"], shape["H"], shape["I"], max_tokens, pw, clamp=clamp, **kw)
    _cache[key] = (k, w)
    return _cache[key]


def _assert_bitwise(y, ref):
    same = y.view(torch.int16) == ref.view(torch.int16)
    c = compare(y, ref)
    assert bool(same.all()), dict(c, bitwise_equal=same.double().mean().item())


def _check(shape, T, routing="uniform", mask_frac=0.0, clamp=None, seed=1, **kw):
    k, w = _kernel(shape, max(T, 1), clamp=clamp, **kw)
    x, xs, idx, tw = make_inputs(T, shape["E"], shape["K"], shape["H"], "cuda", seed=seed, routing=routing,
                                 mask_frac=mask_frac)
    y = k(x, xs, idx, tw)
    k.check()
    bm = k.last_design.block_m  # (the L1 fold: per 128 at block_m 128, design_sm90.L1_X_FOLD_K)
    ref = reference_sm90(x, xs, idx, tw, *w, clamp=clamp, block_m=bm)
    c = compare(y, ref)
    assert c["nan"] == 0
    assert c["rel_l2"] <= REL_L2_TOL, c  # FP8 WGMMA accumulation, see megamoe.kernel.check
    # with the H200's WGMMA accumulation modelled, the reference is the kernel bit for bit
    # (measured on the H200 in every case of this file; the bound is rel L2 2e-3)
    _assert_bitwise(y, reference_sm90(x, xs, idx, tw, *w, clamp=clamp, mma="h200_wgmma", block_m=bm))
    if T > 0:
        ex = reference_exact(x, xs, idx, tw, *w, clamp=clamp)
        e_kernel = compare(y, ex)["rel_l2"]
        e_ref = compare(ref, ex)["rel_l2"]
        assert e_kernel <= e_ref * 1.05 + 1e-6, (e_kernel, e_ref)
    return k, (x, xs, idx, tw), y


@pytest.mark.parametrize("T", [1, 5, 33, 200])
def test_tiny(T):
    _check(TINY, T)


def test_tiny_masked_and_clamp():
    _check(TINY, 64, mask_frac=0.3, clamp=0.05)


def test_tiny_block_sizes():
    for bm in (16, 32, 64, 128):
        _check(TINY, 100, block_m=bm, seed=bm)


def test_tiny_one_expert_and_zipf():
    _check(TINY, 300, routing="one_expert")
    _check(TINY, 300, routing="zipf")


def test_zero_tokens():
    k, w = _kernel(TINY, 16)
    x, xs, idx, tw = make_inputs(0, 8, 2, 256, "cuda")
    y = k(x, xs, idx, tw)
    k.check()
    assert y.shape == (0, 256)


def test_all_masked():
    k, w = _kernel(TINY, 16)
    x, xs, idx, tw = make_inputs(16, 8, 2, 256, "cuda")
    y = k(x, xs, idx.fill_(-1), tw)
    k.check()
    assert (y.float() == 0).all()


@pytest.mark.parametrize("T", [1, 7, 128, 1000, 4096])
def test_v4_flash(T):
    _check(FLASH, T, seed=T)


def test_v4_flash_zipf_masked():
    _check(FLASH, 512, routing="zipf", mask_frac=0.1)


def test_wide_instance_skips_the_stale_rows_of_masked_slots():
    """At 2 tokens (V4-Flash) the launch runs the one-CTA wide instance (design_sm90.wide_walk), whose
    combine loads every slot's row before it knows the slot's index (kernel v8.8): the rows of
    masked slots hold the previous call's values and must not be added. The first call, with no
    slot masked, leaves a row in every slot; the second masks 30%; both bit for bit against the
    reference (in _check)."""
    from megamoe.design_sm90 import COMBINE_SLOTS_WIDE, wide_walk

    k, _, _ = _check(FLASH, 2, seed=21)
    assert wide_walk(k.last_design.block_m, k.last_design.experts_per_wave) and k.last_design.ctas_per_sm == 1
    assert COMBINE_SLOTS_WIDE >= FLASH["K"]  # one round of loads covers a token's slots
    _, (x, xs, idx, tw), _ = _check(FLASH, 2, mask_frac=0.3, seed=22)
    assert bool((idx < 0).any())
    # every slot masked: each token sums to zero, whatever its slots' stale rows hold
    y = k(x, xs, idx.clone().fill_(-1), tw)
    k.check()
    assert bool((y.float() == 0).all())


@pytest.mark.parametrize("T,mask_frac", [(1, 0.0), (2, 0.3), (2, 0.0), (3, 0.0), (6, 0.3), (16, 0.0), (30, 0.3)])
def test_local_count_places_each_experts_items_in_item_order(T, mask_frac):
    """In the wide instance at one rank the dispatch counts every item in every CTA, with no
    count barrier (design_sm90.local_count, kernel v8.9): expert e's rows start at its first
    pool block (experts in order, each ceil(c_e / block_m) blocks) and hold its items in item
    order (token, then slot), the padding rows none. Built on the host from the routing; until
    v8.9 an expert's rows came in the order the CTAs' atomics landed. Masked slots (-1) get no
    row (at 2 and 6 tokens, 30% of the slots masked). The one-CTA wide instance counts locally at 1-2
    tokens on V4-Flash, the two-CTA one (kernel v9.7) at 3-30 (3 / 6 / 16 / 30 here: waves of 256 / 128 /
    64 / 64 experts; at 30 tokens 180 items, more than the 128 dispatch threads count in one pass)."""
    from megamoe.design_sm90 import local_count

    k, (x, xs, idx, tw), y = _check(FLASH, T, mask_frac=mask_frac, seed=40 + T)
    d = k.last_design
    assert local_count(d.block_m, d.experts_per_wave, 1)
    assert d.ctas_per_sm == (1 if T <= 2 else 2)
    k.forget_pool_rows()
    assert torch.equal(k(x, xs, idx, tw).view(torch.int16), y.view(torch.int16))
    k.check()
    _, _, tok, slot = k.pool_contents()
    bm, E, K = d.block_m, FLASH["E"], FLASH["K"]
    flat = idx.reshape(-1).cpu().tolist()
    want = []
    for e in range(E):
        items = [i for i, ex in enumerate(flat) if ex == e]
        if items:
            want += [(i // K, i % K) for i in items] + [(-1, -1)] * (-(-len(items) // bm) * bm - len(items))
    got = list(zip(tok[:len(want)].cpu().tolist(), slot[:len(want)].cpu().tolist()))
    assert got == want
    assert int((tok[len(want):] >= 0).sum()) == 0


@pytest.mark.parametrize("shape,T,block_m", [(TINY, 33, None), (FLASH, 1, None), (FLASH, 128, None),
                                             (TINY, 200, 128)])
def test_l2_pool_matches_reference(shape, T, block_m):
    """The L1 half of the kernel (WGMMA, promotion, SwiGLU, requantization) against the
    reference byte by byte: at least 99% of the FP8 L2-pool bytes equal (measured on the H200:
    99.76-99.81%), every other value off by at most one spacing of the top E4M3 binade (a
    rounding flip from the FP8 tensor core's accumulation; near zero a flip can span several
    subnormal codes: measured up to 6), >= 99.9% of the UE8M0 scales equal (measured 100%).
    A layout or scale bug breaks all three."""
    k, w = _kernel(shape, max(T, 1), **({"block_m": block_m} if block_m else {}))
    x, xs, idx, tw = make_inputs(T, shape["E"], shape["K"], shape["H"], "cuda", seed=3)
    k(x, xs, idx, tw)
    k.check()
    k.forget_pool_rows()  # rows of earlier calls stay in the pool; run again, match rows by (token, slot)
    k(x, xs, idx, tw)
    k.check()
    bm = k.last_design.block_m
    _, l2_in = reference_sm90(x, xs, idx, tw, *w, return_l2_input=True, block_m=bm)
    a = l2_pool_agreement(k, l2_in)
    print(a)
    assert a["rows"] == int((idx >= 0).sum())
    assert a["bytes_equal"] >= 0.99 and a["max_error_top_ulps"] <= 1.0 and a["scales_equal"] >= 0.999, a
    # the H200's WGMMA accumulation modelled: every byte and scale equal
    _, l2_in = reference_sm90(x, xs, idx, tw, *w, return_l2_input=True, mma="h200_wgmma", block_m=bm)
    a = l2_pool_agreement(k, l2_in)
    assert a["bytes_equal"] == 1.0 and a["scales_equal"] == 1.0, a


@pytest.mark.parametrize("shape,T,clamp,block_m", [(TINY, 64, 0.05, None), (FLASH, 7, None, None),
                                                   (TINY, 64, 0.05, 128)])
def test_bitwise_equal_to_moe_reference_quantized(shape, T, clamp, block_m):
    """The issue's reference, megamoe.reference.moe_reference_quantized, with the SM90 numerics
    parameters including the H200's WGMMA accumulation (Numerics.sm90_kernel(mma="h200_wgmma")):
    the kernel's output bit for bit (so rel L2 0 <= 2e-3, no output off by > 1%), and its error
    against exact math the reference's own."""
    from megamoe.reference import Numerics, moe_reference_quantized
    k, w = _kernel(shape, T, clamp=clamp, **({"block_m": block_m} if block_m else {}))
    x, xs, idx, tw = make_inputs(T, shape["E"], shape["K"], shape["H"], "cuda", seed=11, mask_frac=0.2)
    y = k(x, xs, idx, tw)
    k.check()
    w1, s1, w2, s2 = w
    ref = moe_reference_quantized(x.view(torch.float8_e4m3fn), xs, idx, tw, (w1, s1), (w2, s2), activation_clamp=clamp,
                                  numerics=Numerics.sm90_kernel(mma="h200_wgmma", block_m=k.last_design.block_m))
    _assert_bitwise(y, ref)


@pytest.mark.parametrize("case", ["one_row_wide", "all_wide"])
def test_wide_weight_scales(case):
    """Weight scales far apart: one row per GEMM with a K group 20 binades below the rest, or
    every scale drawn from [100, 121] instead of [119, 121]. Same checks as the other cases, and
    the L2 pool byte by byte (a scale applied to the wrong row or group breaks them)."""
    shape, T = TINY, 64
    w = list(make_weights(shape["E"], shape["H"], shape["I"], "cuda", seed=7,
                          **({} if case == "one_row_wide" else {"sf_lo": 100, "sf_hi": 121})))
    if case == "one_row_wide":
        w[1][1, 37, 2] -= 20  # L1 row 37 (gate) of expert 1, K group 2
        w[3][2, 200, 1] -= 20  # L2 row 200 of expert 2, K group 1
    k = MegaMoEKernel(shape["E"], shape["K"], shape["H"], shape["I"], T, prepare_weights(*w))
    x, xs, idx, tw = make_inputs(T, shape["E"], shape["K"], shape["H"], "cuda", seed=5)
    y = k(x, xs, idx, tw)
    k.check()
    ref, l2_in = reference_sm90(x, xs, idx, tw, *w, return_l2_input=True, block_m=k.last_design.block_m)
    c = compare(y, ref)
    assert c["nan"] == 0 and c["rel_l2"] <= REL_L2_TOL, c
    e_kernel = compare(y, reference_exact(x, xs, idx, tw, *w))["rel_l2"]
    e_ref = compare(ref, reference_exact(x, xs, idx, tw, *w))["rel_l2"]
    assert e_kernel <= e_ref * 1.05 + 1e-6, (e_kernel, e_ref)
    a = l2_pool_agreement(k, l2_in)
    assert a["bytes_equal"] >= 0.99 and a["max_error_top_ulps"] <= 1.0 and a["scales_equal"] >= 0.999, a


def test_weight_fold_drops_groups_far_below_the_row():
    """The SM90 weight fold (Numerics.sm90_kernel(), megamoe.layouts.fold_e2m1_scales_for_sm90)
    where it differs from the per-32 numerics: in every third L1 row the first 32-group holds a
    single 0.5 at K = 0, with its scale 40 binades above the row's other groups, and x[:, 0] = 0;
    so that group contributes nothing but sets the row's s_max, and the other groups (d = 40 ->
    table row 19, zeros) vanish: the rows' gate/up is 0 in the fold, not in the per-32 numbers.
    In every third row from 1 an all-zero group carries the largest scale byte (254) and must not
    set s_max. The kernel must follow the fold (reference_sm90), far from the per-32 result."""
    from megamoe.reference import Numerics, moe_reference_quantized
    shape, T = TINY, 64
    w1, s1, w2, s2 = make_weights(shape["E"], shape["H"], shape["I"], "cuda", seed=9)
    w1[:, 0::3, :16] = 0
    w1[:, 0::3, 0] = 0x01                 # code 1 (0.5) at K = 0, code 0 at K = 1
    s1[:, 0::3, 0] += 40
    w1[:, 1::3, 16:32] = 0
    s1[:, 1::3, 1] = 254
    k = MegaMoEKernel(shape["E"], shape["K"], shape["H"], shape["I"], T, prepare_weights(w1, s1, w2, s2))
    x, xs, idx, tw = make_inputs(T, shape["E"], shape["K"], shape["H"], "cuda", seed=5)
    x[:, 0] = 0
    y = k(x, xs, idx, tw)
    k.check()
    ref = reference_sm90(x, xs, idx, tw, w1, s1, w2, s2, block_m=k.last_design.block_m)
    per32 = moe_reference_quantized(x.view(torch.float8_e4m3fn), xs, idx, tw, (w1, s1), (w2, s2),
                                    numerics=Numerics.sm90())
    c = compare(y, ref)
    assert c["nan"] == 0 and c["rel_l2"] <= REL_L2_TOL, c
    assert compare(per32, ref)["rel_l2"] > 0.1  # the fold really changes these numbers


def test_deterministic_and_pool():
    k, inp, y1 = _check(TINY, 150)
    y2 = k(*inp)
    k.check()
    assert torch.equal(y1.view(torch.int16), y2.view(torch.int16))
    # L1 pool after dispatch: byte-identical rows/scales for every routed item (folded per 64-K
    # group as the pull copies them, 128 at block_m 128: check.fold_x)
    x, xs, idx, tw = inp
    fx, fxs = fold_x(x, xs, L1_X_FOLD_K[k.last_design.block_m])
    pool, pool_sf, tok, slot = k.pool_contents()
    flat = idx.reshape(-1)
    valid = (tok >= 0)
    rows = valid.nonzero().squeeze(1)
    got = set()
    for r in rows.tolist():
        t, s = int(tok[r]), int(slot[r])
        if t < x.shape[0] and s >= 0 and int(idx[t, s]) >= 0:
            got.add((t, s))
    # check bytes of the rows written by this call
    n_items = int((flat >= 0).sum())
    assert len(got) >= n_items
    for r in rows.tolist()[:50]:
        t, s = int(tok[r]), int(slot[r])
        assert torch.equal(pool[r], fx[t])
        assert torch.equal(pool_sf[r], fxs[t])


@pytest.mark.parametrize("block_m", [16, 128])
def test_stale_pool_rows(block_m):
    """A call writes only its valid pool rows; the rows past a block's valid ones hold whatever
    the memory held. Random bytes there change no output bit, and the L1 epilogue writes zeros
    into those rows of the L2 pool (kernel v8.2: their accumulators zeroed before the SwiGLU,
    which stale NaN or huge values sent down its slow path). The padding rows counted on the
    host: per expert with c > 0 items, ceil(c / block_m) * block_m - c."""
    E, K, H, I = TINY["E"], TINY["K"], TINY["H"], TINY["I"]
    w = make_weights(E, H, I, "cuda", seed=7)
    k = MegaMoEKernel(E, K, H, I, 100, prepare_weights(*w), block_m=block_m)  # fresh pools
    inp = make_inputs(100, E, K, H, "cuda", seed=4)
    y0 = k(*inp).clone()
    k.check()
    k.scramble_pool_data(seed=0)
    y1 = k(*inp)
    k.check()
    assert torch.equal(y0.view(torch.int16), y1.view(torch.int16))
    counts = torch.bincount(inp[2].reshape(-1).long().cpu(), minlength=E).tolist()
    want_pad = sum(-(-c // block_m) * block_m - c for c in counts if c > 0)
    tok = k._ws["pool_token"].view(-1, block_m)
    pad = (tok < 0) & (tok >= 0).any(dim=1, keepdim=True)  # rows of used blocks without a token
    assert int(pad.sum()) == want_pad > 0
    l2 = k._ws["l2_pool"].view(-1, block_m, I)
    assert int((l2[pad] != 0).sum()) == 0


def test_call_leaves_its_counters_clean():
    """The workspace's counters are zero after a call (the kernel's clean-up after the last
    grid sync; the next call relies on it): the expert counts the schedulers read, the sums
    the CTAs add up and, at [2E], the count barrier (kernel v8.5), at [2E + 1] the block ticket
    (two CTAs per SM, v9.3: it ends past the list's length), the arrival counts and the arrival
    masks. During the call the barrier reaches the grid size (264 CTAs here) and the counts hold
    it in their high halves, so a missed reset would show."""
    T = 300
    k, _, _ = _check(FLASH, T, routing="zipf", mask_frac=0.1)
    assert k.last_design.ctas_per_sm == 2
    ws = k._ws
    assert ws["expert_count"].numel() == 2 * FLASH["E"] + 2
    for name in ("expert_count", "arrival", "mask"):
        assert int(ws[name].count_nonzero()) == 0, name


def test_pull_sorts_each_cta_items_by_expert():
    """The EP1 dispatch pulls each CTA's items sorted by expert, stably (kernel v7.9): the
    scratch ``item_order`` holds, at CTA c's first item T K c / S, its valid items (the item
    range [T K c / S, T K (c + 1) / S), kernel v8.5; masked slots left out) ordered by
    (expert, item). Built here by a Python loop; the pool's content is the same as in token
    order (the rows of an expert stay in item order: test_deterministic_and_pool). At 1000
    tokens the item split cuts tokens in two (6000 items over 132 CTAs)."""
    T, K = 1000, FLASH["K"]
    k, inp, _ = _check(FLASH, T, routing="zipf", mask_frac=0.1)
    idx = inp[2].reshape(-1).tolist()
    S = k.last_design.num_ctas
    order = k._ws["item_order"].tolist()
    for c in range(S):
        i0, i1 = T * K * c // S, T * K * (c + 1) // S
        want = sorted((idx[i], i) for i in range(i0, i1) if idx[i] >= 0)
        assert order[i0:i0 + len(want)] == [i for _, i in want], c


@pytest.mark.parametrize("block_m", [None, 128])
def test_activation_fold_of_wide_scales(block_m):
    """The pull's activation fold (x_fold_k = 64; 128 at block_m 128) where it rounds: token
    scales spread so that the smaller 32-group of a pair lies 1..40 binades below the larger
    (every d the FP16 route handles, and past its end), all-zero groups carrying the larger
    scale byte, a NaN-free all-zero pair. The L1 pool must equal check.fold_x byte for byte
    (values and scales) for every routed row, and the output must pass the usual checks."""
    k, w = _kernel(TINY, 64, **({"block_m": block_m} if block_m else {}))
    x, xs, idx, tw = make_inputs(64, TINY["E"], TINY["K"], TINY["H"], "cuda", seed=12)
    x, xs = x.clone(), xs.clone()
    g = torch.Generator(device="cuda").manual_seed(13)
    d = torch.randint(0, 41, xs[:, 1::2].shape, device="cuda", generator=g).to(torch.int32)
    xs[:, 1::2] = (xs[:, 1::2].to(torch.int32) - d).clamp(0, 254).to(torch.uint8)  # the odd group of each pair
    x[0::5, 0:32] = 0                      # an all-zero group ...
    xs[0::5, 0] = 254                      # ... with the largest scale byte: must not set s_max
    x[1::5, 64:128] = 0                    # an all-zero pair: copied as is
    k(x, xs, idx, tw)
    k.check()
    k.forget_pool_rows()                   # rows of earlier calls stay in the pool; run again
    y = k(x, xs, idx, tw)
    k.check()
    bm = k.last_design.block_m
    fx, fxs = fold_x(x, xs, L1_X_FOLD_K[bm])
    assert not torch.equal(fx, x)          # the fold really rounds here
    pool, pool_sf, tok, slot = k.pool_contents()
    rows = [(r, int(tok[r])) for r in range(pool.shape[0]) if int(tok[r]) >= 0 and int(slot[r]) >= 0]
    assert len(rows) == int((idx >= 0).sum())
    for r, t in rows:
        assert torch.equal(pool[r], fx[t]), (r, t)
        assert torch.equal(pool_sf[r], fxs[t]), (r, t)
    ref = reference_sm90(x, xs, idx, tw, *w, block_m=bm)
    c = compare(y, ref)
    assert c["nan"] == 0 and c["rel_l2"] <= REL_L2_TOL, c


def test_trace_block_order():
    k, w = _kernel(FLASH, 256)
    x, xs, idx, tw = make_inputs(256, 256, 6, 4096, "cuda", seed=3)
    y, recs = k(x, xs, idx, tw, trace=True)
    des = k.last_design
    counts = torch.bincount(idx[idx >= 0].long(), minlength=256).tolist()
    rows = block_list(counts, des.block_m, 2 * 2048 // 128, 4096 // 128, des.experts_per_wave, des.num_ctas,
                      wave_lag=wave_lag(des.ctas_per_sm))
    got = block_order(recs)
    assert k.last_trace_dropped == 0 and des.num_ctas == 2 * k.num_sms  # two CTAs per SM at 256 tokens
    # by ticket (kernel v9.3): every block once, each CTA's in list order; the faster CTA of an SM
    # takes more of them, so the CTAs' counts differ (the static deal gives 48 or 49 to each)
    assert ticket_order_violation(got, rows) is None, ticket_order_violation(got, rows)
    # the list's order is the wave-lag order (kernel v9.4), not MegaMoEScheduler's: some CTA runs a
    # wave's L2 block after a later wave's L1 block
    plain = block_list(counts, des.block_m, 2 * 2048 // 128, 4096 // 128, des.experts_per_wave, des.num_ctas)
    assert wave_lag(des.ctas_per_sm) and ticket_order_violation(got, plain) is not None
    per = sorted(len(v) for v in got.values())
    assert len(got) == des.num_ctas and per[-1] - per[0] > 2, per
    static = block_sequence(counts, des.block_m, 2 * 2048 // 128, 4096 // 128, des.experts_per_wave, des.num_ctas)
    assert got != static
    kinds = {r["kind"] for r in recs}
    assert {"count", "pull", "l1_mma", "l1_epilogue", "l2_mma", "l2_epilogue", "combine"} <= kinds
    # records kept on the GPU and decoded later: a run by ticket again (which CTA takes which
    # block differs from call to call), the same output bits
    y2 = k(x, xs, idx, tw, trace="device")
    assert ticket_order_violation(block_order(k.fetch_trace()), rows) is None
    assert torch.equal(y.view(torch.int16), y2.view(torch.int16))


@pytest.mark.parametrize("T", [1, 64, 1024, 4096])
def test_traced_instance_equals_the_untraced_one_and_records_every_block(T):
    """A traced call runs another template instance (kernel v9.13: the untraced one holds no trace
    code) and returns the same output bits; its consumer records, two a block written from the top
    of each CTA's buffer, hold every block of the plan once, in the plan's order (by ticket at two
    CTAs per SM, the static deal at one), each MMA record followed by its epilogue's."""
    k, _ = _kernel(FLASH, 4096)
    x, xs, idx, tw = make_inputs(T, 256, 6, 4096, "cuda", seed=7)
    y0 = k(x, xs, idx, tw)
    y1, recs = k(x, xs, idx, tw, trace=True)
    des = k.last_design
    _assert_bitwise(y1, y0)
    assert k.last_trace_dropped == 0
    counts = torch.bincount(idx[idx >= 0].long(), minlength=256).tolist()
    args = (counts, des.block_m, 2 * 2048 // 128, 4096 // 128, des.experts_per_wave, des.num_ctas)
    got = block_order(recs)
    if des.ctas_per_sm == 2:
        rows = block_list(*args, wave_lag=wave_lag(2))
        assert ticket_order_violation(got, rows) is None, ticket_order_violation(got, rows)
    else:
        static = block_sequence(*args)
        assert got == {c: v for c, v in static.items() if v}
    part = {}
    for r in recs:
        if r["role"] == "consumer":
            part.setdefault(r["kind"][3:], {})[(r["kind"][:2], r["cta"], r["expert"], r["m_block"], r["n_block"])] = r
    assert set(part) == {"mma", "epilogue"} and part["mma"].keys() == part["epilogue"].keys()
    assert len(part["mma"]) == sum(map(len, got.values()))
    assert all(r["t_end_ns"] == part["epilogue"][b]["t_start_ns"] for b, r in part["mma"].items())


@pytest.mark.parametrize("shape,T", [(TINY, 33), (FLASH, 1), (FLASH, 64)])
def test_cuda_graph_replays_bitwise(shape, T):
    """A captured call (MegaMoEKernel.capture) replays bit for bit what an eager call returns, for
    new inputs filled in place, and still after eager calls of another design replaced the
    kernel's workspace (the graph keeps its own)."""
    k, _ = _kernel(shape, 256)
    E, K, H = shape["E"], shape["K"], shape["H"]
    g = k.capture(T)
    for seed in (3, 4):
        inp = make_inputs(T, E, K, H, "cuda", seed=seed, mask_frac=0.1)
        g.fill(*inp)
        y = g.replay().clone()
        g.check()
        _assert_bitwise(y, k(*inp))
        k.check()
        other = make_inputs(200, E, K, H, "cuda", seed=seed)  # another design: a new workspace
        k(*other)
        k.check()
        assert k._ws is not g.workspace
        torch.cuda.synchronize()
        _assert_bitwise(g.replay(), y)  # the same filled inputs, replayed after the eager calls
        g.check()


@pytest.mark.parametrize("ctas", [None, 1])
def test_timeout_is_an_error(ctas):
    """A wait that gives up is a readable error, never a hang, and the kernel stays usable: at two
    CTAs per SM (this shape's rule; blocks by ticket, kernel v9.3: the producer warps and the
    consumer warps leave together through their named barriers' AND) and at one."""
    k, w = _kernel(TINY, 32, timeout_s=0.2, ctas_per_sm=ctas)
    x, xs, idx, tw = make_inputs(32, 8, 2, 256, "cuda")
    assert k.design(32).ctas_per_sm == (2 if ctas is None else 1)
    k.fault_inject = 1  # dispatch never bumps the arrival counts
    try:
        k(x, xs, idx, tw)
        # the first wait to time out names the error: the producer waiting for the arrival
        # count, or one further down the chain (an L2 block waiting for the L1 mask bits of
        # that pool block) when it started waiting earlier; both seen on the H200
        with pytest.raises(KernelError, match="arrival count|arrival-mask bits"):
            k.check()
    finally:
        k.fault_inject = 0
    # the kernel stays usable after the error
    y = k(x, xs, idx, tw)
    k.check()
    ref = reference_sm90(x, xs, idx, tw, *w, block_m=k.last_design.block_m)
    assert compare(y, ref)["rel_l2"] <= REL_L2_TOL


def test_plan_driven_launch():
    """Launch numbers taken from megamoe.plan (design megamoe-sm90); executed order == plan."""
    plan_mod = pytest.importorskip("megamoe.plan")
    from megamoe.kernel import design_from_plan
    k, w = _kernel(FLASH, 256)
    x, xs, idx, tw = make_inputs(256, 256, 6, 4096, "cuda", seed=5)
    p = plan_mod.build_plan(num_experts=256, top_k=6, hidden=4096, intermediate=2048, num_ranks=1,
                            tokens_per_rank=[256], max_tokens_per_rank=256, topk_idx=[idx.cpu().numpy()],
                            num_sms=k.num_sms, design="megamoe-sm90")
    y, recs = k(x, xs, idx, tw, trace=True, design=design_from_plan(p))
    got = block_order(recs)
    assert p.ranks[0].num_sms == k.last_design.num_ctas == 2 * k.num_sms  # the plan's units are the CTAs
    assert p.ranks[0].block_tickets and p.ranks[0].wave_lag  # the CTAs take the plan's rows by ticket
    rows = [tuple(map(int, r[:4])) for r in p.ranks[0].blocks()]
    assert ticket_order_violation(got, rows) is None, ticket_order_violation(got, rows)
    c = compare(y, reference_sm90(x, xs, idx, tw, *w, block_m=k.last_design.block_m))
    assert c["rel_l2"] <= REL_L2_TOL and c["nan"] == 0, c


def test_fewest_stages():
    """One stage per producer warp is the floor (megamoe.design_sm90.min_stages): at it the
    outputs equal the default stage count's bit for bit; below it the design raises a one-line
    InputError, and a design passed around it is refused by the launcher (code -5), never
    launched (2 and 3 stages at block_m 16 crashed the kernel before the check: fourteenth
    session)."""
    import dataclasses

    from megamoe.errors import InputError
    x, xs, idx, tw = make_inputs(40, 8, 2, 256, "cuda", seed=4)
    for bm, fewest in ((16, 4), (128, 2)):
        k_def, _ = _kernel(TINY, 40, block_m=bm)
        k_min, _ = _kernel(TINY, 40, block_m=bm, num_stages=fewest)
        y_def = k_def(x, xs, idx, tw).clone()
        k_def.check()
        y_min = k_min(x, xs, idx, tw)
        k_min.check()
        assert k_min.last_design.num_stages == fewest < k_def.last_design.num_stages
        assert torch.equal(y_min, y_def), bm
    k_low, _ = _kernel(TINY, 40, block_m=16, num_stages=3)
    # (two CTAs per SM here: (115712 - 3072) // 11264 = 10 stages fit half an SM's shared memory)
    with pytest.raises(InputError, match=r"^num_stages: expected an integer in \[4, 10\] .*got 3$"):
        k_low(x, xs, idx, tw)
    bad = dataclasses.replace(k_def.design(40), num_stages=1)  # block_m 128's design, one stage
    with pytest.raises(KernelError, match=r"producer warps .* <= stages <= 16\) \(code -5\)"):
        k_def(x, xs, idx, tw, design=bad)
    k16, _ = _kernel(TINY, 40, block_m=16)
    bad16 = dataclasses.replace(k16.design(40), num_stages=3)
    with pytest.raises(KernelError, match=r"\(code -5\)"):
        k16(x, xs, idx, tw, design=bad16)


def test_two_ctas_per_sm_equal_one():
    """Kernel v9.2: at block_m 16 two CTAs share each SM (the wide walk too since v9.5) (design_sm90.ctas_per_sm),
    264 on the H200, and take their blocks by ticket (v9.3). Each output row's arithmetic does not
    depend on the CTA that runs it, so the output is bit for bit the one-CTA launch's (same stages
    and waves given to both), whichever CTA took which block. The launcher
    refuses two CTAs where the instance does not exist (code -11) and more CTAs than SMs x
    ctas_per_sm (code -2)."""
    import dataclasses

    two, _ = _kernel(FLASH, 512)
    one, _ = _kernel(FLASH, 512, ctas_per_sm=1)
    # from 3 tokens on V4-Flash (design_sm90.PAIR_MAX_ONE_CTA_WAVE, session 40); at 3 and 6 the
    # two-CTA wide instance (kernel v9.5: 256 / 128 experts per wave, the count barrier) against
    # the one-CTA wide one (the local count)
    for T in (3, 6, 13, 64, 512):
        inp = make_inputs(T, 256, 6, 4096, "cuda", seed=T, mask_frac=0.05)
        des = two.design(T)
        assert (des.block_m, des.ctas_per_sm, des.num_ctas) == (16, 2, 2 * two.num_sms), T
        y2 = two(*inp).clone()
        two.check()
        y1 = one(*inp, design=dataclasses.replace(des, ctas_per_sm=1))
        one.check()
        _assert_bitwise(y2, y1)
    x, xs, idx, tw = make_inputs(1024, 256, 6, 4096, "cuda", seed=1)
    big, _ = _kernel(FLASH, 1024)
    d32 = big.design(1024)
    assert (d32.block_m, d32.ctas_per_sm) == (32, 1)
    with pytest.raises(KernelError, match=r"ctas_per_sm must be 1, or 2 at block_m 16 .*\(code -11\)"):
        big(x, xs, idx, tw, design=dataclasses.replace(d32, ctas_per_sm=2))
    with pytest.raises(KernelError, match=r"\(code -2\)"):
        big(x, xs, idx, tw, design=dataclasses.replace(d32, num_sms=2 * big.num_sms))
    y = big(x, xs, idx, tw)  # still usable after the refusals
    big.check()
    assert y.isfinite().all()


@pytest.mark.parametrize("shape,T,routing,kw", [
    ({"E": 1, "K": 1, "H": 128, "I": 128}, 5, "uniform", {}),  # one expert, one K block per GEMM
    ({"E": 8, "K": 8, "H": 128, "I": 128}, 9, "uniform", {}),  # top-k = every expert
    ({"E": 16, "K": 4, "H": 512, "I": 128}, 50, "uniform", {"block_m": 128}),  # mostly-empty 128-row blocks
    (TINY, 100, "uniform", {"num_sms": 1}),  # the whole schedule on one SM
    (TINY, 100, "uniform", {"num_sms": 3, "block_m": 128}),
    (TINY, 100, "uniform", {"experts_per_wave": 1}),
    (FLASH, 128, "uniform", {"experts_per_wave": 256}),  # one wave of every expert
    (FLASH, 64, "uniform", {"num_sms": 5, "block_m": 128}),
    (FLASH, 2000, "one_expert", {"block_m": 16}),  # 125+ pool blocks of one expert
    (FLASH, 4096, "uniform", {"block_m": 32, "num_stages": 4}),  # the stage floor at full size
])
def test_plan_edges(shape, T, routing, kw):
    """Edges of the plan a caller may choose (fourteenth session's probe, all measured correct
    on the H200): the output within the reference tolerance, error vs exact math no worse than
    the reference's own."""
    k, _, _ = _check(shape, T, routing=routing, seed=2, **kw)
    for name, v in kw.items():
        assert getattr(k.last_design, name) == v, name


def test_megamoe_run_times_the_call_as_a_cuda_graph(capsys):
    """`megamoe run` (cli_support.run_main) also times the call as a CUDA graph and says whether
    the replay's output is bitwise the eager call's; the check against the reference passes."""
    from megamoe.kernel.cli_support import run_main
    rc = run_main(num_experts=8, topk=2, hidden=256, inter=128, tokens=33, reps=3)
    out = capsys.readouterr().out
    assert rc == 0, out
    line = next(ln for ln in out.splitlines() if ln.startswith("as a CUDA graph (MegaMoEKernel.capture): "))
    assert line.endswith("output bitwise equal to the eager call's: True"), line
    assert "-> OK" in out and "100.0000% of outputs bitwise equal" in out, out
