"""GPU-free tests of the kernel side: design numbers, scheduler oracle, trace decoding, build."""

import csv
import ctypes
import dataclasses
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
from megamoe.errors import InputError
import pytest

from megamoe import design_sm90 as d
import importlib

kbuild = importlib.import_module("megamoe.kernel.build")
from megamoe.kernel.schedule import block_sequence
from megamoe.kernel.trace import RECORD_DTYPE, decode_trace, block_order, to_chrome


def test_block_m_rule():
    assert d.block_m_for(0.02) == 16
    assert d.block_m_for(24) == 32
    assert d.block_m_for(96) == 128
    assert d.block_m_for(500) == 128


def test_stages_fit_smem():
    for bm in d.BLOCK_MS:
        s = d.num_stages_for(bm, 256)
        assert 2 <= s <= d.MAX_STAGES
        assert d.smem_bytes(bm, s, 256) <= d.SMEM_LIMIT_SM90
        assert d.smem_bytes(bm, s + 1, 256) > d.SMEM_LIMIT_SM90 or s == d.MAX_STAGES


def test_pool_rows():
    assert d.pool_rows_for(8192, 6, 256, 128) % 128 == 0
    assert d.pool_rows_for(8192, 6, 256, 128) >= 8192 * 6 + 256 * 127


def test_design_for_v4_flash():
    des = d.design_for(8192, 4096, 2048, 256, 6)
    # by hand: stage = token tile 128x128 + packed weights 128 x 64 + weight scales 128 x 4
    # + FP32 token scales 2 x 128 x 4 = 26112 -> 26624 B (1024-B aligned; no decoded weights:
    # they go to registers); fixed = 1024 + align128(256 x 12 + 64) + the epilogue scratch
    # 20 x 128 x 4 = 1024 + 3200 + 10240 = 14464 -> 15360; (232448 - 15360) // 26624 = 8 fit,
    # and the default at block_m 128 is 5 of them (STAGES_DEFAULT, measured faster)
    assert d.stage_bytes(128) == 26624 and d.fixed_bytes(128, 256) == 15360
    assert d.num_stages_for(128, 256) == 8 and d.STAGES_DEFAULT == {128: 5}
    assert des.block_m == 128 and des.block_n == 128 and des.num_stages == 5
    assert des.smem_bytes == 15360 + 5 * 26624
    # an override still reaches every stage that fits
    assert d.design_for(8192, 4096, 2048, 256, 6, num_stages=8).num_stages == 8
    assert 256 % des.experts_per_wave == 0


def test_experts_per_wave_counts_only_experts_with_tokens():
    # V4-Flash EP1 (E 256, k 6, 2I/128 = 32 L1 n blocks, 132 SMs): the smallest divisor w of
    # 256 with w x P(expert has a token) x m blocks x 32 >= 2 x 132, P = 1 - exp(-T*6/256)
    # T = 1: P = 1 - exp(-0.0234375) = 0.023165 -> w >= 264 / (32 * 0.023165) = 356.1: none, 256
    # T = 16: P = 1 - exp(-0.375) = 0.312711 -> w >= 26.38 -> 32
    # T = 64: P = 1 - exp(-1.5) = 0.776870 -> w >= 10.62 -> 16
    # T = 512 (block_m 16, ceil(12 / 16) = 1 m block): P = 0.999994 -> w >= 8.25005 -> 16
    # T = 8192 (block_m 128, ceil(192 / 128) = 2 m blocks): w >= 4.125 -> 8
    # no tokens: no wave ever fills, one wave of all 256
    for T, bm, w in [(1, 16, 256), (16, 16, 32), (64, 16, 16), (512, 16, 16), (8192, 128, 8), (0, 16, 256)]:
        assert d.experts_per_wave_for(256, T * 6 / 256, bm, 2048, 132) == w, T
        if T in (1, 8192):  # one CTA per SM there (the wide walk, block_m 128)
            assert d.design_for(T, 4096, 2048, 256, 6).experts_per_wave == w, T
    # a threshold case: 33 SMs need 2 x 33 = 66 L1 blocks; at P = 1 - exp(-1) = 0.632121,
    # w = 4 gives 4 x 0.632121 x 32 = 80.9 >= 66 but w = 2 gives 40.5 < 66
    assert d.experts_per_wave_for(256, 1.0, 16, 2048, 33) == 4


def test_two_ctas_per_sm_at_block_m_16():
    """Kernel v9.2: block_m 16 at one rank runs 2 x 132 CTAs where the one-CTA wave rule gives at
    most 128 experts per wave (design_sm90.PAIR_MAX_ONE_CTA_WAVE). Their waves follow the same
    rule over 264 CTAs (uncapped since kernel v9.5, whose two-CTA instances have the wide walk):
    T = 16: w >= 2 x 264 / (32 x 0.312711) = 52.8 -> 64; T = 64: 528 / (32 x 0.776870) = 21.2 ->
    32; T = 512: 528 / (32 x 0.999994) = 16.5 -> 32. Stages: half of 233472 less the 1024-B
    reserve = 115712 B per CTA, (115712 - 6144) // 11264 = 9 fit, 8 by default."""
    assert d.pair_smem_limit() == 115712
    assert d.fixed_bytes(16, 256) == 6144 and d.stage_bytes(16) == 11264
    for T, w in [(16, 64), (64, 32), (512, 32)]:
        des = d.design_for(T, 4096, 2048, 256, 6)
        assert (des.block_m, des.ctas_per_sm, des.num_sms, des.num_ctas) == (16, 2, 132, 264), T
        assert (des.experts_per_wave, des.num_stages) == (w, 8), T
        assert des.smem_bytes == 6144 + 8 * 11264
    assert d.design_for(64, 4096, 2048, 256, 6, num_stages=9).num_stages == 9
    with pytest.raises(InputError, match=r"^num_stages: expected an integer in \[4, 9\]"):
        d.design_for(64, 4096, 2048, 256, 6, num_stages=10)
    # one CTA per SM: 256-expert one-CTA waves (1-2 tokens), block_m >= 32, EP > 1, or asked for
    for kw in ({"num_tokens": 2}, {"num_tokens": 1}, {"num_tokens": 1024}, {"num_tokens": 64, "ranks": 2},
               {"num_tokens": 64, "ctas_per_sm": 1}):
        kw = {"hidden": 4096, "inter": 2048, "num_experts": 256, "topk": 6, **kw}
        des = d.design_for(**kw)
        assert des.ctas_per_sm == 1 and des.num_ctas == 132, kw
    assert d.design_for(64, 4096, 2048, 256, 6, ctas_per_sm=1).experts_per_wave == 16  # the one-CTA rule
    assert d.design_for(64, 4096, 2048, 256, 6, ctas_per_sm=1).num_stages == 16
    with pytest.raises(InputError, match=r"^ctas_per_sm: expected 1 at block_m 32, 1 rank\(s\) \(block_m is not 16"):
        d.design_for(1024, 4096, 2048, 256, 6, ctas_per_sm=2)
    with pytest.raises(InputError, match=r"^ctas_per_sm: expected 1 at block_m 16, 2 rank\(s\) \(not one rank"):
        d.design_for(64, 4096, 2048, 256, 6, ranks=2, ctas_per_sm=2)
    with pytest.raises(InputError, match=r"^ctas_per_sm: expected 1 or 2 \(or unset: the kernel's rule\), got 3$"):
        d.design_for(64, 4096, 2048, 256, 6, ctas_per_sm=3)
    assert [d.ctas_per_sm(16, w, r) for w, r in ((32, 1), (128, 1), (256, 1), (32, 2))] == [2, 2, 1, 1]
    assert [d.ctas_per_sm(bm, 8, 1) for bm in (32, 64, 128)] == [1, 1, 1]
    assert [d.pair_fits(16, r) for r in (1, 2)] == [True, False]
    assert not any(d.pair_fits(bm, 1) for bm in (32, 64, 128))


def test_two_ctas_from_a_one_cta_wave_of_128_experts():
    """The switch to two CTAs per SM (session 40: design_sm90.PAIR_MAX_ONE_CTA_WAVE = 128) on
    V4-Flash EP1, by hand. The one-CTA wave rule takes the smallest divisor w of 256 with
    w x (1 - exp(-6T/256)) x 32 L1 n blocks >= 2 x 132: T = 2: 264 / (32 x 0.045793) = 180.2 ->
    256 experts, one CTA (the wide walk, the local count); T = 3: 264 / (32 x 0.067898) = 121.5
    -> 128, two CTAs, whose waves follow the rule over 264 CTAs: 528 / (32 x 0.067898) = 243.0 ->
    256, the wide walk at two CTAs (kernel v9.5), which counts locally too since v9.7; T = 6: 528 / (32 x
    0.131185) = 125.8 -> 128. Two CTAs may be asked for at 1 token, with any wave."""
    kw = {"hidden": 4096, "inter": 2048, "num_experts": 256, "topk": 6}
    assert math.isclose(-math.expm1(-12 / 256), 0.045793, abs_tol=1e-6)
    assert math.isclose(-math.expm1(-18 / 256), 0.067898, abs_tol=1e-6)
    assert math.isclose(-math.expm1(-36 / 256), 0.131185, abs_tol=1e-6)
    two, three, six = d.design_for(2, **kw), d.design_for(3, **kw), d.design_for(6, **kw)
    assert (two.ctas_per_sm, two.experts_per_wave, two.num_stages) == (1, 256, 16)
    assert d.local_count(two.block_m, two.experts_per_wave, 1)
    assert (three.ctas_per_sm, three.experts_per_wave, three.num_stages) == (2, 256, 8)
    assert d.wide_walk(three.block_m, three.experts_per_wave)
    assert d.local_count(three.block_m, three.experts_per_wave, 1)
    assert (six.ctas_per_sm, six.experts_per_wave) == (2, 128)
    assert [d.design_for(T, **kw).ctas_per_sm for T in range(1, 17)] == [1] * 2 + [2] * 14
    forced = d.design_for(1, **kw, ctas_per_sm=2)
    assert (forced.ctas_per_sm, forced.experts_per_wave, forced.num_ctas) == (2, 256, 264)
    assert d.design_for(8, **kw, experts_per_wave=32, ctas_per_sm=2).experts_per_wave == 32


