"""GPU-free tests of the SM100 path: both archs compile, ptxas resources, SASS contents,
plan numbers -> kernel, weight/scale address arithmetic.

Nothing here executes SM100 code (no B200 on these machines): the tests prove that the
sm_100a binary builds, which instructions it contains and what it costs in registers /
shared memory, and that every number it would run with comes from megamoe.plan's
``deepgemm-sm100`` design. Skips cleanly without nvcc, the CUTLASS headers or cuobjdump.
"""

import ctypes
import dataclasses
import importlib
import re

import numpy as np
import pytest

from megamoe import design_sm100 as d100
from megamoe import design_sm90 as d90
from megamoe import plan as P
from megamoe.errors import InputError

kbuild = importlib.import_module("megamoe.kernel.build")


def _need_nvcc():
    if kbuild.find_nvcc() is None:
        pytest.skip("nvcc not installed")


def _need_cutlass():
    if kbuild.find_cutlass_include() is None:
        pytest.skip("CUTLASS/CuTe headers not found (pip install nvidia-cutlass)")


def _need_cuobjdump():
    if kbuild.find_cuobjdump() is None:
        pytest.skip("cuobjdump not found (CUDA toolkit or pip install nvidia-cuda-cuobjdump)")


@pytest.fixture(scope="module")
def sm100_build():
    _need_nvcc()
    _need_cutlass()
    return kbuild.build("sm_100a")


@pytest.fixture(scope="module")
def sm100_lib(sm100_build):
    lib = ctypes.CDLL(str(sm100_build.path))
    lib.megamoe_sm100_smem_bytes.restype = ctypes.c_longlong
    lib.megamoe_sm100_stage_bytes.restype = ctypes.c_longlong
    lib.megamoe_sm100_check_config.argtypes = [ctypes.c_int] * 7 + [ctypes.c_longlong, ctypes.c_int, ctypes.c_int]
    return lib


def test_arch_for_capability():
    assert kbuild.arch_for_capability(9, 0) == "sm_90a"
    assert kbuild.arch_for_capability(10, 0) == "sm_100a"
    for cc in ((8, 0), (10, 3), (12, 0)):
        with pytest.raises(kbuild.KernelBuildError):
            kbuild.arch_for_capability(*cc)
    with pytest.raises(kbuild.KernelBuildError, match="expected one of"):
        kbuild.build("sm_80")


def test_missing_cutlass_headers_give_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("MEGAMOE_BUILD_DIR", str(tmp_path))
    monkeypatch.setattr(kbuild, "find_nvcc", lambda: "/bin/true")
    monkeypatch.setattr(kbuild, "find_cutlass_include", lambda: None)
    with pytest.raises(kbuild.KernelBuildError, match="nvidia-cutlass"):
        kbuild.build("sm_100a")


