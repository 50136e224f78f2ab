"""The H200 FP8 WGMMA accumulation model (megamoe.reference.h200_wgmma_partials): hand-derived
cases, the tensor core's own results (a probe on the H200, tests/data), and the two references
that use it (megamoe.reference and megamoe.kernel.check) against each other."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from megamoe import reference as R
from megamoe.errors import InputError
from megamoe.kernel import check

DATA = Path(__file__).parent / "data" / "h200_wgmma_probe.npz"
ROOT = Path(__file__).resolve().parents[1]


def _step(a: list[float], b: list[float], group: int = 32) -> float:
    """One group of the model on a single row / column: a, b padded with zeros to `group`."""
    av = torch.zeros(1, group, dtype=torch.float64)
    bv = torch.zeros(1, group, dtype=torch.float64)
    av[0, :len(a)] = torch.tensor(a, dtype=torch.float64)
    bv[0, :len(b)] = torch.tensor(b, dtype=torch.float64)
    return float(R.h200_wgmma_partials(av, bv, group)[0, 0, 0])


def test_hand_derived_steps():
    # 16 x 16 = 2^8 (exponents 4 + 4) sets E = 8: the unit is 2^(8 - 13) = 2^-5, so 0.125 x 0.125
    # = 2^-6 truncates to 0 (exactly: 256.015625, an FP32 value)
    assert _step([16, 0.125], [16, 0.125]) == 256.0
    # 128 x 128 = 2^14 (E = 14, unit 2): 3 x 1 = 3 -> 2 twice: 16388 (exact 16390), which has
    # 14 significant bits
    assert _step([128, 3, 3], [128, 1, 1]) == 16388.0
    # a negative product truncates toward zero: -3 -> -2 (exact 16381)
    assert _step([128, -3], [128, 1]) == 16382.0
    # the sum carries into 2^15: 32770 truncated to 14 significant bits (unit 4) is 32768
    assert _step([128, 128, 3], [128, 128, 1]) == 32768.0
    # and toward zero for a negative sum
    assert _step([-128, -128, -3], [128, 128, 1]) == -32768.0
    # a subnormal operand counts as exponent -6, whatever its value: 2^-9 x 256 = 2^-1 has
    # exponent -6 + 8 = 2, so the unit is 2^-11 and 1.125 x 2^-5 x 2^-5 = 2^-10 + 2^-13 keeps
    # only 2^-10 (aligned to the value's exponent -1 it would be exact)
    assert _step([2.0 ** -9, 1.125 * 2.0 ** -5], [256, 2.0 ** -5]) == 0.5 + 2.0 ** -10
    # zeros never set the exponent: a lone small product is exact
    assert _step([0, 0.015625], [448, 0.015625]) == 2.0 ** -12


def test_chained_steps_align_to_the_accumulator():
    # a 64-K group is two chained k32 steps: the first step's 16388 (exponent 14, unit 2) makes
    # the second step's 0.25 products (0.5 x 0.5) truncate to nothing, though 32 of them sum
    # to 8 exactly; the same products in the first step alone survive
    a = [128, 3, 3] + [0] * 29 + [0.5] * 32
    b = [128, 1, 1] + [0] * 29 + [0.5] * 32
    assert _step(a, b, 64) == 16388.0
    assert _step([0.5] * 32, [0.5] * 32) == 8.0
    # exact float64 would give 16398
    assert sum(x * y for x, y in zip(a, b)) == 16398.0


def test_matches_the_tensor_core_bit_for_bit():
    """24 tiles of the H200 probe (benchmarks/device/wgmma_acc_probe.cu; 6 of each operand kind
    of benchmarks/wgmma_acc_fit.py), 1024 results per tile and variant: one k32 step from zero,
    two chained, four chained -- every result equal to the model's."""
    d = np.load(DATA)
    e4m3 = torch.tensor(d["a"]).view(torch.float8_e4m3fn).to(torch.float64)
    tok = torch.tensor(d["b"]).view(torch.float8_e4m3fn).to(torch.float64)
    for v, width in enumerate((32, 64, 128)):
        got = torch.stack([R.h200_wgmma_partials(e4m3[t, :, :width], tok[t, :, :width], width)[0]
                           for t in range(len(d["tile"]))])
        want = torch.tensor(d["d"][:, v])
        assert torch.equal(got.view(torch.int32), want.view(torch.int32)), v
    # and not exact sums: the model is needed (about 1 in 8 of the L1-like sums differ)
    exact = torch.einsum("tmk,tnk->tmn", e4m3[:, :, :32], tok[:, :, :32]).to(torch.float32)
    assert (exact != torch.tensor(d["d"][:, 0])).double().mean() > 0.05


