"""Plan decisions against hand-derived numbers (DeepGEMM heuristics, see megamoe/plan.py)."""

import numpy as np
import pytest

from megamoe import plan as P
from megamoe.errors import InputError
from megamoe.routing import RoutingSpec, generate


def test_pull_order_5_3_9_2():
    # Seed 004's example.  Round 1: min remaining 2 over 4 active ranks -> 8 slots;
    # round 2: min 1 over ranks {0,1,2} -> 3 slots (remaining 2,0,6,0); round 3: min 2 over
    # {0,2} -> 4 slots; round 4: rank 2 alone, 4 slots.  (The seed says "2,0,5,0" and a final
    # 3: an arithmetic slip; 5+3+9+2 = 19 = 8+3+4+4.)
    order = P.pull_order([5, 3, 9, 2]).tolist()
    expected = ([[0, 0], [1, 0], [2, 0], [3, 0], [0, 1], [1, 1], [2, 1], [3, 1]]
                + [[0, 2], [1, 2], [2, 2]]
                + [[0, 3], [2, 3], [0, 4], [2, 4]]
                + [[2, 5], [2, 6], [2, 7], [2, 8]])
    assert order == expected


def test_pull_order_is_a_permutation_of_every_rank_list():
    rng = np.random.default_rng(1)
    for _ in range(50):
        counts = rng.integers(0, 12, size=rng.integers(1, 9))
        order = P.pull_order(counts)
        for j, c in enumerate(counts):
            assert sorted(order[order[:, 0] == j, 1].tolist()) == list(range(c))


def test_block_config_table_boundaries():
    # e = T * R * k / E; thresholds 8.5 / 16.5 / 32.5 / 64.5 / 96.5
    cases = [(1, 16, 256, 256), (8, 16, 256, 256), (9, 32, 128, 256), (16, 32, 128, 256),
             (17, 64, 128, 128), (32, 64, 128, 128), (33, 96, 128, 256), (64, 96, 128, 256),
             (65, 128, 128, 256), (96, 128, 128, 256), (97, 192, 128, 256)]
    for e, bm, bk, threads in cases:
        # R=1, k=1, E=1: expected tokens per expert == T
        cfg = P.sm100_block_config(e, 1, 1, 1)
        assert (cfg.block_m, cfg.block_k, cfg.num_epilogue_threads) == (bm, bk, threads), e
    with pytest.raises(InputError, match="block_m"):
        P.sm100_block_config(1, 1, 1, 1, block_m=100)


def test_pool_capacity_v4_pro_ep8():
    # align(8*8192*6 + 48*191, 384) = align(402384, 384) = 1048 * 384
    assert P.pool_capacity_tokens(8, 8192, 6, 48) == 402432


def test_bytes_per_pull():
    assert P.bytes_per_pull(7168) == 3584
    assert P.bytes_per_pull(4096) == 4096
    assert P.bytes_per_pull(8192) == 4096
    assert P.bytes_per_pull(1536) == 1536


def test_stages_v4_pro_block_192():
    # fixed = expert counts align(384*4,1024)=2048 + pull buffers align(3584*4,1024)=14336
    #   + C/D align(max(2*32*64*2, 2*32*128*2),1024)=16384 + amax 32*8*4=1024
    #   + barriers (4+4+16)*8=192 + tmem ptr 4 = 33988
    # per stage = 96*128 + 128*128 + 256*4 + 128*4 + 16 = 30224; (232448-33988)//30224 = 6
    cfg = P.sm100_block_config(8192, 8, 6, 384)
    stages, smem = P.sm100_pipeline(P.SM100_SMEM_CAPACITY, 384, 7168, cfg, 3584)
    assert (stages, smem) == (6, 33988 + 6 * 30224)


def test_experts_per_wave_real_shapes():
    # V4-Pro EP8 T=8192: m_blocks=ceil(1024/192)=6, L1 blocks/expert=6*48=288 >= 148 SMs,
    # min fill = ceil(2*148/288) = 2
    assert P.sm100_experts_per_wave(48, 8192, 6, 3072, 192, 128, 148, 402432, 8192, 8) == 2
    # V4-Flash EP8 T=512: block_m 128, 1 m block, 32 L1 blocks/expert, min fill ceil(296/32)=10,
    # sweep 10..20 for the best tail ratio of 32 % epw: 16 divides 32 (ratio 1.0)
    assert P.sm100_experts_per_wave(32, 512, 6, 2048, 128, 128, 148, 399360, 8192, 8) == 16
    # fewer than one token per expert: all experts at once
    assert P.sm100_experts_per_wave(32, 1, 6, 2048, 16, 128, 148, 399360, 8192, 8) == 32
    # a small pool caps the wave: one expert's worst case is R*T_max = 8*8192 tokens
    assert P.sm100_experts_per_wave(32, 512, 6, 2048, 128, 128, 148, 65536, 8192, 8) == 1
    with pytest.raises(InputError, match="pool_tokens"):
        P.sm100_experts_per_wave(32, 512, 6, 2048, 128, 128, 148, 1000, 8192, 8)