def test_sm100_resources(sm100_build):
    """ptxas: one instance per block-table row, no spills, <= 128 registers (512 threads, 1 CTA/SM)."""
    r = sm100_build
    assert set(r.resources) == {f"block_m={bm},block_k={bk}" for bm, bk in d100.INSTANCES}
    for inst, res in sorted(r.resources.items()):
        print(f"sm_100a {inst}: {res['registers']} registers, {res['stack']} B stack, "
              f"{res['spill_stores']} B spill stores, {res['spill_loads']} B spill loads")
        assert res["spill_stores"] == 0 and res["spill_loads"] == 0, (inst, res)
        assert 0 < res["registers"] <= 128, (inst, res)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_sass_contains_the_matrix_instructions(arch):
    """Disassemble each build: sm_100a has UTCQMMA.2CTA (block-scaled 2-CTA UMMA), UTCCP (scales
    -> TMEM), LDTM (TMEM loads), the multicast commit and the TMEM allocator in every instance;
    sm_90a (each block_m with and without the profile clocks, block_m 16 also with the wide walk and at two CTAs per SM) has FP8 WGMMA (QGMMA.64xNx32 with N = the instance's block_m, and at block_m 128 each N of
    its WGMMA N step below it, 32 / 64 / 96: kernel v9.12), its wait and the
    setmaxnreg register split in every instance, and no warp-level MMA (HMMA/QMMA)."""
    _need_nvcc()
    _need_cutlass()
    _need_cuobjdump()
    r = kbuild.build(arch)
    sass = kbuild.disassemble(r.path)
    found = kbuild.check_sass(arch, sass)
    kernels = [f for f in found if "_kernel" in f]
    # sm_90a: each block_m three times, untraced, traced (kernel v9.13) and the profile instance
    # (fault_inject bit 32), block_m 32 without the untraced one (design_sm90.UNTRACED_INSTANCE), and
    # block_m 16 three times more with the wide walk (design_sm90.wide_walk), at two CTAs per SM
    # (design_sm90.ctas_per_sm) and at two CTAs with the wide walk (kernel v9.5)
    n90 = 3 * (len(d90.BLOCK_MS) + 3) - sum(not v for v in d90.UNTRACED_INSTANCE.values())
    assert len(kernels) == (len(d100.INSTANCES) if arch == "sm_100a" else n90)
    for fn in kernels:
        print(arch, fn, found[fn])
    ops = kbuild.sass_opcodes(sass)
    every = {op for fn in ops.values() for op in fn}
    if arch == "sm_90a":
        assert not any(op.startswith(("HMMA", "QMMA", "UTC")) for op in every)
        for fn, fops in ops.items():  # the WGMMA's N: the tokens (swap AB), block_m or each step up to it
            bm = int(re.search(r"kernelILi(\d+)E", fn).group(1))
            step = d90.kernel_wgmma_n_step(bm)
            assert {op for op in fops if op.startswith("QGMMA")} == {
                f"QGMMA.64x{n}x32.F32.E4M3.E4M3" for n in range(step, bm + 1, step)}, fn
    else:
        assert not any(op.startswith(("HMMA", "QMMA", "HGMMA", "QGMMA")) for op in every)
        assert any(op.startswith("UTCCP") for op in every) and any(op.startswith("LDTM") for op in every)
    # no register spills inside the matrix loops of the timed instances
    assert kbuild.hot_loop_spills(arch, sass) == {}
    if arch == "sm_90a":  # every timed instance has a K loop, longer with more accumulator registers
        sizes = kbuild.k_loop_sizes(arch, sass)  # (an untraced launch at block_m 32 runs its traced instance)
        timed = [sizes[f"block_m={bm}" + ("" if d90.UNTRACED_INSTANCE[bm] else ",traced")] for bm in sorted(d90.BLOCK_MS)]
        assert timed == sorted(timed) and len(set(timed)) == len(timed), sizes
    # ptxas kept the WGMMAs asynchronous (no serialization diagnostic for any instance)
    assert kbuild.serialized_wgmma(r.log) == {}


def test_hot_loop_local_memory_counts_only_inside_the_matrix_loop():
    fake = """
        Function : k1
        /*0000*/                   STL [R1], R0 ;
        /*0010*/                   QGMMA.64x16x32.F32.E4M3.E4M3 R24, gdesc[UR4], RZ, !UPT, gsb0 ;
        /*0020*/                   LDL R3, [R1+0x4] ;
        /*0030*/                   QGMMA.64x16x32.F32.E4M3.E4M3 R24, gdesc[UR8], RZ, !UPT, gsb0 ;
        /*0040*/                   STL [R1+0x8], R2 ;
        Function : k2
        /*0000*/                   LDL R3, [R1+0x4] ;
        /*0010*/                   QGMMA.64x16x32.F32.E4M3.E4M3 R24, gdesc[UR4], RZ, !UPT, gsb0 ;
"""
    assert kbuild.hot_loop_local_memory("sm_90a", fake) == {"k1": 1, "k2": 0}


def test_hot_loop_local_memory_counts_the_whole_k_loop_but_not_its_slow_paths():
    # A K loop (0x0100 .. 0x0180, back edge at 0x0180) whose reload comes after its last WGMMA
    # (a spill the first-to-last-WGMMA span missed: kernel v7.3 experiments); a spin-wait's
    # timeout path placed after the function's exit jumps back into the loop (not counted), and
    # the block loop around it (0x0080 .. 0x01a0) holds an epilogue spill (not counted).
    fake = """
        Function : _ZN7megamoe19megamoe_sm90_kernelILi128ELb0ELb0ELi1ELb0EEEvNS_8Sm90ArgsE
        /*0080*/                   STL [R1], R0 ;
        /*0100*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R2], R3 ;
        /*0110*/               @!P0 BRA 0x1c0 ;
        /*0120*/                   QGMMA.64x128x32.F32.E4M3.E4M3 R24, R88, gdesc[UR16], RZ, !UPT ;
        /*0130*/                   QGMMA.64x128x32.F32.E4M3.E4M3 R24, R92, gdesc[UR20], R24, gsb0 ;
        /*0140*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0150*/                   FFMA R40, R24, R5, R40 ;
        /*0160*/                   LDL R0, [R1+0xc] ;
        /*0180*/               @P1 BRA 0x100 ;
        /*0190*/                   STL [R1+0x4], R40 ;
        /*01a0*/               @P2 BRA 0x80 ;
        /*01b0*/                   EXIT ;
        /*01c0*/                   LDL R7, [R1+0x8] ;
        /*01d0*/                   BRA 0x120 ;
        Function : _ZN7megamoe19megamoe_sm90_kernelILi128ELb1ELb0ELi1ELb1EEEvNS_8Sm90ArgsE
        /*0100*/                   QGMMA.64x128x32.F32.E4M3.E4M3 R24, R88, gdesc[UR16], RZ, !UPT ;
        /*0110*/                   LDL R0, [R1+0xc] ;
        /*0120*/               @P1 BRA 0x100 ;
"""
    assert kbuild.hot_loop_local_memory("sm_90a", fake) == {
        "_ZN7megamoe19megamoe_sm90_kernelILi128ELb0ELb0ELi1ELb0EEEvNS_8Sm90ArgsE": 1,
        "_ZN7megamoe19megamoe_sm90_kernelILi128ELb1ELb0ELi1ELb1EEEvNS_8Sm90ArgsE": 1}
    # what the strict build refuses: the timed instance, not the profile one
    assert kbuild.hot_loop_spills("sm_90a", fake) == {"block_m=128": 1}


