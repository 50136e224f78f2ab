"""GPU-free tests of the SM100 path: both archs compile, ptxas resources, SASS contents,
plan numbers -> kernel, weight/scale address arithmetic.

Nothing here executes SM100 code (no B200 on these machines): the tests prove that the
sm_100a binary builds, which instructions it contains and what it costs in registers /
shared memory, and that every number it would run with comes from megamoe.plan's
``deepgemm-sm100`` design. Skips cleanly without nvcc, the CUTLASS headers or cuobjdump.
"""

import ctypes
import importlib
import re

import numpy as np
import pytest

from megamoe import design_sm100 as d100
from megamoe import design_sm90 as d90
from megamoe import plan as P

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
    sm_90a has FP8 WGMMA (QGMMA.64xNx32 with N = the instance's block_m), its wait and the
    setmaxnreg register split in every instance, and no warp-level MMA (HMMA/QMMA)."""
    _need_nvcc()
    _need_cutlass()
    _need_cuobjdump()
    r = kbuild.build(arch)
    sass = kbuild.disassemble(r.path)
    found = kbuild.check_sass(arch, sass)
    kernels = [f for f in found if "_kernel" in f]
    assert len(kernels) == (len(d100.INSTANCES) if arch == "sm_100a" else len(d90.BLOCK_MS))
    for fn in kernels:
        print(arch, fn, found[fn])
    ops = kbuild.sass_opcodes(sass)
    every = {op for fn in ops.values() for op in fn}
    if arch == "sm_90a":
        assert not any(op.startswith(("HMMA", "QMMA", "UTC")) for op in every)
        for fn, fops in ops.items():  # the WGMMA's N is the instance's block_m (swap AB)
            bm = int(re.search(r"kernelILi(\d+)E", fn).group(1))
            assert {op for op in fops if op.startswith("QGMMA")} == {f"QGMMA.64x{bm}x32.F32.E4M3.E4M3"}, fn
    else:
        assert not any(op.startswith(("HMMA", "QMMA", "HGMMA", "QGMMA")) for op in every)
        assert any(op.startswith("UTCCP") for op in every) and any(op.startswith("LDTM") for op in every)
    # no register spills inside the matrix loops
    assert set(kbuild.hot_loop_local_memory(arch, sass).values()) == {0}


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