def _tiny_plan(num_sms=4):
    ids = [np.array([[0], [0], [1], [2], [2], [2], [3], [0]])]
    return P.build_plan(num_experts=4, top_k=1, hidden=256, intermediate=256, num_ranks=1,
                        tokens_per_rank=[8], max_tokens_per_rank=8, topk_idx=ids, num_sms=num_sms,
                        smem_capacity=P.SM100_SMEM_CAPACITY)


def test_tiny_scheduler_sequence_by_hand():
    # 4 experts (3,1,3,1 tokens), block_m 16 (e=2), L1: 2I/128 = 4 n blocks, L2: H/128 = 2.
    # experts per wave: 1 m block x 4 = 4 L1 blocks >= 4 SMs -> min fill ceil(8/4) = 2.
    p = _tiny_plan()
    rp = p.ranks[0]
    assert rp.config.block_m == 16 and rp.experts_per_wave == 2
    L1, L2 = 1, 2
    want = {
        0: [(L1, 0, 0, 0), (L1, 1, 0, 0), (L2, 0, 0, 0), (L1, 2, 0, 0), (L1, 3, 0, 0), (L2, 2, 0, 0)],
        1: [(L1, 0, 0, 1), (L1, 1, 0, 1), (L2, 0, 0, 1), (L1, 2, 0, 1), (L1, 3, 0, 1), (L2, 2, 0, 1)],
        2: [(L1, 0, 0, 2), (L1, 1, 0, 2), (L2, 1, 0, 0), (L1, 2, 0, 2), (L1, 3, 0, 2), (L2, 3, 0, 0)],
        3: [(L1, 0, 0, 3), (L1, 1, 0, 3), (L2, 1, 0, 1), (L1, 2, 0, 3), (L1, 3, 0, 3), (L2, 3, 0, 1)],
    }
    for sm, seq in want.items():
        assert [tuple(r[:4]) for r in rp.sm_blocks(sm).tolist()] == seq
    assert rp.pool_block_offset.tolist() == [0, 1, 2, 3, 4]