def test_k_loop_sizes_and_sass_digests_by_hand():
    """k_loop_sizes: the smallest loop around the first matrix instruction (0x010 .. 0x0a0, ten
    instructions) less the retry code the branch after the unpredicated try-wait jumps over
    (0x030 - 0x050): seven; a function without a matrix instruction is left out. sass_digests:
    addresses and encodings do not count, a register does."""
    k16 = "_ZN7megamoe19megamoe_sm90_kernelILi16ELb0ELb0ELi1ELb0EEEvNS_8Sm90ArgsE"
    fake = f"""
        Function : {k16}
        /*0000*/                   MOV R1, R2 ;
        /*0010*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R2], R3 ;
        /*0020*/                @P0 BRA 0x60 ;
        /*0030*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R2], R3 ;
        /*0040*/               @!P0 BRA 0x30 ;
        /*0050*/                   NOP ;
        /*0060*/                   QGMMA.64x16x32.F32.E4M3.E4M3 R24, R88, gdesc[UR16], RZ, !UPT ;
        /*0070*/                   QGMMA.64x16x32.F32.E4M3.E4M3 R24, R92, gdesc[UR20], R24, gsb0 ;
        /*0080*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0090*/                   FFMA R40, R24, R5, R40 ;
        /*00a0*/                @P1 BRA 0x10 ;
        /*00b0*/                   EXIT ;
        Function : other
        /*0000*/                   MOV R1, R2 ;
        /*0010*/                @P1 BRA 0x0 ;
"""
    assert kbuild.k_loop_sizes("sm_90a", fake) == {"block_m=16": 7}
    # the SM90 instance names: megamoe_sm90_kernel<block_m, PROF, WIDE, CTAS, TR>
    sym = "_ZN7megamoe19megamoe_sm90_kernelILi{}ELb{}ELb{}ELi{}ELb{}EEEvNS_8Sm90ArgsE"
    assert {kbuild._instance_name(sym.format(*a)): a for a in [
        (16, 0, 0, 1, 0), (16, 0, 0, 1, 1), (16, 1, 0, 1, 1), (16, 0, 1, 1, 0), (16, 1, 1, 2, 1), (128, 0, 0, 1, 1),
        (32, 0, 0, 2, 0)]} == {
        "block_m=16": (16, 0, 0, 1, 0), "block_m=16,traced": (16, 0, 0, 1, 1), "block_m=16,profile": (16, 1, 0, 1, 1),
        "block_m=16,wide": (16, 0, 1, 1, 0), "block_m=16,wide,pair,profile": (16, 1, 1, 2, 1),
        "block_m=128,traced": (128, 0, 0, 1, 1), "block_m=32,pair": (32, 0, 0, 2, 0)}
    assert kbuild._instance_name("_ZN7megamoe20megamoe_sm100_kernelILi128ELi128EEEvNS_6ParamsE") == "block_m=128,block_k=128"
    assert kbuild._instance_name("other") == "other"
    dig = kbuild.sass_digests(fake)
    moved = fake.replace("/*0090*/", "/*0094*/").replace("EXIT ;", "EXIT ;  /* 0x000000000000794d */")
    assert kbuild.sass_digests(moved) == dig
    other_reg = fake.replace("FFMA R40, R24, R5, R40", "FFMA R41, R24, R5, R41")
    assert kbuild.sass_digests(other_reg)["block_m=16"] != dig["block_m=16"]
    assert kbuild.sass_digests(other_reg)["other"] == dig["other"]