def _all_blocks(counts, bm, n1, n2):
    blocks = set()
    for e, c in enumerate(counts):
        for m in range((c + bm - 1) // bm):
            blocks |= {(1, e, m, n) for n in range(n1)} | {(2, e, m, n) for n in range(n2)}
    return blocks


def test_ticket_order_violation():
    """A run by ticket: every row of the list once, each CTA's rows at growing list positions."""
    from megamoe.kernel.schedule import block_list, ticket_order_violation

    counts = [20, 0, 5]  # block_m 16: expert 0 two m blocks, expert 2 one; 2 L1 and 3 L2 n blocks
    rows = block_list(counts, 16, 2, 3, 3, 2)
    assert len(rows) == 3 * 2 + 3 * 3 and rows[0] == (1, 0, 0, 0) and rows[-1] == (2, 2, 0, 2)
    assert ticket_order_violation(block_sequence(counts, 16, 2, 3, 3, 2), rows) is None  # the static deal
    uneven = {0: rows[:10:2] + rows[10:], 1: rows[1:10:2]}  # CTA 0 took rows 0, 2, .., 8 and 10-14
    assert ticket_order_violation(uneven, rows) is None
    assert ticket_order_violation({0: rows[:5], 1: rows[6:]}, rows) == "1 block(s) never run, e.g. (1, 2, 0, 1)"
    assert ticket_order_violation({0: rows, 1: rows[3:4]}, rows) == "1 block(s) run more than once"
    assert ticket_order_violation({0: [rows[2], rows[1]], 1: rows[3:]}, rows) == \
        "CTA 0 ran (1, 0, 0, 1) (list position 1) after position 2"  # m-major: m 0 n 1
    assert ticket_order_violation({0: [(1, 1, 0, 0)]}, rows) == "CTA 0 ran (1, 1, 0, 0), which is not in the block list"


def _lag_seek_port(counts, block_m, n1, n2, epw, t, c):
    """A line-by-line port of the two-CTA producer's wave-lag cursor (``Producer::lag_seek`` in
    csrc/megamoe/kernel_sm90.cu, kernel v9.4) and of the block the walk then returns
    (``Scheduler::seek`` + ``next``): ticket ``t`` -> (phase, expert, m, n, pool block), or None
    past the list; ``c`` the cursor dict, carried from the CTA's previous ticket."""
    E = len(counts)
    mb = [-(-x // block_m) for x in counts]

    def wave_m_blocks(w0):
        return sum(mb[w0:min(w0 + epw, E)])

    while t >= c["hi"]:
        if c["ph"] == 0:
            nw, l1 = 0, True
        elif c["ph"] == 1:
            if c["w"] == 0 and epw < E:
                nw, l1 = epw, True
            else:
                nw, l1 = (0 if c["w"] == 0 else c["w"] - epw), False
        elif c["w"] + 2 * epw < E:
            nw, l1 = c["w"] + 2 * epw, True
        elif c["w"] + epw < E:
            nw, l1 = c["w"] + epw, False
        else:
            return None
        if l1:
            c["pp"], c["pm"] = c["lp"], c["lm"]
            c["lp"] = 0 if c["lw"] < 0 else c["lp"] + c["lm"]
            c["lw"], c["lm"] = nw, wave_m_blocks(nw)
            c["pool"], m = c["lp"], c["lm"] * n1
        else:
            last = nw == c["lw"]
            c["pool"], m = (c["lp"], c["lm"] * n2) if last else (c["pp"], c["pm"] * n2)
        c["ph"], c["w"], c["lo"], c["hi"] = (1 if l1 else 2), nw, c["hi"], c["hi"] + m
    idx, num_n = t - c["lo"], (n1 if c["ph"] == 1 else n2)
    first = 0  # m blocks of the wave's experts before the one holding idx
    for e in range(c["w"], min(c["w"] + epw, E)):
        if (first + mb[e]) * num_n > idx:
            m = (idx - first * num_n) // num_n
            return c["ph"], e, m, idx - first * num_n - m * num_n, c["pool"] + first + m
        first += mb[e]
    raise AssertionError("the cursor's pass does not hold the ticket")


@pytest.mark.parametrize("epw", [1, 2, 3, 8])
def test_wave_lag_cursor_port_takes_the_plans_rows(epw):
    """Every ticket of the list, taken by CTAs in growing runs (each CTA's cursor only moves
    forward), maps to the row of the plan's wave-lag list (megamoe.kernel.schedule.block_list,
    wave_lag=True) and to that block's pool block (the expert's first pool block plus m); the
    ticket after the last maps to none."""
    from megamoe.kernel.schedule import block_list

    rng = np.random.default_rng(epw)
    counts = rng.integers(0, 40, 8).tolist()
    counts[2] = 0  # an expert without rows (and, at epw 1, a wave without blocks)
    rows = block_list(counts, 16, 4, 6, epw, 5, wave_lag=True)
    first_pool = np.concatenate([[0], np.cumsum(-(-np.asarray(counts) // 16))])
    for ctas in (1, 3, 7):
        for cta in range(ctas):
            c = {"lo": 0, "hi": 0, "ph": 0, "w": 0, "pool": 0, "lw": -1, "lp": 0, "lm": 0, "pp": 0, "pm": 0}
            for t in range(cta, len(rows), ctas):
                ph, e, m, n, pool = _lag_seek_port(counts, 16, 4, 6, epw, t, c)
                assert (ph, e, m, n) == rows[t] and pool == first_pool[e] + m, (t, rows[t])
            assert _lag_seek_port(counts, 16, 4, 6, epw, len(rows) + cta, c) is None


@pytest.mark.parametrize("epw", [1, 3, 8])
def test_schedule_covers_every_block_once(epw):
    rng = np.random.default_rng(0)
    counts = rng.integers(0, 40, 8).tolist()
    seq = block_sequence(counts, 16, 4, 6, epw, 5)
    flat = [b for s in seq.values() for b in s]
    assert len(flat) == len(set(flat))
    assert set(flat) == _all_blocks(counts, 16, 4, 6)
    # per CTA: L2 blocks of a wave come after that wave's L1 blocks
    for s in seq.values():
        waves = [(b[1] // epw, b[0]) for b in s]
        assert waves == sorted(waves)


def test_trace_decode_roundtrip():
    cap = 4
    raw = np.zeros((2, cap), dtype=RECORD_DTYPE)
    raw[0, 0] = (3, (2 << 16) | 6, 5, 1, 7, 0, 16, 0, 1000, 2000)
    raw[1, 0] = (9, (2 << 16) | 9, 5, 1, 3, 0, 16, 1, 1500, 2500)
    recs = decode_trace(raw.view(np.uint64).reshape(2, cap, 6), np.array([1, 1]), cap)
    assert recs[0]["kind"] == "l1_mma" and recs[0]["role"] == "consumer" and recs[0]["sm"] == 3
    assert recs[0]["t_start_ns"] == 0 and recs[1]["t_end_ns"] == 1500
    assert block_order(recs) == {0: [(1, 5, 1, 7)], 1: [(2, 5, 1, 3)]}
    assert any(e["ph"] == "X" for e in to_chrome(recs)["traceEvents"])
    # the shared columnar schema (megamoe compare's input): sm = CTA index, names -> codes
    from megamoe.kernel.trace import to_schema
    from megamoe.trace import KIND, ROLE
    t = to_schema(recs)
    assert t.cols["sm"].tolist() == [0, 1] and t.cols["role"].tolist() == [ROLE["consumer"]] * 2
    assert t.cols["kind"].tolist() == [KIND["l1_mma"], KIND["l2_mma"]] and t.cols["t_end_ns"].tolist() == [1000, 1500]


def test_load_library_file_binds_a_second_copy(tmp_path):
    """A library file loaded on its own (an A/B of two builds in one process) is bound and
    ABI-checked like the cached one, and stays a separate object."""
    if kbuild.find_nvcc() is None:
        pytest.skip("nvcc not installed")
    from megamoe.kernel.runtime import KernelError, Params, load_library_file

    r = kbuild.build("sm_90a")
    copy = tmp_path / "other" / r.path.name
    copy.parent.mkdir()
    copy.write_bytes(r.path.read_bytes())
    lib = load_library_file(copy)
    assert lib.megamoe_sm90_abi_size() == ctypes.sizeof(Params)
    assert lib.megamoe_sm90_smem_bytes(128, 7, 256) == d.smem_bytes(128, 7, 256)
    # a build older than the mirror (fields appended since): refused unless older_prefix,
    # and a build newer than the mirror always
    from megamoe.kernel import select

    class Longer(ctypes.Structure):
        _fields_ = [("base", Params), ("appended", ctypes.c_int64)]

    class Shorter(ctypes.Structure):
        _fields_ = [("head", ctypes.c_byte * (ctypes.sizeof(Params) - 8))]

    real = select.PATHS["sm_90a"]
    try:
        select.PATHS["sm_90a"] = dataclasses.replace(real, params=lambda: Longer)
        with pytest.raises(KernelError, match=rf"= {ctypes.sizeof(Params)} B, ctypes mirror Longer = "
                                              rf"{ctypes.sizeof(Params) + 8} B"):
            load_library_file(copy)
        assert load_library_file(copy, older_prefix=True).megamoe_sm90_abi_size() == ctypes.sizeof(Params)
        select.PATHS["sm_90a"] = dataclasses.replace(real, params=lambda: Shorter)
        with pytest.raises(KernelError, match="ABI mismatch"):
            load_library_file(copy, older_prefix=True)
    finally:
        select.PATHS["sm_90a"] = real
    with pytest.raises(OSError):
        load_library_file(tmp_path / "missing.so")
    with pytest.raises(kbuild.KernelBuildError, match="^arch: expected one of"):
        load_library_file(copy, "sm_80")


def test_build_sm90a_and_resources():
    if kbuild.find_nvcc() is None:
        pytest.skip("nvcc not installed")
    r = kbuild.build("sm_90a")
    assert r.path.exists()
    # each block_m three times: untraced (no trace code, kernel v9.13), traced and the profile
    # instance (fault_inject bit 32), block_m 32 without the untraced one (design_sm90.UNTRACED_INSTANCE);
    # block_m 16 three times more with the wide walk (Scheduler's WIDE), at two CTAs per SM
    # (CTAS = 2) and at two CTAs with the wide walk (kernel v9.5)
    assert set(r.resources) == {f"block_m={b}{v}{t}" for b, v in [(b, "") for b in d.BLOCK_MS] +
                                [(16, ",wide"), (16, ",pair"), (16, ",wide,pair")] for t in ("", ",traced", ",profile")
                                if t or d.UNTRACED_INSTANCE[b]}
    assert len(r.resources) == 20
    # whole-kernel spills stay under the caps (the hot loop itself is checked on the SASS): the
    # one-CTA instances under SPILL_LIMIT_BYTES, the two-CTA ones (64 registers at launch, the
    # dispatch warps on 32) under PAIR_SPILL_LIMIT_BYTES, and they do spill (else their split
    # would leave registers unused)
    assert not r.over_spill_limit(), r.resources
    for name, res in r.resources.items():
        pair = ",pair" in name
        assert res["spill_stores"] <= (kbuild.PAIR_SPILL_LIMIT_BYTES if pair else kbuild.SPILL_LIMIT_BYTES), name
        assert res["registers"] == (64 if pair else 128), (name, res)
    assert kbuild.spill_limit("block_m=16,pair") == kbuild.PAIR_SPILL_LIMIT_BYTES
    assert kbuild.spill_limit("block_m=16") == kbuild.SPILL_LIMIT_BYTES
    lib = ctypes.CDLL(str(r.path))
    lib.megamoe_sm90_smem_bytes.restype = ctypes.c_longlong
    for bm in d.BLOCK_MS:
        s = d.num_stages_for(bm, 256)
        assert lib.megamoe_sm90_smem_bytes(bm, s, 256) == d.smem_bytes(bm, s, 256)
    # the design's mirrors of the kernel's compile-time choices
    assert {bm: lib.megamoe_sm90_wgmmas_in_flight(bm) for bm in d.BLOCK_MS} == d.WGMMAS_IN_FLIGHT
    assert lib.megamoe_sm90_wgmmas_in_flight(48) == -1
    assert {bm: lib.megamoe_sm90_wgmma_n_step(bm) for bm in d.BLOCK_MS} == {bm: d.WGMMA_N_STEP.get(bm, bm) for bm in d.BLOCK_MS}
    assert lib.megamoe_sm90_wgmma_n_step(48) == -1
    assert {bm: lib.megamoe_sm90_l1_x_fold_k(bm) for bm in d.BLOCK_MS} == d.L1_X_FOLD_K
    assert lib.megamoe_sm90_l1_x_fold_k(48) == -1
    assert {bm: lib.megamoe_sm90_combine_slots(bm) for bm in d.BLOCK_MS} == d.COMBINE_SLOTS
    assert lib.megamoe_sm90_combine_slots(48) == -1
    assert lib.megamoe_sm90_combine_slots_wide() == d.COMBINE_SLOTS_WIDE
    assert {bm: bool(lib.megamoe_sm90_relay_release(bm)) for bm in d.BLOCK_MS} == d.RELAY_RELEASE
    assert lib.megamoe_sm90_relay_release(48) == -1
    # kernel v9.8: the ring's first fill paced by arrivals at block_m 16 (4 stages per SM in flight)
    assert {(bm, c): lib.megamoe_sm90_first_fill(bm, c) for bm in d.BLOCK_MS for c in (1, 2)} \
        == {(bm, c): d.first_fill_stages(bm, c) for bm in d.BLOCK_MS for c in (1, 2)}
    assert (lib.megamoe_sm90_first_fill(16, 1), lib.megamoe_sm90_first_fill(16, 2), lib.megamoe_sm90_first_fill(32, 1)) \
        == (4, 2, 0)
    assert lib.megamoe_sm90_first_fill(48, 1) == -1 and lib.megamoe_sm90_first_fill(16, 3) == -1
    assert {bm: bool(lib.megamoe_sm90_walk_in_epilogue(bm)) for bm in d.BLOCK_MS} == d.WALK_IN_EPILOGUE
    assert lib.megamoe_sm90_walk_in_epilogue(48) == -1
    assert {bm: bool(lib.megamoe_sm90_block_descriptors(bm)) for bm in d.BLOCK_MS} == d.BLOCK_DESCRIPTORS
    assert {bm: bool(lib.megamoe_sm90_untraced_instance(bm)) for bm in d.BLOCK_MS} == d.UNTRACED_INSTANCE
    assert lib.megamoe_sm90_untraced_instance(48) == -1
    assert lib.megamoe_sm90_block_descriptors(48) == -1
    assert [lib.megamoe_sm90_block_tickets(c) for c in (0, 1, 2, 3)] == [-1, int(d.block_tickets(1)),
                                                                     int(d.block_tickets(2)), -1] == [-1, 0, 1, -1]
    # the consumers either take descriptors or walk (inside the epilogue or after it), never both
    assert not any(d.BLOCK_DESCRIPTORS[bm] and d.WALK_IN_EPILOGUE[bm] for bm in d.BLOCK_MS)
    assert {(bm, w): lib.megamoe_sm90_wide_walk(bm, w) for bm in d.BLOCK_MS for w in (1, 32, 33, 256)} == \
        {(bm, w): int(d.wide_walk(bm, w)) for bm in d.BLOCK_MS for w in (1, 32, 33, 256)}
    assert lib.megamoe_sm90_wide_walk(16, 33) == 1 and lib.megamoe_sm90_wide_walk(16, 32) == 0
    assert lib.megamoe_sm90_wide_walk(48, 64) == -1
    assert {(bm, w, r): lib.megamoe_sm90_local_count(bm, w, r) for bm in d.BLOCK_MS for w in (32, 33) for r in (1, 2)} \
        == {(bm, w, r): int(d.local_count(bm, w, r)) for bm in d.BLOCK_MS for w in (32, 33) for r in (1, 2)}
    assert lib.megamoe_sm90_local_count(16, 33, 1) == 1 and lib.megamoe_sm90_local_count(16, 33, 2) == 0
    assert lib.megamoe_sm90_local_count(48, 64, 1) == -1
    assert {bm: lib.megamoe_sm90_producer_warps(bm) for bm in d.BLOCK_MS} == d.PRODUCER_ISSUE_WARPS
    assert lib.megamoe_sm90_producer_warps(48) == -1
    regs = [lib.megamoe_sm90_role_registers(i) for i in range(4)]
    assert regs == [d.REGS_DISPATCH, d.REGS_PRODUCER, d.REGS_CONSUMER, -1]
    assert [lib.megamoe_sm90_role_registers_at(i, 1) for i in range(3)] == regs[:3]
    assert [lib.megamoe_sm90_role_registers_at(i, 2) for i in range(4)] == [*d.PAIR_REGS, -1]
    assert lib.megamoe_sm90_role_registers_at(0, 3) == -1
    # setmaxnreg: the four warpgroups' registers fill the SM's 65536 (128 threads each), at two
    # CTAs per SM each CTA's half
    assert 128 * (d.REGS_DISPATCH + d.REGS_PRODUCER + 2 * d.REGS_CONSUMER) == 65536
    assert 128 * (d.PAIR_REGS[0] + d.PAIR_REGS[1] + 2 * d.PAIR_REGS[2]) == 65536 // 2
    from megamoe.kernel.runtime import Params
    assert lib.megamoe_sm90_abi_size() == ctypes.sizeof(Params)


def _routing(rng, T, E, K):
    return np.stack([rng.permutation(E)[:K] for _ in range(T)]).astype(np.int64) if T else np.zeros((0, K), np.int64)


@pytest.mark.parametrize("E,K,H,I,T", [(8, 2, 256, 128, 33), (256, 6, 4096, 2048, 4096)])
def test_design_from_plan_takes_the_plan_numbers(E, K, H, I, T):
    """The kernel's launch numbers come from megamoe.plan (design megamoe-sm90)."""
    plan_mod = pytest.importorskip("megamoe.plan")
    rng = np.random.default_rng(T)
    idx = _routing(rng, T, E, K)
    p = plan_mod.build_plan(num_experts=E, top_k=K, hidden=H, intermediate=I, num_ranks=1, tokens_per_rank=[T],
                            max_tokens_per_rank=T, topk_idx=[idx], num_sms=132, design="megamoe-sm90")
    r = p.ranks[0]
    from megamoe.kernel.runtime import design_from_plan
    des = design_from_plan(p)
    assert (des.block_m, des.num_stages, des.experts_per_wave, des.num_sms) == (
        r.config.block_m, r.num_stages, r.experts_per_wave, p.num_sms)
    assert des.pool_rows >= int(r.pool_block_offset[-1]) * des.block_m
    # the plan's what-ifs are the model's, not the kernel's: refused by name
    kw = dict(num_experts=E, top_k=K, hidden=H, intermediate=I, num_ranks=1, tokens_per_rank=[T],
              max_tokens_per_rank=T, topk_idx=[idx], num_sms=132, design="megamoe-sm90")
    bm = r.config.block_m
    kernel_step = min(bm, d.WGMMA_N_STEP.get(bm, bm))
    other = 8 if kernel_step != 8 else 16  # a what-if step other than the kernel's
    for what, msg in (({"k_split": 2}, "k_split 1"), ({"combine_relay": True}, "no combine relay"),
                      ({"wgmma_n_step": other}, "the kernel's WGMMA N step")):
        if "k_split" in what and (I // 128) % 2:
            continue  # one L2 K block: no split to refuse
        with pytest.raises(InputError, match=f"^plan: expected {msg}"):
            design_from_plan(plan_mod.build_plan(**kw, **what))
    # the kernel's own step as a what-if (at or past block_m: whole blocks) is taken
    assert design_from_plan(plan_mod.build_plan(**kw, wgmma_n_step=kernel_step)).block_m == bm
    if kernel_step == bm:
        assert design_from_plan(plan_mod.build_plan(**kw, wgmma_n_step=128)).block_m == bm


@pytest.mark.parametrize("clamp,sf_lo", [(None, 119), (0.05, 119), (None, 100), (0.05, 100)])
def test_kernel_check_reference_equals_numerics_sm90_kernel(clamp, sf_lo):
    """The GPU tests compare the kernel with check.reference_sm90 (float64 GEMMs of the folded
    operands); megamoe.reference.moe_reference_quantized(numerics=Numerics.sm90_kernel()) is a
    second implementation of both folds that rounds every 64-deep partial sum to FP32 and sums
    those in FP32, as the kernel does. With weight scales in [119, 121] the two are bitwise
    equal; with [100, 121] (21 binades) a weight row's folded values need more bits than FP32
    keeps of a 64-deep sum, and at most one output in 10,000 differs, by one BF16 ulp (seen: 1
    of 10,240). The weight fold is exact for [119, 121] and the numbers equal the per-32
    weight numerics (``Numerics(w_fold_k=None, x_fold_k=64)``); for [100, 121] groups more than
    14 binades below their row's largest round, and they differ."""
    torch = pytest.importorskip("torch")
    ref = pytest.importorskip("megamoe.reference")
    from megamoe.kernel.check import make_weights, make_inputs, reference_sm90
    w1, s1, w2, s2 = make_weights(8, 256, 128, "cpu", seed=3, sf_lo=sf_lo)
    x, xs, idx, tw = make_inputs(40, 8, 2, 256, "cpu", seed=4, mask_frac=0.2)
    a = reference_sm90(x, xs, idx, tw, w1, s1, w2, s2, clamp=clamp)
    q = x.view(torch.float8_e4m3fn)
    b = ref.moe_reference_quantized(q, xs, idx, tw, (w1, s1), (w2, s2),
                                    activation_clamp=clamp, numerics=ref.Numerics.sm90_kernel())
    ulps = (a.view(torch.int16).int() - b.view(torch.int16).int()).abs()
    if sf_lo == 119:
        assert int(ulps.max()) == 0
    else:
        assert int(ulps.max()) <= 1 and int((ulps > 0).sum()) <= a.numel() // 10_000, int((ulps > 0).sum())
    k = ref.Numerics.sm90_kernel()
    per32_w = ref.moe_reference_quantized(q, xs, idx, tw, (w1, s1), (w2, s2), activation_clamp=clamp,
                                          numerics=ref.Numerics("sm90", None, k.x_fold_k))
    assert torch.equal(b.view(torch.int16), per32_w.view(torch.int16)) == (sf_lo == 119)


def test_trace_capacity_by_hand():
    from types import SimpleNamespace

    from megamoe.kernel.trace import trace_capacity

    # 384 pool rows / block_m 16 = 24 pool blocks x (2*2048/128 + 4096/128 = 64) = 1536 blocks
    # over 132 CTAs -> 12 each, 4 records per block + 8 fixed + 64 slack
    d = SimpleNamespace(pool_rows=384, block_m=16)
    assert trace_capacity(d, 2048, 4096, 132, fixed=8) == 4 * 12 + 8 + 64


def test_l2_pool_agreement_detects_flips_and_layout_errors():
    """The GPU test's L2-pool checker on a fake kernel workspace filled from the reference:
    exact -> all equal; one low-bit flip -> a fraction of a top-binade spacing; a row written
    in the wrong order -> many spacings (what a layout bug looks like)."""
    import types
    import torch
    from megamoe.kernel.check import l2_pool_agreement, make_inputs, make_weights, reference_sm90
    E, K, H, I, T = 8, 2, 256, 128, 33
    w = make_weights(E, H, I, "cpu", seed=7)
    x, xs, idx, tw = make_inputs(T, E, K, H, "cpu", seed=3)
    _, l2_in = reference_sm90(x, xs, idx, tw, *w, return_l2_input=True)
    R = 128
    pool = torch.zeros(R, I, dtype=torch.uint8)
    sf = torch.zeros(I // 128, R, 4, dtype=torch.uint8)
    tok = torch.full((R,), -1, dtype=torch.int32)
    slot = tok.clone()
    r = 0
    for t, k, q, qsf in l2_in.values():
        for i in range(t.numel()):
            pool[r], tok[r], slot[r] = q[i], int(t[i]), int(k[i])
            sf[:, r, :] = qsf[i].reshape(I // 128, 4)
            r += 1
    fake = types.SimpleNamespace(_ws=dict(l2_pool=pool, l2_pool_sf=sf, pool_token=tok, pool_slot=slot),
                                 _ws_key=(16, R), I=I)
    a = l2_pool_agreement(fake, l2_in)
    assert a == dict(bytes_equal=1.0, max_error_top_ulps=0.0, scales_equal=1.0, rows=int((idx >= 0).sum()))
    pool[0, 5] ^= 0x01  # lowest mantissa bit: one code
    a = l2_pool_agreement(fake, l2_in)
    assert a["bytes_equal"] == 1 - 1 / (r * I) and 0 < a["max_error_top_ulps"] <= 1.0
    pool[1] = pool[1].flip(0)
    assert l2_pool_agreement(fake, l2_in)["max_error_top_ulps"] > 1.0


def test_record_ranges_split_bottom_and_top_and_drop_what_both_sides_wrote():
    """A CTA's records: the bottom count reserved from slot 0 up (every role's trace_reserve),
    the top count written from the last slot down by the SM90 consumer (two a block: slots cap-2,
    cap-1, then cap-4, cap-3, ...; kernel v9.13). Cases derived by hand: a slot both sides
    reached holds either record, so neither keeps it; records past the capacity were never
    written."""
    from megamoe.errors import InputError
    from megamoe.kernel.trace import record_ranges, trace_dropped
    assert record_ranges(3, 0, 8) == (range(0, 3), range(8, 8), 0)
    assert record_ranges(2, 4, 8) == (range(0, 2), range(4, 8), 0)
    assert record_ranges(4, 4, 8) == (range(0, 4), range(4, 8), 0)  # full, no overlap
    # bottom wrote slots 0-4, top 7,6 / 5,4 / 3,2: slots 2-4 twice -> bottom keeps 0-1, top 5-7
    assert record_ranges(5, 6, 8) == (range(0, 2), range(5, 8), 6)
    assert record_ranges(10, 0, 8) == (range(0, 8), range(8, 8), 2)  # past the capacity
    assert record_ranges(0, 10, 8) == (range(0, 0), range(0, 8), 2)
    assert trace_dropped(np.array([[5, 10, 0], [6, 0, 2]]), 8) == 6 + 2 + 0
    assert trace_dropped(np.array([10, 3]), 8) == 2  # the one-row form: every record from the bottom
    with pytest.raises(InputError, match="trace_cap"):
        record_ranges(1, 1, 0)
    with pytest.raises(InputError, match=r"^bottom, top: expected non-negative record counts, got \(-1, 0\)$"):
        record_ranges(-1, 0, 8)
    # decoded: CTA 0 with one bottom record (slot 0) and a top pair (slots 2, 3 of 4); slot 1,
    # never reserved, holds a stale record and is not read
    cap = 4
    raw = np.zeros((1, cap), dtype=RECORD_DTYPE)
    raw[0, 0] = (3, (1 << 16) | 5, 5, 0, 7, 0, 16, 0, 900, 1000)
    raw[0, 1] = (3, (7 << 16) | 99, 5, 0, 7, 0, 16, 0, 950, 1000)
    raw[0, 2] = (3, (2 << 16) | 6, 5, 0, 7, 0, 16, 0, 1000, 2000)
    raw[0, 3] = (3, (2 << 16) | 7, 5, 0, 7, 0, 16, 0, 2000, 2100)
    recs = decode_trace(raw.view(np.uint64).reshape(1, cap, 6), np.array([[1], [2]], dtype=np.int32), cap)
    assert [(r["role"], r["kind"], r["t_start_ns"]) for r in recs] == [
        ("producer", "l1_load", 0), ("consumer", "l1_mma", 100), ("consumer", "l1_epilogue", 1100)]
    # counted as written, the stale slot is refused with the slot's CTA named, not decoded
    with pytest.raises(InputError, match=r"trace record: expected a role < 3 and a kind < 13 \(CTA 0\)"):
        decode_trace(raw.view(np.uint64).reshape(1, cap, 6), np.array([[2], [2]], dtype=np.int32), cap)
    with pytest.raises(InputError, match=r"counts: expected shape \(1,\) or \(2, 1\)"):
        decode_trace(raw.view(np.uint64).reshape(1, cap, 6), np.array([[1], [2], [0]]), cap)


def test_record_buffers_and_fetch_records_on_a_fake_kernel():
    """The trace plumbing shared by the SM90, SM100 and EP kernels, on CPU tensors: buffers
    are allocated once per size and their counts zeroed each call; fetch checks, decodes the
    written records (times relative to the earliest), counts the dropped ones and needs a
    pending call."""
    import types
    import torch
    from megamoe.errors import InputError
    from megamoe.kernel.trace import fetch_records, record_buffers
    checked = []
    k = types.SimpleNamespace(torch=torch, device=torch.device("cpu"), check=lambda: checked.append(1))
    tr, trc = record_buffers(k, 2, 3)
    assert tr.shape == (2, 3, 6) and tr.dtype == torch.int64 and trc.tolist() == [[0, 0], [0, 0]]
    trc[:] = 7
    tr2, trc2 = record_buffers(k, 2, 3)
    assert tr2 is tr and trc2 is trc and trc.tolist() == [[0, 0], [0, 0]]  # reused, counts zeroed
    raw = np.zeros((2, 3), dtype=RECORD_DTYPE)
    raw[0, 0] = (3, (2 << 16) | 6, 5, 1, 7, 0, 16, 0, 1000, 2000)
    for i in range(3):
        raw[1, i] = (9, (2 << 16) | 9, 5, 1, 3 + i, 0, 16, 1, 1500 + 100 * i, 2500 + 100 * i)
    tr.copy_(torch.from_numpy(raw.view(np.int64).reshape(2, 3, 6)))
    trc[0] = torch.tensor([1, 5], dtype=torch.int32)  # CTA 1 reserved 5 records into room for 3
    k._pending_trace = (tr, trc, 3)
    recs = fetch_records(k, rank=1)
    assert checked == [1] and k._pending_trace is None and k.last_trace_dropped == 2
    assert [(r["rank"], r["sm"], r["kind"], r["n_block"], r["t_start_ns"]) for r in recs] == [
        (1, 3, "l1_mma", 7, 0), (1, 9, "l2_mma", 3, 500), (1, 9, "l2_mma", 4, 600), (1, 9, "l2_mma", 5, 700)]
    # CTA 1's consumer wrote its two records from the top (slots 1, 2), over its bottom's slot 1-2:
    # the bottom keeps slot 0; slots 1-2 were written by both sides, so neither keeps them
    trc[1] = torch.tensor([0, 2], dtype=torch.int32)
    k._pending_trace = (tr, trc, 3)
    recs = fetch_records(k, rank=1)
    assert k.last_trace_dropped == 2 + 2 + 2 and [(r["sm"], r["n_block"]) for r in recs] == [(3, 7), (9, 3)]
    with pytest.raises(InputError, match="a preceding traced call"):
        fetch_records(k)
    assert record_buffers(k, 4, 3)[0].shape == (4, 3, 6)  # another size: new buffers


def test_missing_sources_and_tools_are_setup_errors(monkeypatch, tmp_path, capsys):
    """A wheel install has no csrc/ and a bare machine no nvcc: `megamoe build` says which in
    one line and exits 2 (a setup error), where a failed compile exits 1."""
    from megamoe.kernel.cli_support import build_main

    monkeypatch.setattr(kbuild, "CSRC", tmp_path / "csrc" / "megamoe")
    with pytest.raises(kbuild.BuildSetupError, match=r"^kernel sources: expected .*kernel_sm90\.cu .*got no such file"):
        kbuild.build("sm_90a")
    assert build_main("sm_90a") == 2
    err = capsys.readouterr().err
    assert err.startswith("megamoe: error: kernel sources: expected") and err.count("\n") == 1
    monkeypatch.undo()
    monkeypatch.setenv("MEGAMOE_BUILD_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(kbuild, "find_nvcc", lambda: None)
    assert build_main("sm_90a") == 2
    assert "nvcc not found" in capsys.readouterr().err
    monkeypatch.setattr(kbuild, "find_nvcc", lambda: "/bin/false")  # a compiler that fails
    monkeypatch.setattr(kbuild, "find_cutlass_include", lambda: str(tmp_path))
    assert build_main("sm_90a") == 1
    assert "nvcc failed (1)" in capsys.readouterr().err
    # a build folder that cannot be made (a file in its place, /proc): named, exit 2, nothing compiled
    (tmp_path / "afile").write_text("")
    for bad, why in ((tmp_path / "afile", "Not a directory"), (Path("/proc/megamoe-x"), "No such file or directory")):
        monkeypatch.setenv("MEGAMOE_BUILD_DIR", str(bad))
        assert build_main("sm_90a") == 2
        err = capsys.readouterr().err
        assert err.startswith(f"megamoe: error: MEGAMOE_BUILD_DIR: expected a folder this process can create and "
                              f"write, got {bad}/") and err.endswith(f"({why})\n") and err.count("\n") == 1, err


def test_strict_build_without_cuobjdump_is_a_setup_error(monkeypatch, tmp_path, capsys):
    """`megamoe build --strict` checks the matrix loops' SASS: with no cuobjdump it refuses (one
    line, exit 2) instead of passing with the check skipped; without --strict it still builds.
    On a cached library (a file and its empty ptxas log: nothing compiled here)."""
    from megamoe.kernel.cli_support import build_main

    monkeypatch.setenv("MEGAMOE_BUILD_DIR", str(tmp_path / "cache"))
    lib = kbuild.library_path("sm_90a")
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"")
    lib.with_suffix(".log").write_text("")
    monkeypatch.setattr(kbuild, "find_cuobjdump", lambda: None)
    with pytest.raises(kbuild.BuildSetupError, match=r"^strict: expected cuobjdump .* got none$"):
        kbuild.build("sm_90a", strict=True)
    assert build_main("sm_90a", strict=True) == 2
    err = capsys.readouterr().err
    assert err.startswith("megamoe: error: strict: expected cuobjdump") and err.count("\n") == 1
    assert kbuild.build("sm_90a").cached and build_main("sm_90a") == 0
    # with nothing cached it refuses before compiling (session 43: it used to compile first)
    lib.unlink()

    def no_nvcc(*a, **k):
        raise AssertionError("nvcc ran before the strict build's setup check")
    monkeypatch.setattr(kbuild.subprocess, "run", no_nvcc)
    with pytest.raises(kbuild.BuildSetupError, match=r"^strict: expected cuobjdump .* got none$"):
        kbuild.build("sm_90a", strict=True)


def test_ncu_summary_finds_the_k_loop_and_counts_its_stalls(tmp_path, load_script):
    """benchmarks/device/ncu_summary.py on a hand-made ncu source page: the K loop is the
    smallest backward branch around two QGMMAs (not the outer block loop), instructions per
    K block = the loop's executions / one QGMMA's, stall fractions over the loop's samples."""
    ns = load_script("benchmarks/device/ncu_summary.py")
    hdr = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed",
           "stall_wait", "stall_barrier", "stall_wait (Not Issued)"]
    # (address, source, samples, executed, wait, barrier): outer loop 0x10..0x60, K loop 0x20..0x50
    body = [(0x10, "S2R R0, SR_TID.X", 2, 10, 2, 0),
            (0x20, "LDS R1, [R0]", 4, 80, 4, 0),
            (0x30, "QGMMA.64x16x32.F32.E4M3.E4M3 R8, R1, gdesc[UR4], RZ, !UPT", 6, 80, 6, 0),
            (0x40, "QGMMA.64x16x32.F32.E4M3.E4M3 R8, R2, gdesc[UR4], R8, gsb0", 2, 80, 2, 0),
            (0x45, "WARPGROUP.DEPBAR.LE gsb0, 0x0", 8, 80, 0, 8),
            (0x50, "@P0 BRA 0x20", 0, 80, 0, 0),
            (0x60, "@P1 BRA 0x10", 1, 10, 1, 0)]
    with open(tmp_path / "sass_t64.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Kernel Name", "k"])
        w.writerow(hdr)
        for a, src, n, ex, wt, bar in body:
            w.writerow([hex(a), src, n, ex, wt, bar, 0])
    (tmp_path / "details_t64.txt").write_text("    Issued Warp Per Scheduler                        0.51\n"
                                             "    No Eligible                            %        48.70\n")
    r = ns.summarize(tmp_path / "sass_t64.csv", tmp_path / "details_t64.txt")
    assert r["samples"] == 23
    assert r["k_loop_sample_fraction"] == round(20 / 23, 4)   # 0x20..0x50: 4 + 6 + 2 + 8 + 0
    assert r["k_loop_warp_instructions_per_k_block"] == 5.0   # 5 instructions x 80 / 80
    assert r["k_loop_stalls"] == {"wait": 0.6, "barrier": 0.4}
    assert r["k_loop_top"][0] == {"sass": "WARPGROUP.DEPBAR.LE gsb0, 0x0", "fraction": 0.4, "reason": "barrier"}
    assert r["scheduler"] == {"Issued Warp Per Scheduler": 0.51, "No Eligible": 48.7}


@pytest.mark.parametrize("extra,field", [(["--old-stages", "128:x"], "old-stages"),
                                         (["--old-stages", "128:1"], "old-stages"),
                                         (["--old-stages", "16:3"], "old-stages"),  # below block_m 16's floor
                                         (["--old-stages", "48:7"], "old-stages"),
                                         (["--old-stages", "16:4,16:5"], "old-stages"),  # block_m twice
                                         (["64,x"], "tokens"), (["64", "1"], "rounds"),
                                         (["--new-fault", "1"], "new-fault"),  # the timeout test's bit
                                         (["--new-fault", "-2"], "new-fault"),
                                         (["--new-fault", "2048"], "new-fault"),  # a probe build's bit, not this tree's
                                         (["--new-fault", "8"], "new-fault"),  # no weight loads with the decode on: faults
                                         ([], "device|old_lib")])  # no GPU here, or an empty library file
def test_ab_interleaved_rejects_bad_arguments_before_any_gpu_work(tmp_path, extra, field):
    """benchmarks/device/ab_interleaved.py: a bad token list, round count, per-block_m stage
    map or fault-bit set is a one-line argparse error (exit 2) naming the field, before any
    CUDA set-up."""
    lib = tmp_path / "old.so"
    lib.write_bytes(b"")
    last = _device_script_error(tmp_path, "ab_interleaved.py", str(lib), str(tmp_path / "o.json"), *extra)
    assert re.match(rf"ab_interleaved.py: error: ({field}): expected", last), last


def test_sanitizer_launches_cover_the_ring_wrap_and_the_wide_instance(tmp_path, load_script):
    """benchmarks/device/sanitize_small.py: ``small`` keeps every CTA within one pass of the stage
    ring (racecheck there never sees a stage reused), ``ring`` wraps it several times over, and
    ``wide`` runs the wide instance and wraps it too (the racecheck hazards of session 33 need a
    reused stage). The K blocks per CTA come from the plan's block order (megamoe.kernel.schedule)
    on a routing drawn like the script's (seeded, on the CPU here; the bounds for ``small`` and
    ``ring`` hold for any draw, by counting, ``wide``'s for this one: on the H200 its launch showed
    the hazards). A bad case name or no GPU is a one-line error, exit 2."""
    torch = pytest.importorskip("torch")
    from megamoe.kernel.check import make_inputs
    from megamoe.kernel.schedule import block_sequence

    mod = load_script("benchmarks/device/sanitize_small.py")
    assert set(mod.CASES) == {"small", "wide", "wide_pair", "ring", "pair", "pair_ring", "m128"}
    most, valid = {}, {}
    for name, (E, K, H, I, T, opts, _) in mod.CASES.items():
        des = d.design_for(T, H, I, E, K, **{"num_sms": 132, **opts})  # pair: the H200's 132 SMs
        _, _, idx, _ = make_inputs(T, E, K, H, "cpu", seed=3)
        counts = torch.bincount(idx[idx >= 0].long(), minlength=E).tolist()
        seq = block_sequence(counts, des.block_m, 2 * I // 128, H // 128, des.experts_per_wave, des.num_ctas)
        kb = [sum(H // 128 if ph == 1 else I // 128 for ph, *_ in blocks) for blocks in seq.values()]
        most[name] = (max(kb), des.num_stages, d.wide_walk(des.block_m, des.experts_per_wave))
        valid[name] = {min(des.block_m, c - des.block_m * m) for c in counts for m in range(-(-c // des.block_m))}
        assert des.ctas_per_sm == (2 if "pair" in name else 1), name
    # pair: 264 CTAs, more than the SMs, so CTAs share SMs; pair_ring: 64 tokens on 2 SMs x 2 CTAs:
    # >= 8 x (2 x 8 + 8 x 1) / 4 = 48 K blocks per CTA, over twice its 8 stages (by ticket, kernel
    # v9.3, a CTA runs whichever blocks it takes: the busiest at least that mean)
    assert d.design_for(40, 256, 128, 8, 2, num_sms=132).num_ctas == 2 * 132
    assert most["pair_ring"][0] >= 48 > 2 * most["pair_ring"][1] == 16
    # small: at most 8 experts x (2 L1 n blocks x 2 K blocks + 2 L2 n blocks x 1) = 48 K blocks
    # over 4 CTAs, one m block each: 12 per CTA, within 16 stages
    assert most["small"][0] <= most["small"][1] and not most["small"][2]
    # ring: 128 items on 8 experts (at least one m block each): >= 8 x (2 x 8 + 8 x 1) / 2 = 96
    assert most["ring"][0] >= 96 > 2 * most["ring"][1] and not most["ring"][2]
    assert most["wide"][0] > most["wide"][1] and most["wide"][2], most
    assert most["wide_pair"][2], most  # the two-CTA wide instance (kernel v9.5)
    # m128 (session 51): block_m 128 with full blocks (an expert's rows: binomial, mean 150, sd 10.6)
    # and the remainders, so a WGMMA N per block (kernel v9.12) runs the whole-block variant and
    # narrower ones (which ones: the GPU's draw, not this CPU one)
    assert d.design_for(600, 256, 128, 8, 2, num_sms=4, ctas_per_sm=1, block_m=128).block_m == 128
    classes = {-(-v // 32) for v in valid["m128"]}
    assert 4 in classes and len(classes) >= 2, sorted(valid["m128"])
    assert re.match(r"sanitize_small.py: error: CASE: expected small, wide, wide_pair, ring, pair, pair_ring, m128, got nosuch$",
                    _device_script_error(tmp_path, "sanitize_small.py", "nosuch", "small"))
    from megamoe.kernel import cuda_available

    if not cuda_available():
        assert _device_script_error(tmp_path, "sanitize_small.py", "small") == (
            "sanitize_small.py: error: device: expected a CUDA GPU with sm_90+ visible to torch, got none")


def _device_script_error(tmp_path, script, *args, hide_torch: bool = False) -> str:
    """Run ``benchmarks/device/<script> args`` (``script`` may name a folder above, e.g.
    ``../kernel_bench.py``), with torch hidden from the import system if ``hide_torch``: it must
    exit 2 with one line on stderr (no usage dump, no traceback: megamoe.errors.OneLineArgumentParser)
    and without writing ``tmp_path/o.json``; returns that line."""
    path = str((Path(__file__).resolve().parents[1] / "benchmarks" / "device" / script).resolve())
    cmd = [sys.executable, path, *args]
    if hide_torch:
        cmd = [sys.executable, "-c", "import sys, runpy; sys.modules['torch'] = None; sys.argv = %r; "
               "runpy.run_path(%r, run_name='__main__')" % ([Path(path).name, *args], path)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert p.returncode == 2, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "Traceback" not in p.stderr and not (tmp_path / "o.json").exists()
    return p.stderr.strip()


def test_first_fill_stages_and_its_bad_inputs():
    """megamoe.design_sm90.first_fill_stages (kernel v9.8): four stages per SM in flight during the
    ring's first fill at block_m 16, so 4 per CTA at one CTA per SM and 2 at two; 0 (the whole ring
    at once) at block_m 32-128. Where the C export answers -1 (a block_m or CTA count it has no
    instance for) the Python mirror raises one line naming the field."""
    from megamoe.errors import InputError
    assert [d.first_fill_stages(bm, c) for bm in d.BLOCK_MS for c in (1, 2)] == [4, 2, 0, 0, 0, 0, 0, 0]
    for bad, msg in (((48, 1), "^block_m: expected one of 16, 32, 64, 128, got 48$"),
                     ((None, 1), "^block_m: expected one of 16, 32, 64, 128, got None$"),
                     ((16, 3), "^ctas_per_sm: expected 1 or 2, got 3$"),
                     ((16, 0), "^ctas_per_sm: expected 1 or 2, got 0$"),
                     ((16, 1.5), "^ctas_per_sm: expected 1 or 2, got 1.5$")):
        with pytest.raises(InputError, match=msg):
            d.first_fill_stages(*bad)


def test_stages_floor_is_one_per_producer_warp():
    """megamoe.design_sm90.min_stages / stages_for: a launch needs at least one stage per
    producer warp that issues the ring (4 at block_m 16-64, 2 at 128), at most what fits."""
    from megamoe.errors import InputError
    assert {bm: d.min_stages(bm) for bm in d.BLOCK_MS} == {16: 4, 32: 4, 64: 4, 128: 2}
    assert d.stages_for(16, 256) == d.num_stages_for(16, 256) == 16
    assert d.stages_for(16, 256, 4) == 4 and d.stages_for(128, 256, 2) == 2
    with pytest.raises(InputError) as e:
        d.stages_for(16, 256, 3)
    assert str(e.value) == ("num_stages: expected an integer in [4, 16] (at least one per issuing producer warp, at most what 232448 B "
                            "of shared memory holds at block_m 16), got 3")
    with pytest.raises(InputError, match=r"^num_stages: expected an integer in \[2, 8\] .*got 9$"):
        d.stages_for(128, 256, 9)
    # the EP design takes the same rule
    from megamoe.kernel.ep import design_ep
    with pytest.raises(InputError, match=r"^num_stages: expected an integer in \[4, "):
        design_ep(64, 64, 4096, 2048, 256, 6, 2, 132, block_m=32, num_stages=2)
    # an expert count that leaves room for 3 stages but not 4 at block_m 16: by hand, the
    # largest E with fixed(16, E) + 4 x 11264 <= 232448 is the floor's limit
    most = max(e for e in range(1, 20000) if d.smem_bytes(16, 4, e) <= d.SMEM_LIMIT_SM90)
    assert d.num_stages_for(16, most + 1) == 3
    with pytest.raises(InputError, match=rf"^shape.num_experts: expected at most {most} experts \(their dispatch "
                                         r"tables and 4 pipeline stages at block_m 16 need"):
        d.stages_for(16, most + 1)
    assert d.stages_for(16, most) == 4


def test_pool_buffers_of_both_launches():
    """megamoe.kernel.runtime.pool_buffers: the pools every SM90 launch passes (POOL_FIELDS),
    shaped as csrc/megamoe/params.h lays them out; the one-rank and the EP workspaces both hold
    them (EP adds each row's source rank). By hand for the V4-Flash design at 256 tokens."""
    import types

    import torch

    from megamoe.kernel.ep import MegaMoEKernelEP
    from megamoe.kernel.runtime import POOL_FIELDS, MegaMoEKernel, pool_buffers

    des = d.design_for(256, 4096, 2048, 256, 6)
    R, bm = des.pool_rows, des.block_m
    b = pool_buffers(torch, des, 4096, 2048, "cpu")
    assert tuple(b) == POOL_FIELDS
    shapes = {k: (tuple(v.shape), v.dtype) for k, v in b.items()}
    assert shapes == {
        "l1_pool": ((R, 4096), torch.uint8), "l1_pool_sf": ((32, R, 4), torch.uint8),
        "l1_pool_fsx": ((32, R // bm, 2, bm), torch.float32),
        "l2_pool": ((R, 2048), torch.uint8), "l2_pool_sf": ((16, R, 4), torch.uint8),
        "l2_pool_fsx": ((16, R // bm, 2, bm), torch.float32),
        "pool_token": ((R,), torch.int32), "pool_slot": ((R,), torch.int32), "pool_weight": ((R,), torch.float32),
        "arrival": ((R // bm,), torch.int32), "mask": ((R // bm,), torch.int64)}
    assert (b["pool_token"] == -1).all() and (b["pool_slot"] == -1).all() and not b["arrival"].any()
    one = types.SimpleNamespace(torch=torch, device="cpu", max_tokens=256, H=4096, I=2048, E=256, K=6,
                                _ws_key=None, _ws=None)
    ws = MegaMoEKernel._workspace(one, des)
    assert set(POOL_FIELDS) < set(ws) and ws["combine_buf"].shape == (6, 256, 4096)
    ep = types.SimpleNamespace(torch=torch, device="cpu", H=4096, I=2048, _ws_key=None, _ws=None)
    ws = MegaMoEKernelEP._workspace(ep, des)
    assert set(ws) == set(POOL_FIELDS) | {"pool_rank"} and (ws["pool_rank"] == -1).all()


def test_l1_promoted_once_follows_the_fold():
    """design_sm90.l1_promoted_once: only where L1_X_FOLD_K folds x over the whole 128-K block."""
    assert {bm: d.l1_promoted_once(bm) for bm in d.BLOCK_MS} == {16: False, 32: False, 64: False, 128: True}
    assert not d.l1_promoted_once(48)


@pytest.mark.parametrize("extra,field", [(["64,x"], "tokens"), (["0"], "tokens"), (["64", "1"], "rounds"),
                                         (["64", "x"], "rounds"), ([], "device|flag_gems"),
                                         (["64", "2", "--graph"], "device|flag_gems")])
def test_peer_ab_rejects_bad_arguments_before_any_gpu_work(tmp_path, extra, field):
    """benchmarks/device/peer_ab.py: a bad token list or round count, or no GPU here (with or
    without ``--graph``), is a one-line argparse error (exit 2) naming the field, before any
    CUDA set-up; nothing written."""
    last = _device_script_error(tmp_path, "peer_ab.py", str(tmp_path / "o.json"), *extra)
    assert re.match(rf"peer_ab.py: error: ({field}): expected", last), last


@pytest.mark.parametrize("extra,field", [(["0"], "tokens"), (["x"], "tokens"), (["8192", "0.1"], "seconds"),
                                         (["8192", "x"], "seconds"), ([], "device|pynvml|flag_gems")])
def test_peer_clocks_rejects_bad_arguments_before_any_gpu_work(tmp_path, extra, field):
    """benchmarks/device/peer_clocks.py: a bad token count or phase length, or no GPU here, is a
    one-line argparse error (exit 2) naming the field; nothing written."""
    last = _device_script_error(tmp_path, "peer_clocks.py", str(tmp_path / "o.json"), *extra)
    assert re.match(rf"peer_clocks.py: error: ({field}): expected", last), last


def test_forget_pool_rows_marks_every_row_unfilled():
    """MegaMoEKernel.forget_pool_rows: pool_token and pool_slot back to -1 (their value at
    allocation, megamoe.kernel.runtime), the pools' contents untouched; before the first call
    (no workspace yet) it does nothing. On CPU tensors: the method only touches the two arrays."""
    import torch

    from megamoe.kernel.runtime import MegaMoEKernel

    k = object.__new__(MegaMoEKernel)
    k._ws = {}
    k.forget_pool_rows()
    assert k._ws == {}
    pool = torch.arange(12, dtype=torch.uint8).reshape(3, 4)
    k._ws = {"pool_token": torch.tensor([5, 0, 7], dtype=torch.int32),
             "pool_slot": torch.tensor([1, 2, 0], dtype=torch.int32), "l1_pool": pool.clone()}
    k.forget_pool_rows()
    assert k._ws["pool_token"].tolist() == [-1, -1, -1] and k._ws["pool_slot"].tolist() == [-1, -1, -1]
    assert k._ws["pool_token"].dtype == torch.int32 and torch.equal(k._ws["l1_pool"], pool)


def test_scramble_pool_data_fills_only_the_data_buffers():
    """MegaMoEKernel.scramble_pool_data: the six pool data buffers get seeded random bytes (the
    same seed, the same bytes; dtype and shape kept), the token / slot / weight arrays and the
    barriers stay; before the first call (no workspace yet) it does nothing. On CPU tensors."""
    import torch

    from megamoe.kernel.runtime import POOL_DATA_FIELDS, POOL_FIELDS, MegaMoEKernel

    assert POOL_DATA_FIELDS == ("l1_pool", "l1_pool_sf", "l1_pool_fsx", "l2_pool", "l2_pool_sf", "l2_pool_fsx")

    def kernel():
        k = object.__new__(MegaMoEKernel)
        k.torch, k._ws = torch, {}
        return k

    k = kernel()
    k.scramble_pool_data(seed=3)
    assert k._ws == {}
    ws = {f: torch.zeros(64, 32, dtype=torch.float32 if f.endswith("fsx") else torch.uint8) for f in POOL_DATA_FIELDS}
    ws.update(pool_token=torch.full((64,), -1, dtype=torch.int32), pool_slot=torch.full((64,), -1, dtype=torch.int32),
              pool_weight=torch.zeros(64), arrival=torch.zeros(4, dtype=torch.int32), mask=torch.zeros(4, dtype=torch.int64))
    assert set(ws) == set(POOL_FIELDS)
    k1, k2 = kernel(), kernel()
    k1._ws = {n: t.clone() for n, t in ws.items()}
    k2._ws = {n: t.clone() for n, t in ws.items()}
    k1.scramble_pool_data(seed=3)
    k2.scramble_pool_data(seed=3)
    for n, t in ws.items():
        assert k1._ws[n].dtype == t.dtype and k1._ws[n].shape == t.shape
        assert torch.equal(k1._ws[n].view(torch.uint8), k2._ws[n].view(torch.uint8))
        changed = int((k1._ws[n].view(torch.uint8) != t.view(torch.uint8)).sum())
        if n in POOL_DATA_FIELDS:  # 8192 random bytes: a zero in about 1 of 256
            assert changed > 0.9 * t.view(torch.uint8).numel()
        else:
            assert changed == 0


@pytest.mark.parametrize("extra,field", [(["--tokens", "64,x"], "tokens"), (["--check-tokens", "0"], "check-tokens"),
                                         (["--tokens", "64", "--check-tokens", "1024"], "check-tokens"),
                                         (["--rounds", "1"], "rounds"), (["--shim", "/nonexistent.so"], "shim"),
                                         (["--redispatch", "Bogus"], "redispatch"), ([], "device")])
def test_sgl_probe_rejects_bad_arguments_before_any_gpu_work(tmp_path, extra, field):
    """benchmarks/device/sgl_deep_gemm_probe.py: a bad token list, check list, round count or
    shim path, or no GPU here, is a one-line argparse error (exit 2) naming the field, before
    any CUDA set-up; nothing written."""
    last = _device_script_error(tmp_path, "sgl_deep_gemm_probe.py", str(tmp_path / "o.json"), *extra)
    assert re.match(rf"sgl_deep_gemm_probe.py: error: {field}: expected", last), last


# names sgl-deep-gemm 0.2.5's _C.so imports from a newer torch (nm -D of the PyPI wheel's _C.so)
# that benchmarks/device/torch_abi_shim.cpp defines, and torch 2.11's that it forwards to
_SHIM_CTOR = "_ZN3c104cuda19CUDAErrorLogCaptureC1Ev"
_SHIM_CHECK6 = "_ZN3c104cuda29c10_cuda_check_implementationEiPKcS2_jbPNS0_19CUDAErrorLogCaptureE"
_TORCH_CHECK5 = "_ZN3c104cuda29c10_cuda_check_implementationEiPKcS2_jb"
_SHIM_DEF = ("_ZNR5torch7Library4_defEOSt7variantIJN3c1012OperatorNameENS2_14FunctionSchemaEEEONS_11CppFunction"
             "ERKSt6vectorINS_10headeronly3TagESaISB_EE")
_TORCH_DEF = ("_ZNR5torch7Library4_defEOSt7variantIJN3c1012OperatorNameENS2_14FunctionSchemaEEEONS_11CppFunction"
              "ERKSt6vectorIN2at3TagESaISB_EE")
_SHIM_CDP = "_ZNK2at10TensorBase14const_data_ptrIfEEPKT_v"
_TORCH_DP = "_ZNK2at10TensorBase8data_ptrIfEEPT_v"


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_torch_abi_shim_forwards_to_the_older_names(tmp_path):
    """benchmarks/device/torch_abi_shim.cpp, built as its header says: the six-argument CUDA
    check calls the five-argument one with the same arguments (the capture pointer dropped),
    ``Library::_def`` with headeronly tags calls the at::Tag one with the same four arguments
    and returns its result, ``const_data_ptr<float>`` falls back to ``data_ptr<float>`` (a
    stand-in library records each call). Without the targets: a zero CUDA error returns, a
    nonzero one aborts with a message, a forwarder aborts naming what it tried."""
    src = Path(__file__).resolve().parents[1] / "benchmarks" / "device" / "torch_abi_shim.cpp"
    shim = tmp_path / "libshim.so"
    subprocess.run(["g++", "-O2", "-shared", "-fPIC", "-o", str(shim), str(src), "-ldl"], check=True, timeout=120)
    (tmp_path / "fake.cpp").write_text(
        "#include <cstdint>\n#include <cstdio>\n"
        "namespace c10::cuda { void c10_cuda_check_implementation(int32_t e, const char* f, const char* fn,"
        " uint32_t l, bool d) { std::printf(\"check5 %d %s %s %u %d\\n\", e, f, fn, l, (int)d); } }\n"
        f'extern "C" void* fake_def(void* a, void* b, void* c, void* d) __asm__("{_TORCH_DEF}");\n'
        'extern "C" void* fake_def(void* a, void* b, void* c, void* d) {'
        ' std::printf("def %p %p %p %p\\n", a, b, c, d); return (char*)a + 8; }\n'
        f'extern "C" void* fake_dp(void* s) __asm__("{_TORCH_DP}");\n'
        'extern "C" void* fake_dp(void* s) { std::printf("dp %p\\n", s); return (char*)s + 16; }\n')
    fake = tmp_path / "libfake.so"
    subprocess.run(["g++", "-shared", "-fPIC", "-o", str(fake), str(tmp_path / "fake.cpp")], check=True, timeout=120)
    names = subprocess.run(["nm", "-D", "--defined-only", str(fake)], capture_output=True, text=True, check=True).stdout
    assert all(n in names for n in (_TORCH_CHECK5, _TORCH_DEF, _TORCH_DP))  # the stand-in has torch's names
    exported = subprocess.run(["nm", "-D", "--defined-only", str(shim)], capture_output=True, text=True,
                              check=True).stdout
    assert all(n in exported for n in (_SHIM_CTOR, _SHIM_CHECK6, _SHIM_DEF, _SHIM_CDP))
    call = ("import ctypes, sys\n"
            "{pre}s = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)\n"
            "buf = ctypes.create_string_buffer(64)\n"
            f"getattr(s, '{_SHIM_CTOR}')(buf)\n"
            "{body}\n"
            "print('returned', flush=True)\n")
    check6 = (f"f = getattr(s, '{_SHIM_CHECK6}')\n"
              "f.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_uint, ctypes.c_bool, ctypes.c_void_p]\n"
              "f(int(sys.argv[2]), b'file.cu', b'func', 75, True, ctypes.addressof(buf))")
    fwd = (f"d = getattr(s, '{_SHIM_DEF}')\n"
           "d.restype = ctypes.c_void_p\n"
           "d.argtypes = [ctypes.c_void_p] * 4\n"
           "print('ret', hex(d(0x1000, 0x2000, 0x3000, 0x4000)), flush=True)\n"
           f"g = getattr(s, '{_SHIM_CDP}')\n"
           "g.restype = ctypes.c_void_p\n"
           "g.argtypes = [ctypes.c_void_p]\n"
           "print('ret', hex(g(0x5000)), flush=True)")
    with_fake = f"ctypes.CDLL({str(fake)!r}, mode=ctypes.RTLD_GLOBAL)\n"

    def run(pre, body, err="0"):
        return subprocess.run([sys.executable, "-c", call.format(pre=pre, body=body), str(shim), err],
                              capture_output=True, text=True, timeout=60, check=False)

    p = run(with_fake, check6, "700")
    assert p.returncode == 0 and p.stdout.split("\n")[:2] == ["check5 700 file.cu func 75 1", "returned"], p.stderr
    p = run(with_fake, fwd)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split("\n")[:5] == ["def 0x1000 0x2000 0x3000 0x4000", "ret 0x1008", "dp 0x5000", "ret 0x5010",
                                        "returned"], p.stdout
    p = run("", check6, "0")
    assert p.returncode == 0 and p.stdout.strip() == "returned", p.stderr
    p = run("", check6, "700")
    assert p.returncode != 0 and "CUDA error 700 at file.cu:75 (func)" in p.stderr and "returned" not in p.stdout
    p = run("", fwd)
    assert p.returncode != 0 and "torch_abi_shim: no target for Library::_def" in p.stderr and _TORCH_DEF in p.stderr


@pytest.mark.skipif(any(shutil.which(t) is None for t in ("g++", "readelf", "nm")), reason="needs g++ and binutils")
def test_missing_symbol_stubs_let_a_library_load_and_abort_when_called(tmp_path):
    """benchmarks/device/missing_symbol_stubs.py: a library importing three functions, one of
    them defined by a provider, fails to load with RTLD_NOW; the generated stubs cover exactly
    the two others, after which it loads, its provided call works, and a stubbed call aborts
    naming the symbol."""
    def so(name, src, *extra):
        (tmp_path / f"{name}.cpp").write_text(src)
        subprocess.run(["g++", "-shared", "-fPIC", "-o", str(tmp_path / f"lib{name}.so"), str(tmp_path / f"{name}.cpp"),
                        *extra], check=True, timeout=120)
        return tmp_path / f"lib{name}.so"

    prov = so("prov", 'extern "C" int have_it(int x) { return x + 1; }\n')
    user = so("user", 'extern "C" int have_it(int); extern "C" int gone_a(); namespace n { int gone_b(double); }\n'
                      'extern "C" int use_have(int x) { return have_it(x); }\n'
                      'extern "C" int use_a() { return gone_a(); }\n'
                      'extern "C" int use_b() { return n::gone_b(1.0); }\n')
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "device" / "missing_symbol_stubs.py"
    p = subprocess.run([sys.executable, str(script), str(user), str(tmp_path / "stubs.cpp"), str(prov)],
                       capture_output=True, text=True, timeout=60, check=True)
    assert sorted(p.stdout.split()) == ["_ZN1n6gone_bEd", "gone_a"]
    stubs = so("stubs", (tmp_path / "stubs.cpp").read_text())
    load = ("import ctypes, sys\n"
            "ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)\n"
            "{stubs}u = ctypes.CDLL(sys.argv[2])\n"
            "print(u.use_have(41), flush=True)\n"
            "{call}\n")
    r = subprocess.run([sys.executable, "-c", load.format(stubs="", call=""), str(prov), str(user)],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode != 0 and "undefined symbol" in r.stderr
    with_stubs = f"ctypes.CDLL({str(stubs)!r}, mode=ctypes.RTLD_GLOBAL)\n"
    r = subprocess.run([sys.executable, "-c", load.format(stubs=with_stubs, call=""), str(prov), str(user)],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0 and r.stdout.strip() == "42", r.stderr
    r = subprocess.run([sys.executable, "-c", load.format(stubs=with_stubs, call="u.use_b()"), str(prov), str(user)],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode != 0 and "missing_symbol_stubs: _ZN1n6gone_bEd called" in r.stderr


@pytest.mark.parametrize("args,field", [(["/nonexistent.so", "o.cpp", "."], "lib"), (["TEXT", "o.cpp", "."], "lib"),
                                        (["LIB", "/nonexistent/o.cpp", "."], "out"), (["LIB", "DIR", "."], "out"),
                                        (["LIB", "o.cpp", "/nonexistent"], "providers"),
                                        (["LIB", "o.cpp", "TEXT"], "providers")])
def test_missing_symbol_stubs_rejects_bad_arguments(tmp_path, args, field):
    """missing_symbol_stubs.py: a missing or non-ELF library, an output in a missing folder or
    onto a folder, a missing or non-ELF provider is a one-line error (exit 2) naming the
    argument, before any readelf / nm work; nothing written."""
    text = tmp_path / "notes.txt"
    text.write_text("not a library\n")
    (tmp_path / "adir").mkdir()
    sub = {"LIB": str(Path(sys.executable).resolve()), "TEXT": str(text), "DIR": str(tmp_path / "adir"),
           "o.cpp": str(tmp_path / "o.cpp")}
    last = _device_script_error(tmp_path, "missing_symbol_stubs.py", *[sub.get(x, x) for x in args])
    assert re.match(rf"missing_symbol_stubs.py: error: {field}: expected", last), last
    assert not (tmp_path / "o.cpp").exists() and not list((tmp_path / "adir").iterdir())


@pytest.mark.parametrize("extra,field", [(["--tokens", "1,x"], "tokens"), (["--tokens", "0"], "tokens"),
                                         ([], "device")])
def test_host_overhead_rejects_bad_arguments_before_any_gpu_work(tmp_path, extra, field):
    """benchmarks/device/host_overhead.py: a bad token list, or no GPU here, is a one-line
    argparse error (exit 2) naming the field before any CUDA set-up; nothing written."""
    last = _device_script_error(tmp_path, "host_overhead.py", str(tmp_path / "o.json"), *extra)
    assert re.match(rf"host_overhead.py: error: {field}: expected", last), last
    assert not (tmp_path / "o.json").exists()


@pytest.mark.parametrize("extra,field", [(["8,x"], "stages"), (["8,0"], "stages"), (["8,5", "4096,x"], "tokens"),
                                         (["8,5", "4096", "0"], "rounds"), (["8,5"], "device")])
def test_trace_stages_rejects_bad_arguments_before_any_gpu_work(tmp_path, extra, field):
    """benchmarks/device/trace_stages.py (traced and untraced time per stage count, session 53): a
    bad stage or token list or round count, or no GPU here, is a one-line argparse error (exit 2)
    naming the field before any CUDA set-up; nothing written."""
    last = _device_script_error(tmp_path, "trace_stages.py", str(tmp_path / "o.json"), *extra)
    assert re.match(rf"trace_stages.py: error: {field}: expected", last), last


@pytest.mark.parametrize("extra,field", [(["1,-2"], "tokens"), (["abc"], "tokens"), (["0"], "tokens"),
                                         (["64"], "device")])
def test_profile_stages_rejects_bad_arguments_before_any_gpu_work(tmp_path, extra, field):
    """benchmarks/device/profile_stages.py (the per-role cycle profile with the epilogues' parts,
    session 54): a bad token list, or no GPU here, is a one-line argparse error (exit 2) naming the
    field before any CUDA set-up (a fresh user's report: it exited 1 without "error:", and with good
    arguments stopped in a traceback from make_weights); nothing written."""
    last = _device_script_error(tmp_path, "profile_stages.py", str(tmp_path / "o.json"), *extra)
    assert re.match(rf"profile_stages.py: error: {field}: expected", last), last
    assert not (tmp_path / "o.json").exists()


@pytest.mark.parametrize("script,pre", [("sgl_deep_gemm_probe.py", []), ("peer_ab.py", []),
                                        ("ab_interleaved.py", ["LIB"]), ("host_overhead.py", []),
                                        ("trace_stages.py", []), ("profile_stages.py", [])])
def test_device_scripts_refuse_a_folder_as_their_json(tmp_path, script, pre):
    """The device scripts that rewrite their JSON after every row check the path up front
    (megamoe.outputs.check_output_path): an existing folder given as the output is a one-line
    error naming ``out`` (exit 2) before any GPU work, not an IsADirectoryError at the first
    write."""
    lib = tmp_path / "old.so"
    lib.write_bytes(b"\x7fELF")
    folder = tmp_path / "results"
    folder.mkdir()
    last = _device_script_error(tmp_path, script, *[str(lib) if x == "LIB" else x for x in pre], str(folder))
    assert re.match(rf"{re.escape(script)}: error: out: expected a file path \(not a folder\)", last), last
    assert not list(folder.iterdir())


@pytest.mark.parametrize("extra,want", [
    (["--override", '{"bad": 1}'], ("error: override: expected a JSON object of some of block_m, experts_per_wave, "
                                     "num_stages, ctas_per_sm, got '{\"bad\": 1}'")),
    (["--override", "notjson"], ("error: override: expected a JSON object of some of block_m, experts_per_wave, "
                                 "num_stages, ctas_per_sm, got 'notjson'")),
    (["--override", '{"ctas_per_sm": 3}'], "error: ctas_per_sm: expected 1 or 2 (or unset: the kernel's rule), got 3"),
    (["--override", '{"ctas_per_sm": 2, "block_m": 32}'],
     ("error: ctas_per_sm: expected 1 at block_m 32, 1 rank(s) (block_m is not 16; two CTAs per SM only at block_m 16 "
      "and one rank), got 2")),
    (["--override", '{"ctas_per_sm": 2}', "--rounds", "1"], "error: rounds: expected an integer >= 2, got '1'"),
    (["--override", '{"ctas_per_sm": 2}', "--tokens", "0"],
     "error: tokens: expected comma-separated integers >= 1, got '0'"),
])
def test_ab_plan_refuses_bad_arguments_before_the_gpu(tmp_path, extra, want):
    """benchmarks/device/ab_plan.py checks its override with the design rule on the CPU (one line,
    exit 2) before it needs torch or a GPU."""
    assert _device_script_error(tmp_path, "ab_plan.py", str(tmp_path / "o.json"), *extra) == want


def test_traces_script_keeps_the_median_call(tmp_path, load_script):
    """benchmarks/device/traces.py keeps, of its ``--calls`` traced calls, the one whose makespan
    is the median (the lower middle one for an even count), and refuses ``--calls 0``, a token
    count that is not an integer >= 1 and a ``--max-tokens`` below the largest count with one
    line before it touches the GPU."""
    pytest.importorskip("torch")
    ns = load_script("benchmarks/device/traces.py")
    assert ns.median_index([53.6, 52.1, 55.0]) == 0  # 52.1 < 53.6 < 55.0
    assert ns.median_index([4.0, 1.0, 3.0, 2.0]) == 3  # sorted 1, 2, 3, 4: the lower middle, 2.0
    assert ns.median_index([7.0]) == 0
    err = _device_script_error(tmp_path, "traces.py", "1", "--calls", "0")
    assert err.endswith("calls: expected an integer >= 1, got 0"), err
    err = _device_script_error(tmp_path, "traces.py", "1,abc")
    assert err.endswith("tokens: expected comma-separated integers >= 1, got '1,abc'"), err
    err = _device_script_error(tmp_path, "traces.py", "64", "--max-tokens", "0")
    assert err.endswith("max-tokens: expected an integer >= the largest token count (64), got 0"), err


@pytest.mark.parametrize("script, args, want", [
    ("traces.py", ["1", "--calls", "0"], "traces.py: error: calls: expected an integer >= 1, got 0"),
    ("traces.py", ["1"], "traces.py: error: torch: expected it importable (pip install torch), got missing"),
    ("../kernel_bench.py", ["--tokens", "abc"],
     "kernel_bench.py: error: tokens: expected comma-separated integers >= 1, got 'abc'"),
    ("../kernel_bench.py", [], "kernel_bench.py: error: torch: expected it importable (pip install torch), got missing"),
])
def test_device_scripts_without_torch_answer_in_one_line(tmp_path, script, args, want):
    """The benchmark and trace scripts check their arguments before they need torch, and without
    torch (here hidden from the import system) say so in one line, exit code 2, no traceback."""
    assert _device_script_error(tmp_path, script, *args, hide_torch=True) == want


@pytest.mark.parametrize("probe", ["wgmma_acc_probe.cu", "wgmma_n_probe.cu"])
def test_device_probes_on_the_kernels_mma_header_compile(probe, tmp_path):
    """The device probes built on ``csrc/megamoe/mma_sm90.cuh`` (the numerics probe and the WGMMA-N
    timing probe) still compile against it for sm_90a, with no spills and no WGMMA serialization
    (the device has no CUTLASS headers: the probes are built here and carried)."""
    nvcc, inc = kbuild.find_nvcc(), kbuild.find_cutlass_include()
    if nvcc is None or inc is None:
        pytest.skip("nvcc or the CUTLASS headers not installed")
    root = Path(__file__).resolve().parents[1]
    p = subprocess.run([nvcc, "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", "-O3", "-Xptxas", "-v",
                        "-I", str(root / "csrc/megamoe"), "-I", str(inc), "-o", str(tmp_path / "probe"),
                        str(root / "benchmarks/device" / probe)], capture_output=True, text=True)
    log = p.stdout + p.stderr
    assert p.returncode == 0, log[-2000:]
    assert "C7511" not in log and "wgmma" not in log.lower().replace("wgmma_", ""), log[-2000:]
    assert re.findall(r"(\d+) bytes spill stores", log) and all(int(x) == 0 for x in re.findall(r"(\d+) bytes spill stores", log))