def _deepgemm_state_machine(tokens, block_m, nl1, nl2, epw, num_sms, sm):
    """A literal re-statement of MegaMoEScheduler::get_next_block (DeepGEMM 7f2a703) for one SM."""
    E = len(tokens)
    mblocks = [-(-t // block_m) for t in tokens]
    out, phase, cur, block_idx = [], 1, 0, sm
    while cur < E:
        wave_end = min(((cur // epw) + 1) * epw, E)
        if phase == 1:
            found = False
            while cur < wave_end:
                m = block_idx // nl1
                if m < mblocks[cur]:
                    found = True
                    break
                block_idx -= mblocks[cur] * nl1
                cur += 1
            if found:
                out.append((1, cur, m, block_idx - m * nl1))
                block_idx += num_sms
            else:
                phase = 2
                cur = ((cur - 1) // epw) * epw
        else:
            found = False
            while cur < wave_end:
                if block_idx < mblocks[cur] * nl2:
                    m = block_idx // nl2
                    found = True
                    break
                block_idx -= mblocks[cur] * nl2
                cur += 1
            if found:
                out.append((2, cur, m, block_idx - m * nl2))
                block_idx += num_sms
            else:
                phase = 1
    return out


def test_block_sequence_matches_deepgemm_state_machine():
    spec = RoutingSpec(kind="zipf", zipf_exponent=1.0)
    for seed, (E, R, T, S) in enumerate([(16, 2, 64, 8), (32, 4, 300, 16), (8, 1, 5, 6)]):
        ids = generate(spec, R, [T] * R, E, 2, seed)
        p = P.build_plan(num_experts=E, top_k=2, hidden=512, intermediate=256, num_ranks=R,
                         tokens_per_rank=[T] * R, max_tokens_per_rank=T, topk_idx=ids, num_sms=S)
        for rp in p.ranks:
            tok = rp.tokens_per_expert.tolist()
            for sm in range(S):
                want = _deepgemm_state_machine(tok, rp.config.block_m, rp.l1_n_blocks, rp.l2_n_blocks,
                                               rp.experts_per_wave, S, sm)
                got = [tuple(r[:4]) for r in rp.sm_blocks(sm).tolist()]
                assert got == want, (seed, rp.rank, sm)


def test_two_cta_pairs_share_m_block():
    ids = generate(RoutingSpec(), 8, [512] * 8, 256, 6, 0)
    p = P.build_plan(num_experts=256, top_k=6, hidden=4096, intermediate=2048, num_ranks=8,
                     tokens_per_rank=[512] * 8, max_tokens_per_rank=8192, topk_idx=ids, num_sms=148)
    b = p.ranks[3].blocks()
    a, c = b[0::2], b[1::2]
    assert (a[:, :3] == c[:, :3]).all() and (c[:, 3] == a[:, 3] + 1).all()


def test_token_conservation_every_item_pulled_once():
    R, E, k, T = 4, 16, 3, 50
    ids = generate(RoutingSpec(kind="masked", masked_ratio=0.2), R, [T] * R, E, k, 7)
    p = P.build_plan(num_experts=E, top_k=k, hidden=256, intermediate=256, num_ranks=R,
                     tokens_per_rank=[T] * R, max_tokens_per_rank=T, topk_idx=ids, num_sms=8)
    seen = []
    for rp in p.ranks:
        for e in range(E // R):
            for src, tok, slot in rp.pool_sources(e).tolist():
                assert ids[src][tok, slot] == rp.rank * (E // R) + e
                seen.append((src, tok, slot))
    want = [(r, t, s) for r in range(R) for t in range(T) for s in range(k) if ids[r][t, s] >= 0]
    assert sorted(seen) == sorted(want) and len(seen) == len(set(seen))


def test_bad_inputs_name_the_field():
    ids = [np.zeros((4, 2), dtype=np.int64)]
    kw = dict(num_experts=8, top_k=2, hidden=256, intermediate=256, num_ranks=1, tokens_per_rank=[4],
              max_tokens_per_rank=4, topk_idx=ids, num_sms=8)
    with pytest.raises(InputError, match="^ranks"):
        P.build_plan(**{**kw, "num_ranks": 3, "tokens_per_rank": [4] * 3, "topk_idx": ids * 3})
    with pytest.raises(InputError, match="^experts_per_wave"):
        P.build_plan(**kw, experts_per_wave=9)
    with pytest.raises(InputError, match="^num_sms"):
        P.build_plan(**{**kw, "num_sms": 7})
    with pytest.raises(InputError, match="^l2_wait"):
        P.build_plan(**kw, l2_wait="never")


def test_sm90_design_plan_numbers():
    # V4-Flash EP1 T=512: e = 512*6/256 = 12 -> block_m 16 (smallest of 16/32/64/128 >= e);
    # experts per wave at one CTA per SM: smallest divisor w of 256 with w * 1 m block * 32 L1 n
    # blocks >= 2*132 -> 16 (<= 32: no wide walk), so two CTAs per SM (kernel v9.2), whose waves
    # follow the same rule over 264 CTAs: w * 32 >= 2*264 -> 32 (at most 32);
    # stage = align1024(16*128 + 8192 + 512 + 2*16*4) = align1024(10880) = 11264
    # (token tile, packed weights, their scales, the FP32 token scales of two 64-K groups);
    # fixed = align1024(1024 + align(256*12+64, 128) + align(20*16*4, 128)) = align1024(5504) = 6144
    # (barriers, dispatch scratch, the L1 epilogue's [20][block_m] FP32 scratch);
    # stages at two CTAs: min(8, (233472 / 2 - 1024 - 6144) // 11264 = 9) = 8; smem = 6144 + 8*11264 = 96256;
    # at one CTA (asked for): min(16, (232448 - 6144) // 11264 = 20) = 16; smem = 6144 + 16*11264 = 186368
    ids = generate(RoutingSpec(), 1, [512], 256, 6, 0)
    kw = {"num_experts": 256, "top_k": 6, "hidden": 4096, "intermediate": 2048, "num_ranks": 1,
          "tokens_per_rank": [512], "max_tokens_per_rank": 512, "topk_idx": ids, "num_sms": 132,
          "design": "megamoe-sm90"}
    p = P.build_plan(**kw)
    rp = p.ranks[0]
    assert (rp.config.block_m, rp.config.cluster_size, rp.experts_per_wave) == (16, 1, 32)
    assert (rp.ctas_per_sm, rp.num_sms, p.num_sms) == (2, 264, 132)
    assert (rp.num_stages, rp.smem_bytes) == (8, 96256)
    # CTA c runs rows c, c+264, ... of the same scheduler list
    assert (rp.sm_blocks(263) == rp.blocks()[263::264]).all()
    assert {k: p.to_dict()["ranks"][0][k] for k in ("ctas_per_sm", "num_units")} == {"ctas_per_sm": 2, "num_units": 264}
    one = P.build_plan(**kw, ctas_per_sm=1).ranks[0]
    assert (one.ctas_per_sm, one.num_sms, one.experts_per_wave, one.num_stages, one.smem_bytes) == (1, 132, 16, 16, 186368)
    assert (one.sm_blocks(131) == one.blocks()[131::132]).all()
    with pytest.raises(InputError, match=r"^ctas_per_sm: expected 1 at block_m 32"):
        P.build_plan(**kw, block_m=32, ctas_per_sm=2)
    with pytest.raises(InputError, match="block_m: expected one of 16, 32, 64, 128"):
        P.build_plan(num_experts=256, top_k=6, hidden=4096, intermediate=2048, num_ranks=1,
                     tokens_per_rank=[512], max_tokens_per_rank=512, topk_idx=ids, num_sms=132,
                     design="megamoe-sm90", block_m=192)


def test_sm90_k_split_repeats_each_block_per_k_part():
    # the tiny routing of _tiny_plan on the SM90 design: 4 experts (3, 1, 3, 1 tokens), block_m 16,
    # L1 4 n blocks (2I/128), L2 2 (H/128); hidden = intermediate = 256: 2 K blocks in each GEMM.
    # k_split 2: every row of the unsplit list twice, K parts 0 then 1, on consecutive indices
    # (so SM s runs rows s, s + 4, ... of the doubled list: part 0 on one SM, part 1 on the next)
    ids = [np.array([[0], [0], [1], [2], [2], [2], [3], [0]])]
    kw = {"num_experts": 4, "top_k": 1, "hidden": 256, "intermediate": 256, "num_ranks": 1, "tokens_per_rank": [8],
          "max_tokens_per_rank": 8, "topk_idx": ids, "num_sms": 4, "design": "megamoe-sm90"}
    one, two = P.build_plan(**kw).ranks[0], P.build_plan(**kw, k_split=2).ranks[0]
    assert one.k_split == 1 and two.k_split == 2
    b1, b2 = one.blocks(), two.blocks()
    assert b1.shape == (6 * 4, 6) and (b1[:, 5] == 0).all()  # 4 experts x (4 + 2) blocks
    assert b2.shape == (2 * len(b1), 6)
    assert (b2[0::2, :5] == b1[:, :5]).all() and (b2[1::2, :5] == b1[:, :5]).all()
    assert b2[:, 5].tolist() == [0, 1] * len(b1)
    # first row of the list: expert 0's L1 n block 0, part 0 on SM 0 and part 1 on SM 1
    assert two.sm_blocks(0)[0].tolist() == [1, 0, 0, 0, 0, 0]
    assert two.sm_blocks(1)[0].tolist() == [1, 0, 0, 0, 0, 1]
    assert P.build_plan(**kw, k_split=2).to_dict()["ranks"][0]["k_split"] == 2
    for bad, msg in ((3, "k_split: expected a divisor of both GEMMs' K blocks \\(2 and 2\\), got 3"),
                     (0, "k_split: expected None or an integer >= 1, got 0"),
                     (True, "k_split: expected None or an integer >= 1, got True")):
        with pytest.raises(InputError, match=msg):
            P.build_plan(**kw, k_split=bad)
    with pytest.raises(InputError, match="^k_split: expected 1 with design deepgemm-sm100"):
        P.build_plan(**{**kw, "design": "deepgemm-sm100"}, k_split=2)


def test_sm90_wgmma_n_step_is_the_kernels_or_the_what_ifs(monkeypatch):
    """RankPlan.wgmma_n_step: the kernel's step at the rank's block_m (design_sm90.WGMMA_N_STEP;
    whole blocks where it has none, as kernel v9.11), or the what-if's, at most block_m (a step
    past it runs whole blocks); a multiple of 8 from 8 to 128, megamoe-sm90 only; in to_dict."""
    from megamoe import design_sm90

    ids = [np.array([[0], [0], [1], [2], [2], [2], [3], [0]])]
    kw = {"num_experts": 4, "top_k": 1, "hidden": 256, "intermediate": 256, "num_ranks": 1, "tokens_per_rank": [8],
          "max_tokens_per_rank": 8, "topk_idx": ids, "num_sms": 4, "design": "megamoe-sm90"}
    assert P.build_plan(**kw).ranks[0].config.block_m == 16
    assert P.build_plan(**kw).ranks[0].wgmma_n_step == min(16, design_sm90.WGMMA_N_STEP.get(16, 16))
    assert P.build_plan(**kw, wgmma_n_step=8).ranks[0].wgmma_n_step == 8
    assert P.build_plan(**kw, wgmma_n_step=32).ranks[0].wgmma_n_step == 16
    assert P.build_plan(**kw, wgmma_n_step=8).to_dict()["ranks"][0]["wgmma_n_step"] == 8
    monkeypatch.setitem(design_sm90.WGMMA_N_STEP, 16, 8)  # a kernel built with a step at block_m 16
    assert P.build_plan(**kw).ranks[0].wgmma_n_step == 8
    assert P.build_plan(**kw, wgmma_n_step=16).ranks[0].wgmma_n_step == 16
    for bad in (0, 4, 12, 136, True, 8.0, "8"):
        with pytest.raises(InputError, match="^wgmma_n_step: expected a multiple of 8 from 8 to 128"):
            P.build_plan(**kw, wgmma_n_step=bad)
    with pytest.raises(InputError, match="^wgmma_n_step: expected no value with design deepgemm-sm100"):
        P.build_plan(**{**kw, "design": "deepgemm-sm100"}, wgmma_n_step=8)
    assert P.build_plan(**{**kw, "design": "deepgemm-sm100"}).ranks[0].wgmma_n_step == 16  # whole blocks


def test_memory_per_rank_is_the_kernels_allocation_and_the_layouts_sum():
    """Plan.memory_per_rank. megamoe-sm90: the pools are what megamoe.kernel.runtime.pool_buffers
    allocates (summed here from tensors on torch's meta device, a second method), the combine
    buffer K x T x H BF16. deepgemm-sm100, hand-computed for a tiny shape (E=8, k=2, H=512, I=256,
    EP2, T_max=32): pool = align(2 x 32 x 2 + 4 x 191, 384) = 1152 rows of 512 + 16 + 4 + 256 + 8
    bytes; weights 4 experts x (1.5 x 512 x 256 + 3 x 512 x 256 / 32); combine 2 x 32 x 512 x 2;
    input 32 x (512 + 16 + 2 x 8 + 2 x 4)."""
    torch = pytest.importorskip("torch")
    from megamoe import design_sm90
    from megamoe.kernel.runtime import pool_buffers
    from megamoe.scenario import Scenario
    from sim import simulate

    res = simulate(Scenario(shape="deepseek-v4-flash", num_ranks=1, tokens_per_rank=64, max_tokens_per_rank=64,
                            design="megamoe-sm90", hardware="h200"))
    des = design_sm90.design_for(64, 4096, 2048, 256, 6, num_sms=132)
    assert res.plan.pool_tokens == des.pool_rows
    mem = res.plan.memory_per_rank()
    pools = sum(t.numel() * t.element_size() for t in pool_buffers(torch, des, 4096, 2048, "meta").values())
    assert mem["pools"] == pools and mem["combine"] == 6 * 64 * 4096 * 2
    assert mem["weights"] == 256 * (3 * 4096 * 2048 // 2 + 3 * 4096 * 2048 // 32)
    assert mem["total"] == sum(v for k, v in mem.items() if k != "total")
    plan = P.build_plan(design="deepgemm-sm100", num_experts=8, top_k=2, hidden=512, intermediate=256, num_ranks=2,
                        tokens_per_rank=[4, 4], max_tokens_per_rank=32, num_sms=148,
                        topk_idx=[np.zeros((4, 2), dtype=np.int64) + [0, 1]] * 2)
    assert plan.pool_tokens == 1152
    assert plan.memory_per_rank() == {"weights": 4 * (3 * 512 * 256 // 2 + 3 * 512 * 256 // 32),
                                      "pools": 1152 * (512 + 16 + 4 + 256 + 8), "combine": 2 * 32 * 512 * 2,
                                      "input": 32 * (512 + 16 + 16 + 8),
                                      "total": 4 * (196608 + 12288) + 1152 * 796 + 65536 + 32 * 552}