def test_fit_script_reproduces_the_probe_with_the_kept_model(tmp_path, load_script):
    """The fitting script's own (numpy) implementation of the kept model, including one step
    onto a given FP32 accumulator (variant 3, which h200_wgmma_partials never needs)."""
    fit = load_script("benchmarks/wgmma_acc_fit.py")
    d = np.load(DATA)
    align, bits, final = next(iter(fit.MODELS.values()))
    m0 = fit.step(d["a"], d["b"], 0, None, align, bits, final)
    m1 = fit.step(d["a"], d["b"], 1, m0, align, bits, final)
    m3 = fit.step(d["a"], d["b"], 0, d["c"].astype(np.float64), align, bits, final)
    assert (m0 == d["d"][:, 0]).all() and (m1 == d["d"][:, 1]).all() and (m3 == d["d"][:, 3]).all()
    # and the models it rejects really fail on the same data
    for name, (al, bi, fi) in list(fit.MODELS.items())[1:]:
        assert (fit.step(d["a"], d["b"], 0, d["c"].astype(np.float64), al, bi, fi) != d["d"][:, 3]).any(), name


def test_bad_arguments():
    a = torch.zeros(2, 64, dtype=torch.float64)
    with pytest.raises(InputError, match="group"):
        R.h200_wgmma_partials(a, a, 48)
    with pytest.raises(InputError, match="group"):
        R.h200_wgmma_partials(a, a, 128)
    with pytest.raises(InputError, match="b_vals"):
        R.h200_wgmma_partials(a, torch.zeros(2, 32, dtype=torch.float64), 32)
    with pytest.raises(InputError, match="numerics.mma"):
        R.Numerics.sm90_kernel(mma="fast")
    with pytest.raises(InputError, match="numerics.mma"):
        R.Numerics("sm100", mma="h200_wgmma")
    with pytest.raises(InputError, match="numerics.mma"):
        R.Numerics("sm90", "row", "row", mma="h200_wgmma")
    w = check.make_weights(2, 64, 32, "cpu")
    x, xs, idx, tw = check.make_inputs(3, 2, 1, 64, "cpu")
    with pytest.raises(InputError, match="mma"):
        check.reference_sm90(x, xs, idx, tw, *w, mma="h100")
    with pytest.raises(InputError, match="numerics.mma"):
        R.Numerics.sm90_kernel(mma=["exact"])
    with pytest.raises(InputError, match="packed"):  # W1 of another hidden size
        check.gemm_sm90_h200(x, xs, w[0][0][:, :16], w[1][0][:, :1])


@pytest.mark.parametrize("clamp,T,seed,block_m", [(None, 40, 1, None), (0.05, 33, 2, None), (None, 40, 1, 128),
                                                  (0.05, 33, 2, 128)])