def test_serialized_wgmma_names_the_instances_from_the_ptxas_log():
    # the two diagnostics as ptxas 13.0 printed them for kernel v7.3 experiments (symbols shortened)
    log = (
        "ptxas info    : (C7514) Potential Performance Loss: wgmma.mma_async instructions are serialized "
        "due to non wgmma instructions reading accumulator registers of  a wgmma between start and end of "
        "the pipeline stage in the function '_ZN7megamoe19megamoe_sm90_kernelILi16ELb0ELb0ELi1ELb0EEEvNS_8Sm90ArgsE'\n"
        "ptxas info    : Used 128 registers, used 3 barriers, 88 bytes cumulative stack size\n"
        "ptxas info    : (C7518) Potential Performance Loss: wgmma.mma_async instructions are serialized "
        "due to program dependence on compiler-inserted WG.DP in divergent path in the function "
        "'_ZN7megamoe19megamoe_sm90_kernelILi128ELb1ELb0ELi1ELb1EEEvNS_8Sm90ArgsE'\n")
    got = kbuild.serialized_wgmma(log)
    assert sorted(got) == ["block_m=128,profile", "block_m=16"]
    assert got["block_m=16"].startswith("C7514:due to non wgmma instructions reading accumulator")
    assert got["block_m=128,profile"].startswith("C7518:due to program dependence")
    assert kbuild.serialized_wgmma("ptxas info    : Used 128 registers\n") == {}


def _idx(rng, T, E, K):
    return np.stack([rng.permutation(E)[:K] for _ in range(T)]).astype(np.int64)


# (E, K, H, I, T): together they select every (block_m, block_k) row of the reference table.
SCENARIOS = [(256, 6, 4096, 2048, 1), (256, 6, 4096, 2048, 512), (256, 6, 4096, 2048, 4096),
             (256, 6, 4096, 2048, 8192), (64, 4, 2048, 1024, 512), (64, 4, 2048, 1024, 1024)]


@pytest.mark.parametrize("E,K,H,I,T", SCENARIOS)
def test_plan_numbers_are_the_kernel_numbers(E, K, H, I, T, sm100_lib):
    """The kernel's compile-time (block_m/n/k instance) and launch numbers (stages, experts per
    wave, pull bytes, pool capacity, SMs) are the deepgemm-sm100 plan's, the compiled library
    accepts them, and its shared memory for the plan's stage count fits the SM100 budget."""
    idx = _idx(np.random.default_rng(T), T, E, K)
    plan = P.build_plan(num_experts=E, top_k=K, hidden=H, intermediate=I, num_ranks=1, tokens_per_rank=[T],
                        max_tokens_per_rank=T, topk_idx=[idx], num_sms=148, design="deepgemm-sm100")
    r = plan.ranks[0]
    c = d100.config_from_plan(plan)
    assert (c.block_m, c.block_n, c.block_k) == (r.config.block_m, r.config.block_n, r.config.block_k)
    assert (c.num_stages, c.experts_per_wave) == (r.num_stages, r.experts_per_wave)
    assert (c.bytes_per_pull, c.pool_tokens, c.num_sms) == (plan.bytes_per_pull, plan.pool_tokens, plan.num_sms)
    assert (c.block_m, c.block_k) in d100.INSTANCES
    rc = sm100_lib.megamoe_sm100_check_config(c.block_m, c.block_k, c.num_stages, c.experts_per_wave, E, H, I,
                                              c.pool_tokens, c.bytes_per_pull, c.num_sms)
    assert rc == 0, rc
    # shared memory: the C++ layout == the Python mirror, within the budget the plan used
    smem = sm100_lib.megamoe_sm100_smem_bytes(c.block_m, c.block_k, c.num_stages, E)
    assert smem == c.smem_bytes == d100.smem_bytes(c.block_m, c.block_k, c.num_stages, E)
    assert smem <= P.SM100_SMEM_CAPACITY
    # per-stage bytes: the plan's (A half-tile, B tile, SFA, SFB, 2 barriers) = ours + 16 B barriers
    s1, m1 = P.sm100_pipeline(P.SM100_SMEM_CAPACITY, E, H, r.config, plan.bytes_per_pull)
    s2, m2 = P.sm100_pipeline(4 * P.SM100_SMEM_CAPACITY, E, H, r.config, plan.bytes_per_pull)
    assert (m2 - m1) // (s2 - s1) == sm100_lib.megamoe_sm100_stage_bytes(c.block_m, c.block_k) + 16
    assert c.sf_pool_rows == c.pool_tokens // c.block_m * d100.sf_block_m(c.block_m)
    assert sm100_lib.megamoe_sm100_tmem_cols(c.block_m, c.block_k) == d100.tmem_columns(c.block_m, c.block_k)