def test_two_references_agree_bitwise(clamp, T, seed, block_m):
    """megamoe.reference.moe_reference_quantized(Numerics.sm90_kernel(mma="h200_wgmma")) and
    megamoe.kernel.check.reference_sm90(mma="h200_wgmma") fold, scale and accumulate with
    separate code: the same bits, at block_m 128 too (x folded per 128 and four chained k32
    steps per L1 partial, the L2 input per 64). And the model changes the numbers (vs
    mma="exact"), and so does block_m 128's fold."""
    E, K, H, I = 4, 2, 256, 128
    w1, s1, w2, s2 = check.make_weights(E, H, I, "cpu", seed=seed)
    x, xs, idx, tw = check.make_inputs(T, E, K, H, "cpu", seed=seed)
    num = R.Numerics.sm90_kernel(mma="h200_wgmma", block_m=block_m)
    got = R.moe_reference_quantized(x.view(torch.float8_e4m3fn), xs, idx, tw, (w1, s1), (w2, s2),
                                    activation_clamp=clamp, numerics=num)
    want = check.reference_sm90(x, xs, idx, tw, w1, s1, w2, s2, clamp=clamp, mma="h200_wgmma", block_m=block_m)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    exact = check.reference_sm90(x, xs, idx, tw, w1, s1, w2, s2, clamp=clamp, block_m=block_m)
    assert not torch.equal(exact.view(torch.int16), want.view(torch.int16))
    assert check.compare(want, exact)["rel_l2"] < 1e-2
    if block_m == 128:
        per64 = check.reference_sm90(x, xs, idx, tw, w1, s1, w2, s2, clamp=clamp, mma="h200_wgmma")
        assert not torch.equal(per64.view(torch.int16), want.view(torch.int16))
        assert check.compare(want, per64)["rel_l2"] < 1e-2


def test_sm90_kernel_numerics_follow_block_m():
    """Numerics.sm90_kernel(block_m=...): the L1 fold of design_sm90.L1_X_FOLD_K (128 at
    block_m 128, else 64), the L2 input per 64; bad block_m and l2_x_fold_k refused."""
    k64, k128 = R.Numerics.sm90_kernel(block_m=64), R.Numerics.sm90_kernel(block_m=128)
    assert (k64.x_fold_k, k64.l2_x_fold_k, k64.group_k) == (64, None, 64)
    assert k64 == R.Numerics.sm90_kernel()
    assert (k128.x_fold_k, k128.l2_x_fold_k, k128.group_k) == (128, 64, 128)
    assert k128.for_l2() == k64 and k64.for_l2() is k64
    for bad in (48, True, "128", [128], 128.0):
        with pytest.raises(InputError, match="^block_m: expected None or one of \\[16, 32, 64, 128\\]"):
            R.Numerics.sm90_kernel(block_m=bad)
    with pytest.raises(InputError, match="^numerics.l2_x_fold_k: expected None unless w_fold_k is 'row'"):
        R.Numerics("sm90", 64, 64, l2_x_fold_k=128)  # needs weights folded per row
    for bad in ("row", 48, 0, True):
        with pytest.raises(InputError, match="^numerics.l2_x_fold_k: expected None or a positive multiple of 32, "):
            R.Numerics("sm90", "row", 64, w_fold_top=6, l2_x_fold_k=bad)
    w = check.make_weights(2, 64, 32, "cpu")
    x, xs, idx, tw = check.make_inputs(3, 2, 1, 64, "cpu")
    for bad in (48, [128], True):
        with pytest.raises(InputError, match="^block_m: expected None or one of"):
            check.reference_sm90(x, xs, idx, tw, *w, block_m=bad)
    with pytest.raises(InputError, match=r"^x: expected E4M3 bytes \[T, H\] with H a multiple of 128 .*, got shape \(3, 64\)$"):
        check.reference_sm90(x, xs, idx, tw, *w)
    w = check.make_weights(2, 128, 128, "cpu")
    x, xs, idx, tw = check.make_inputs(3, 2, 1, 128, "cpu")
    with pytest.raises(InputError, match=r"^w1: expected \[E, 2I, H/2\]"):
        check.reference_sm90(x, xs, idx, tw, w[0][:, :, :32], *w[1:])
    with pytest.raises(InputError, match=r"^topk_idx: expected expert ids in \[-1, 2\), got 2"):
        check.reference_sm90(x, xs, idx.clone().fill_(2), tw, *w)
    assert check.reference_sm90(x, xs, idx, tw, *w, block_m=128).shape == (3, 128)


def test_fold_per_128_by_hand():
    """check.fold_x and megamoe.layouts.fold_e4m3_scales_for_sm90 at fold 128 (the L1 pool at
    block_m 128) on one row of four 32-groups, all values 1.0 in groups 0-2 with scales 2^0,
    2^2, 2^-1 and group 3 zeros: every nonzero group re-encoded at the largest scale 2^2 (1.0 x
    2^-2 = 0.25, 1.0, 1.0 x 2^-3 = 0.125), the zeros kept, all four scale bytes 129. Per 64
    (the other block_m): groups 0-1 at 129 (0.25, 1.0), groups 2-3 at 126 (1.0, zeros)."""
    from megamoe.layouts import fold_e4m3_scales_for_sm90
    one, zero = torch.tensor(1.0).to(torch.float8_e4m3fn).view(torch.uint8), torch.tensor(0, dtype=torch.uint8)
    q = torch.cat([one.repeat(96), zero.repeat(32)]).reshape(1, 128)
    sf = torch.tensor([[127, 129, 126, 120]], dtype=torch.uint8)

    def vals(b):
        return b.view(torch.float8_e4m3fn).float().reshape(4, 32)[:, 0].tolist()

    for fold, want_v, want_s in ((128, [0.25, 1.0, 0.125, 0.0], [129] * 4), (64, [0.25, 1.0, 1.0, 0.0], [129, 129, 126, 126])):
        for f, fs in (check.fold_x(q, sf, fold), fold_e4m3_scales_for_sm90(q, sf, fold=fold)):
            assert vals(f) == want_v and fs.tolist() == [want_s]


def test_fit_script_bad_input_is_one_line_exit_2(tmp_path):
    import subprocess
    script = str(ROOT / "benchmarks" / "wgmma_acc_fit.py")
    good = tmp_path / "in.bin"
    r = subprocess.run([sys.executable, script, "make", str(good)], capture_output=True, text=True, check=False)
    assert r.returncode == 0 and good.stat().st_size == 4 + 512 * (64 * 128 + 16 * 128 + 64 * 16 * 4)
    short = tmp_path / "out.bin"
    short.write_bytes(b"\0" * 100)
    for args, field in ((["fit", str(tmp_path / "missing.bin"), str(short)], "missing.bin"),
                        (["fit", str(good), str(short)], "outp: expected 2097152 float32 results"),
                        (["fit", str(short), str(short)], "inp: expected a file written by 'make'"),
                        (["make", str(tmp_path / "x.bin"), "--seed", "-1"], "--seed: expected a non-negative"),
                        (["fit", str(good), str(short), "--json", str(tmp_path / "no" / "x.json")], "--json: expected")):
        r = subprocess.run([sys.executable, script, *args], capture_output=True, text=True, check=False)
        assert r.returncode == 2 and field in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "x.bin").exists()


def test_model_refuses_what_is_not_e4m3():
    """E4M3 *bytes* (uint8) read as numbers would give nonsense: refused, like values E4M3 cannot
    hold, NaN, a 1-D tensor or a non-tensor."""
    ok = torch.zeros(2, 32)
    for a, field in ((torch.full((2, 32), 0x38, dtype=torch.uint8), "a_vals: expected a 2-D float tensor"),
                     (torch.full((2, 32), 0.3), "a_vals: expected E4M3 values"),
                     (torch.full((2, 32), float("nan")), "a_vals: expected E4M3 values"),
                     (torch.full((2, 32), 1000.0), "a_vals: expected E4M3 values"),
                     (torch.zeros(32), "a_vals: expected a 2-D float tensor"),
                     ([0.0] * 32, "a_vals: expected a 2-D float tensor")):
        with pytest.raises(InputError, match=field):
            R.h200_wgmma_partials(a, ok, 32)
    with pytest.raises(InputError, match="max_chunk_bytes"):
        R.h200_wgmma_partials(ok, ok, 32, max_chunk_bytes="x")
    # float8 tensors are taken as they are
    a = torch.zeros(1, 32)
    a[0, :3] = torch.tensor([128.0, 3, 3])
    b = torch.zeros(1, 32)
    b[0, :3] = torch.tensor([128.0, 1, 1])
    assert float(R.h200_wgmma_partials(a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn), 32)[0, 0, 0]) == 16388.0