def test_all_instances_cover_the_plan_table():
    seen = {(P.sm100_block_config(1, 1, 1, 1, bm).block_m, P.sm100_block_config(1, 1, 1, 1, bm).block_k)
            for bm in (16, 32, 64, 96, 128, 192)}
    assert seen == set(d100.INSTANCES)


def test_abi_size(sm100_lib):
    assert sm100_lib.megamoe_sm100_abi_size() == ctypes.sizeof(d100.params_type())


def test_weight_scale_addressing_matches_layouts():
    """The producer reads weight scales at int32 offset ((e * K/128 + kb) * N + n_block * 128 + i)
    of megamoe.layouts.transform_weights_for_mega_moe's buffer and hands those 128 words to
    UTCCP; the dispatch writes token scales at pool-block row utccp_row(r). Both must be the
    layouts module's UTCCP transpose (row 4i+j <- row 32j+i) of the gate/up-interleaved rows."""
    torch = pytest.importorskip("torch")
    from megamoe import layouts
    E, I, H = 2, 128, 256
    g = torch.Generator().manual_seed(0)
    w1 = torch.randint(0, 256, (E, 2 * I, H // 2), dtype=torch.uint8, generator=g)
    s1 = torch.randint(100, 140, (E, 2 * I, H // 32), dtype=torch.uint8, generator=g)
    w2 = torch.randint(0, 256, (E, H, I // 2), dtype=torch.uint8, generator=g)
    s2 = torch.randint(100, 140, (E, H, I // 32), dtype=torch.uint8, generator=g)
    (w1t, sf1t), (_, sf2t) = layouts.transform_weights_for_mega_moe((w1, s1), (w2, s2))
    for sf, rows, kd, inter in ((sf1t, 2 * I, H, True), (sf2t, H, I, False)):
        kq = kd // 128
        assert sf.stride() == (kq * rows, 1, rows)  # MN-major, MN already 16-byte aligned
        flat = torch.as_strided(sf, (E * kq * rows,), (1,), sf.storage_offset())
        src = s1 if inter else s2
        logical = src.view(E, rows, kq, 4)
        if inter:
            logical = layouts.interleave_gate_up(src, name="s").view(E, rows, kq, 4)
        packed = logical.contiguous().view(torch.int32).view(E, rows, kq)
        for e in range(E):
            for kb in range(kq):
                for nb in range(rows // 128):
                    words = flat[(e * kq + kb) * rows + nb * 128:][:128]
                    want = packed[e, nb * 128:(nb + 1) * 128, kb].view(4, 32).t().reshape(128)
                    assert torch.equal(words, want)
    # the dispatch's utccp_row (roles_shared.cuh) is the same permutation
    r = np.arange(384)
    utccp = (r & ~127) + (r & 31) * 4 + ((r >> 5) & 3)
    t = torch.arange(384, dtype=torch.int32).view(1, 384, 1)
    perm = layouts.utccp_transpose_sf(t).view(-1).numpy()
    assert np.array_equal(perm[utccp], r)
    # L1 rows of one n block: gate rows 16j..16j+7, up 16j+8..16j+15 (the epilogue's lane ^ 8)
    for n in range(0, 2 * I, 37):
        j, i = divmod(n, 16)
        src_row = (j * 8 + i) if i < 8 else (I + j * 8 + i - 8)
        assert torch.equal(w1t[:, n], w1[:, src_row])


# ------------------------------------------------------------------ the Python launch (issue 9): numbers,
# weights, workspace. Nothing below launches anything; tests/test_kernel_select.py checks the
# parameter struct and the call of megamoe_sm100_launch with a recording stand-in library.

# (E, K, H, I, max_tokens, token counts): every block_m of the table, T = 0 and T = max_tokens
DESIGN_CASES = [(256, 6, 4096, 2048, 8192, (0, 1, 7, 64, 200, 300, 500, 700, 1024, 2048, 4096, 8192)),
                (64, 4, 2048, 1024, 1024, (0, 1, 100, 256, 400, 512, 1000, 1024)),
                (8, 2, 512, 256, 64, (1, 5, 16, 40, 64))]


def _plan(E, K, H, I, T, T_max, num_sms=148, **kw):
    idx = _idx(np.random.default_rng(T), T, E, K) if T else np.zeros((0, K), np.int64)
    return P.build_plan(num_experts=E, top_k=K, hidden=H, intermediate=I, num_ranks=1, tokens_per_rank=[T],
                        max_tokens_per_rank=T_max, topk_idx=[idx], num_sms=num_sms, design="deepgemm-sm100", **kw)


def _assert_fields_equal(got, want, what):
    for f in dataclasses.fields(want):
        assert getattr(got, f.name) == getattr(want, f.name), (what, f.name, getattr(got, f.name), getattr(want, f.name))


@pytest.mark.parametrize("E,K,H,I,T_max,tokens", DESIGN_CASES)
def test_design_for_is_the_plan_for_every_token_count(E, K, H, I, T_max, tokens):
    """design_sm100.design_for (the per-call numbers MegaMoEKernel launches with on 10.0, no plan)
    equals, field by field, config_from_plan of build_plan(design="deepgemm-sm100") for the same
    call, and each field is the plan's own number (not a re-derivation)."""
    seen_bm = set()
    for T in tokens:
        plan = _plan(E, K, H, I, T, T_max)
        r = plan.ranks[0]
        got = d100.design_for(T, T_max, H, I, E, K, 148)
        _assert_fields_equal(got, d100.config_from_plan(plan), f"T={T}")
        assert (got.block_m, got.block_n, got.block_k) == (r.config.block_m, r.config.block_n, r.config.block_k)
        assert (got.num_stages, got.experts_per_wave, got.num_sms) == (r.num_stages, r.experts_per_wave, plan.num_sms)
        assert (got.bytes_per_pull, got.pool_tokens) == (plan.bytes_per_pull, plan.pool_tokens)
        assert got.sf_pool_rows == plan.pool_tokens // r.config.block_m * -(-r.config.block_m // 128) * 128
        seen_bm.add(got.block_m)
    if E == 256:
        assert seen_bm == {bm for bm, _ in d100.INSTANCES}  # the first case reaches every instance


@pytest.mark.parametrize("kw", [dict(block_m=64), dict(block_m=16, num_stages=3), dict(experts_per_wave=5),
                                dict(block_m=192, experts_per_wave=2, num_stages=2)])
def test_design_for_overrides_are_build_plans(kw):
    E, K, H, I, T, T_max = 64, 4, 2048, 1024, 300, 1024
    _assert_fields_equal(d100.design_for(T, T_max, H, I, E, K, 148, **kw),
                         d100.config_from_plan(_plan(E, K, H, I, T, T_max, **kw)), kw)


@pytest.mark.parametrize("args,field", [((5, 64, 512, 256, 8, 2, 147), "num_sms"),  # odd: 2-CTA clusters
                                        ((5, 64, 384, 256, 8, 2, 148), "shape"),    # hidden % 256
                                        ((5, 64, 512, 384, 8, 2, 148), "shape"),    # inter % block_k 256 (block_m 16)
                                        ((65, 64, 512, 256, 8, 2, 148), "num_tokens"),
                                        ((5, 0, 512, 256, 8, 2, 148), "max_tokens")])
def test_design_for_rejects_what_the_plan_or_kernel_cannot_take(args, field):
    with pytest.raises(InputError) as ei:
        d100.design_for(*args)
    assert ei.value.field == field
    T, T_max, H, I, E, K, sms = args
    if field in ("num_sms", "shape"):  # build_plan refuses the same call
        with pytest.raises(InputError):
            _plan(E, K, H, I, T, T_max, num_sms=sms)


@pytest.mark.parametrize("E,K,H,I,T_max,tokens", DESIGN_CASES)
def test_design_for_numbers_pass_the_compiled_librarys_checks(E, K, H, I, T_max, tokens, sm100_lib):
    """Cross-check with the sm_100a library's device-free entry points: megamoe_sm100_check_config
    accepts every per-call config, its shared memory equals ours and fits, TMEM columns fit."""
    sm100_lib.megamoe_sm100_tmem_cols.restype = ctypes.c_int
    for T in tokens:
        c = d100.design_for(T, T_max, H, I, E, K, 148)
        assert sm100_lib.megamoe_sm100_check_config(c.block_m, c.block_k, c.num_stages, c.experts_per_wave, E, H, I,
                                                    c.pool_tokens, c.bytes_per_pull, c.num_sms) == 0, (T, c)
        assert sm100_lib.megamoe_sm100_smem_bytes(c.block_m, c.block_k, c.num_stages, E) == c.smem_bytes
        assert c.smem_bytes <= d100.SMEM_LIMIT_SM100
        assert sm100_lib.megamoe_sm100_tmem_cols(c.block_m, c.block_k) == d100.tmem_columns(c.block_m, c.block_k) <= 512


def _ckpt(E, H, I, seed=0):
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, 256, (E, 2 * I, H // 2), dtype=torch.uint8, generator=g),
            torch.randint(100, 140, (E, 2 * I, H // 32), dtype=torch.uint8, generator=g),
            torch.randint(0, 256, (E, H, I // 2), dtype=torch.uint8, generator=g),
            torch.randint(100, 140, (E, H, I // 32), dtype=torch.uint8, generator=g))


def test_sm100_weights_are_the_layouts_transform_and_invert():
    """to_sm100_weights(prepare_weights(checkpoint)) is exactly layouts.transform_weights_for_mega_moe
    of the checkpoint (values, dtypes, strides); Sm100Weights.checkpoint() and
    layouts.untransform_weights_for_mega_moe give the checkpoint back; already-transformed
    Sm100Weights pass through untouched; wrong layouts are refused."""
    torch = pytest.importorskip("torch")
    from megamoe import layouts
    from megamoe.kernel import prepare_weights, sm100
    E, H, I = 4, 512, 256
    ck = _ckpt(E, H, I)
    w = sm100.to_sm100_weights(prepare_weights(*ck), E, H, I)
    (w1, s1), (w2, s2) = layouts.transform_weights_for_mega_moe((ck[0], ck[1]), (ck[2], ck[3]))
    for got, want in zip((w.w1, w.w1_sf, w.w2, w.w2_sf), (w1, s1, w2, s2)):
        assert torch.equal(got, want) and got.dtype == want.dtype and got.stride() == want.stride()
    assert w.w1_sf.stride() == (H // 128 * 2 * I, 1, 2 * I) and w.w2_sf.stride() == (I // 128 * H, 1, H)
    back = w.checkpoint()
    for got, want in zip((back.w1, back.w1_sf, back.w2, back.w2_sf), ck):
        assert torch.equal(got, want) and got.dtype == want.dtype
    (b1, bs1), (b2, bs2) = layouts.untransform_weights_for_mega_moe((w.w1, w.w1_sf), (w.w2, w.w2_sf))
    for got, want in zip((b1, bs1, b2, bs2), ck):
        assert torch.equal(got, want)
    assert sm100.to_sm100_weights(w, E, H, I) is w
    with pytest.raises(InputError, match="weights.w1_sf"):  # K-major int32 scales: not what the kernel reads
        sm100.to_sm100_weights(sm100.Sm100Weights(w.w1, w.w1_sf.contiguous(), w.w2, w.w2_sf), E, H, I)
    with pytest.raises(InputError, match="weights.w1"):
        sm100.to_sm100_weights(prepare_weights(*ck), E, H, 2 * I)
    with pytest.raises(InputError, match="^weights"):
        sm100.to_sm100_weights(ck, E, H, I)


def _utccp_row(r):  # roles_shared.cuh utccp_row, transcribed
    return (r & ~127) + (r & 31) * 4 + ((r >> 5) & 3)


@pytest.mark.parametrize("bm", [bm for bm, _ in d100.INSTANCES])
def test_sf_pool_row_is_the_kernels_utccp_sf_row(bm):
    """sm100.sf_pool_row (used to read the pool scales back) = UtccpSfRow of roles_shared.cuh:
    (row / bm) * align(bm, 128) + utccp_row(row % bm); one-to-one into [0, sf_pool_rows); inside a
    pool block it is the layouts module's UTCCP transpose."""
    torch = pytest.importorskip("torch")
    from megamoe import layouts
    from megamoe.kernel import sm100
    sfm = -(-bm // 128) * 128
    pool = 384 * 4
    rows = np.arange(pool)
    got = sm100.sf_pool_row(rows, bm)
    assert np.array_equal(got, (rows // bm) * sfm + _utccp_row(rows % bm))
    assert [sm100.sf_pool_row(int(r), bm) for r in rows[:300]] == got[:300].tolist()
    assert len(set(got.tolist())) == pool and got.max() < pool // bm * sfm
    perm = layouts.utccp_transpose_sf(torch.arange(sfm, dtype=torch.int32).view(1, sfm, 1)).view(-1).numpy()
    assert np.array_equal(perm[got[:bm]], np.arange(bm))  # stored row utccp_row(r) holds logical row r


@pytest.mark.parametrize("E,K,H,I,T_max,T", [(256, 6, 4096, 2048, 8192, t) for t in (1, 300, 700, 2048, 4096, 8192)]
                         + [(8, 2, 512, 256, 64, 64)])
def test_sm100_workspace_sizes_are_what_the_kernel_indexes(E, K, H, I, T_max, T):
    """Every SM100 workspace buffer is exactly as large as the largest index kernel_sm100.cu /
    roles_shared.cuh / common.cuh use with the plan's numbers (R = pool_tokens = Params.pool_rows,
    S = sf_pool_rows, SFM = align(block_m, 128), nblk = R / block_m, T = max_tokens):

    * l1_pool [R, H] u8: dispatch writes row `row < pool_rows` (the `row >= p.pool_rows` guard),
      bytes row*H .. row*H+H-1; the producer reads rows pool_block*BM + rank*BM/2 + [0, BM/2) with
      pool_block < nblk -> last byte (R-1)*H + H-1.    l2_pool [R, I]: the L1 epilogue writes
      (prow0 + t)*I + n_block*64 + ch, t < BM, n_block < 2I/128, ch < 64 -> last (R-1)*I + I-1.
    * l1_pool_sf [H/128][S][4]: dispatch stores u32 word kb*S + UtccpSfRow(row), kb < H/128; the
      producer copies SFM*4 bytes from ((k0/128)*S + pool_block*SFM)*4 -> last byte
      ((H/128-1)*S + (nblk-1)*SFM)*4 + SFM*4 - 1 = (H/128)*S*4 - 1 since S = nblk*SFM.
      l2_pool_sf [I/128][S][4]: the L1 epilogue stores byte ((gidx>>2)*S + srow)*4 + (gidx&3),
      gidx = n_block*2 + (qw>>1) < I/32, srow < S; the producer reads it like l1_pool_sf.
    * pool_token / pool_slot / pool_weight [R]: indexed by pool rows (< R, see above).
    * arrival [nblk] u32, mask [nblk] u64: indexed by pool_block; cleared for i < pool_rows/BM.
    * expert_count [2E + 2] u64 (counts, sums, count barrier, and the SM90 block ticket, which
      the shared clean-up zeroes too), grid_sync [1], error [8] (raise_error writes error[0..7]),
      item_pos and item_order [T*K] (item index i < num_tokens*K; the sorted position of an item
      of the CTA's range [i0, i1) is below i1 - i0), combine_buf [K, T, H] bf16
      ((slot*num_tokens + tok)*H + ch with slot < K, tok < num_tokens <= T, ch < H).
    The scale-buffer bounds are also found by enumerating the index expressions below."""
    from megamoe.kernel import sm100
    c = d100.design_for(T, T_max, H, I, E, K, 148)
    R, S, bm, sfm = c.pool_tokens, c.sf_pool_rows, c.block_m, d100.sf_block_m(c.block_m)
    nblk = R // bm
    spec = sm100.workspace_spec(c, T_max, H, I, E, K)
    assert set(spec) == set(sm100.WORKSPACE_FIELDS)
    size = {n: (int(np.prod(shape)) * np.dtype(dt if dt != "bfloat16" else "uint16").itemsize)
            for n, (shape, dt, _) in spec.items()}
    assert size["l1_pool"] == (R - 1) * H + H and size["l2_pool"] == (R - 1) * I + I
    assert size["l1_pool_sf"] == (H // 128) * S * 4 and size["l2_pool_sf"] == (I // 128) * S * 4
    assert S == nblk * sfm
    assert {n: size[n] for n in ("pool_token", "pool_slot", "pool_weight")} == dict.fromkeys(
        ("pool_token", "pool_slot", "pool_weight"), 4 * R)
    assert (size["arrival"], size["mask"]) == (4 * nblk, 8 * nblk)
    assert (size["expert_count"], size["grid_sync"], size["error"]) == (8 * (2 * E + 2), 4, 32)
    assert (size["item_pos"], size["item_order"], size["combine_buf"]) == (4 * T_max * K, 4 * T_max * K,
                                                                            2 * K * T_max * H)
    # enumerate the scale-buffer index expressions (every pool row / block, last K block)
    rows = np.arange(R)
    srow = (rows // bm) * sfm + _utccp_row(rows % bm)
    l1_dispatch_last = 4 * ((H // 128 - 1) * S + srow.max()) + 3
    l1_producer_last = ((H // 128 - 1) * S + (nblk - 1) * sfm) * 4 + sfm * 4 - 1
    assert l1_dispatch_last <= l1_producer_last == size["l1_pool_sf"] - 1
    gidx_last = (2 * I // 128 - 1) * 2 + 1
    l2_epilogue_last = ((gidx_last >> 2) * S + srow.max()) * 4 + (gidx_last & 3)
    l2_producer_last = ((I // 128 - 1) * S + (nblk - 1) * sfm) * 4 + sfm * 4 - 1
    assert l2_epilogue_last <= l2_producer_last == size["l2_pool_sf"] - 1
    # initial values: counters and scale pools zero, pool metadata -1 (as SM90), data uninitialised
    init = {n: v for n, (_, _, v) in spec.items()}
    assert init == dict(l1_pool=None, l1_pool_sf=0, l2_pool=None, l2_pool_sf=0, pool_token=-1, pool_slot=-1,
                        pool_weight=0, expert_count=0, arrival=0, mask=0, grid_sync=0, error=0, item_pos=None,
                        item_order=None, combine_buf=None)
