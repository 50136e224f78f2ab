// megamoe: the persistent FP8 x FP4 MoE mega-kernel for SM100 (B200), EP = 1.
//
// COMPILED AND DISASSEMBLED ONLY: no SM100 GPU has run this code (see benchmarks/
// NOTES_kernel.md, "SM100 path"). Everything architecture-neutral is shared with the SM90
// kernel that passes its GPU suite on an H200 (params.h, common.cuh, scheduler.cuh,
// roles_shared.cuh); the matrix path is mma_sm100.cuh (CuTe SM100 atoms).
//
// One launch, one CTA per SM, 2-CTA clusters (SMs 2c, 2c+1 get the same (expert, m block)
// and adjacent n blocks from the scheduler), 512 threads:
//   warps 0-3   dispatch : count, count barrier, pool offsets, pull rows + scales (scales
//                          UTCCP-transposed per pool block) -> arrival counts.
//   warps 4-6   producer : per stage, its CTA's half of the token tile (E4M3, cp.async into
//                          SWIZZLE_128B K-major rows), the token scales (full block), its own
//                          n block's 128 weight rows (E2M1 unpacked to one byte per element,
//                          swizzled) and their scales; then an async-proxy fence and one
//                          cluster-scope arrive per warp on the LEADER's full barrier.
//   warp 7      MMA      : leader CTA only: UTCCP scales -> TMEM, 2-CTA block-scaled UMMA
//                          (M 256 = two n blocks, N = block_m tokens, K 32 per instruction)
//                          into one of 2 TMEM accumulator stages; commits multicast to both
//                          CTAs (stage free, accumulator full). Both CTAs' warp 7 own TMEM.
//   warps 8-15  epilogue : 2 warpgroups (token halves) x 4 warps (32 TMEM lanes each = 32
//                          weight rows); L1: SwiGLU on gate/up lanes (8-row interleave ->
//                          partner lane ^ 8), top-k weight, per-32 amax -> UE8M0 -> E4M3 to
//                          the L2 pool + mask bit; L2: BF16 rows into the combine buffer.
// Then grid sync + combine (all threads), as SM90.
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <stdint.h>
#include "params.h"
#include "common.cuh"
#include "scheduler.cuh"
#include "roles_shared.cuh"
#include "mma_sm100.cuh"

namespace megamoe {

// Extra plan numbers of the SM100 path (params.h is shared with SM90 and left unchanged).
// Every field 8 bytes (ctypes mirror: megamoe.design_sm100.Sm100Params).
struct Sm100Params {
    Params base;
    int64_t block_k;       // 128, or 256 for block_m 16 (megamoe.plan.sm100_block_config)
    int64_t pull_bytes;    // megamoe.plan.bytes_per_pull(hidden)
    int64_t sf_pool_rows;  // pool_rows / block_m * align(block_m, 128)
    int64_t reserved;
};

namespace k100 {

constexpr int kThreads = 512;
constexpr int kDispatchThreads = 128, kProducerThreads = 96, kEpilogueThreads = 256;
constexpr int kProducerWarp0 = 4, kMmaWarp = 7, kEpilogueWarp0 = 8;
constexpr int kAccStages = 2;
constexpr uint32_t kBarEpiWG0 = 3, kBarEpiAll = 5;
constexpr int kAtomTokens = 8;  // tokens (TMEM columns) per epilogue TMEM load

__host__ __device__ constexpr int64_t align_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }
__host__ __device__ constexpr int sf_block_m(int bm) { return (int)align_up(bm, 128); }

// Per-stage operand bytes: token half-tile, weight tile (unpacked FP4 = 1 B/elem), token
// scales (align(bm,128) rows x bk/32 bytes), weight scales. Equals megamoe.plan.sm100_pipeline's
// per-stage bytes minus its 16 bytes of barriers (which live in this kernel's barrier block).
__host__ __device__ constexpr int64_t a_bytes(int bm, int bk) { return (int64_t)(bm / 2) * bk; }
__host__ __device__ constexpr int64_t b_bytes(int bk) { return (int64_t)128 * bk; }
__host__ __device__ constexpr int64_t sfa_bytes(int bm, int bk) { return (int64_t)sf_block_m(bm) * (bk / 32); }
__host__ __device__ constexpr int64_t sfb_bytes(int bk) { return (int64_t)128 * (bk / 32); }
__host__ __device__ constexpr int64_t stage_bytes(int bm, int bk) {
    return a_bytes(bm, bk) + b_bytes(bk) + sfa_bytes(bm, bk) + sfb_bytes(bk);
}
// Fixed region: 1 KB alignment slack, 1 KB barriers + TMEM pointer, dispatch scratch,
// epilogue amax exchange; rounded to 1 KB so that every operand tile is 1 KB aligned.
__host__ __device__ constexpr int64_t fixed_bytes(int num_experts) {
    return 1024 + align_up(1024 + align_up((int64_t)num_experts * 12 + 64, 128) + 2 * 4 * kAtomTokens * 4, 1024);
}
__host__ __device__ constexpr int64_t smem_bytes(int bm, int bk, int stages, int num_experts) {
    return fixed_bytes(num_experts) + (int64_t)stages * stage_bytes(bm, bk);
}
template <int BM, int BK>
struct Tmem {
    static constexpr int kSfTokCols = (sf_block_m(BM) / 128) * 4;  // per 128-K half
    static constexpr int kColAcc = 0;                               // + stage * BM
    static constexpr int kColSfTok = kAccStages * BM;               // + half * kSfTokCols
    static constexpr int kColSfW = kColSfTok + (BK / 128) * kSfTokCols;  // + half * 4
    static constexpr int kUsed = kColSfW + (BK / 128) * 4;
    static constexpr int kCols = kUsed <= 32 ? 32 : kUsed <= 64 ? 64 : kUsed <= 128 ? 128 : kUsed <= 256 ? 256 : 512;
    static_assert(kUsed <= 512, "TMEM columns");
};

struct Smem {
    uint64_t *full, *empty, *tmem_full, *tmem_empty;
    uint32_t* tmem_ptr;
    int *hist, *cta_base, *off_blk, *scan;
    float* red;
    uint8_t *a, *b, *sfa, *sfb;
};
template <int BM, int BK>
__device__ __forceinline__ Smem carve(uint8_t* raw, int S, int E) {
    Smem m;
    uint8_t* base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
    m.full = reinterpret_cast<uint64_t*>(base);
    m.empty = m.full + 32;
    m.tmem_full = m.empty + 32;
    m.tmem_empty = m.tmem_full + kAccStages;
    m.tmem_ptr = reinterpret_cast<uint32_t*>(m.tmem_empty + kAccStages);
    m.hist = reinterpret_cast<int*>(base + 1024);
    m.cta_base = m.hist + E;
    m.off_blk = m.cta_base + E;
    m.scan = m.off_blk + E;
    m.red = reinterpret_cast<float*>(base + 1024 + align_up((int64_t)E * 12 + 64, 128));
    uint8_t* ops = base + (fixed_bytes(E) - 1024);  // fixed_bytes counts the 1 KB alignment slack
    m.a = ops;
    m.b = m.a + S * a_bytes(BM, BK);
    m.sfa = m.b + S * b_bytes(BK);
    m.sfb = m.sfa + S * sfa_bytes(BM, BK);
    return m;
}

__device__ __forceinline__ int wave_of(const Params& p, int e) { return e / (int)p.experts_per_wave; }

// Wait for a pool block's data: L1 = arrival count == valid rows; L2 = the mask bits of the
// L1 N blocks covering K block kb. Every calling thread spins (as SM90).
__device__ __forceinline__ bool wait_l1_arrival(const Params& p, const Block& b) {
    uint32_t v = ld_acquire_u32(p.arrival + b.pool_block);
    if (v == (uint32_t)b.valid_m) return true;
    Deadline d(p.timeout_ns);
    while ((v = ld_acquire_u32(p.arrival + b.pool_block)) != (uint32_t)b.valid_m) {
        if (!d.tick(p)) {
            if (!aborted(p)) raise_error(p, kErrTimeoutArrival, kRoleProducer, b.expert, b.m_block, b.n_block, -1, v);
            return false;
        }
    }
    return true;
}
template <int BK>
__device__ __forceinline__ bool wait_l2_mask(const Params& p, const Block& b, int kb, unsigned long long& have) {
    constexpr int kBits = BK / 64;  // L1 N blocks (64 intermediate channels each) per L2 K block
    const unsigned long long need = ((1ull << kBits) - 1ull) << (kBits * kb);
    if ((have & need) == need) return true;
    have = ld_acquire_u64(p.mask + b.pool_block);
    if ((have & need) == need) return true;
    Deadline d(p.timeout_ns);
    while (((have = ld_acquire_u64(p.mask + b.pool_block)) & need) != need) {
        if (!d.tick(p)) {
            if (!aborted(p)) raise_error(p, kErrTimeoutMask, kRoleProducer, b.expert, b.m_block, b.n_block, kb, (uint32_t)have);
            return false;
        }
    }
    return true;
}

// ------------------------------------------------------------------ producer (warps 4-6)
template <int BM, int BK>
__device__ void producer_role(const Sm100Params& q, const Smem& m, uint32_t rank) {
    const Params& p = q.base;
    const int ptid = threadIdx.x - kDispatchThreads, lane = ptid & 31;
    const int S = (int)p.num_stages, H = (int)p.hidden, I = (int)p.inter;
    constexpr int kHalves = BK / 128, kRows = BM / 2, SFM = sf_block_m(BM);
    Scheduler<BM> sched(p);
    if (!sched.fetch_counts(p, kRoleProducer)) return;
    const bool trace = p.trace_cap > 0 && ptid == 0;
    int it = 0;
    for (;;) {
        Block b = sched.next();
        if (b.phase == kPhaseNone) break;
        const bool l1 = b.phase == kPhaseL1;
        const int kd = l1 ? H : I;
        b.num_k_blocks = kd / BK;
        const uint64_t tb = globaltimer();
        if (l1 && !wait_l1_arrival(p, b)) return;
        unsigned long long have = 0;
        const size_t prow0 = (size_t)b.pool_block * BM + rank * kRows;
        const uint8_t* a_src = (l1 ? p.l1_pool : p.l2_pool) + prow0 * kd;
        const uint8_t* sfa_src = l1 ? p.l1_pool_sf : p.l2_pool_sf;
        const size_t nrows = l1 ? 2 * (size_t)I : (size_t)H;  // weight rows per expert
        const uint8_t* w = (l1 ? p.w1 : p.w2) + ((size_t)b.expert * nrows + (size_t)b.n_block * 128) * (kd / 2);
        const uint8_t* wsf = l1 ? p.w1_sf : p.w2_sf;  // int32 [E][kd/128][nrows] (MN-major, UTCCP rows)
        for (int kb = 0; kb < b.num_k_blocks; ++kb, ++it) {
            if (!l1 && !wait_l2_mask<BK>(p, b, kb, have)) return;
            const int s = it % S, r = it / S;
            if (r > 0 && !sm100::mbar_wait_cluster(p, m.empty + s, (uint32_t)((r - 1) & 1), kRoleProducer)) return;
            uint8_t* sa = m.a + (size_t)s * a_bytes(BM, BK);
            uint8_t* sb = m.b + (size_t)s * b_bytes(BK);
            uint8_t* ssfa = m.sfa + (size_t)s * sfa_bytes(BM, BK);
            uint8_t* ssfb = m.sfb + (size_t)s * sfb_bytes(BK);
            #pragma unroll
            for (int h = 0; h < kHalves; ++h) {
                const int k0 = kb * BK + h * 128;
                // token rows of this CTA's half: 8 x 16-byte chunks per row, swizzled
                for (int c = ptid; c < kRows * 8; c += kProducerThreads) {
                    const int row = c >> 3, ch = c & 7;
                    cp_async_16_cg(sa + h * kRows * 128 + row * 128 + ((ch ^ (row & 7)) << 4),
                                   a_src + (size_t)row * kd + k0 + ch * 16);
                }
                // token scales of the whole block (UTCCP order, padded to SFM rows)
                const uint8_t* fsrc = sfa_src + (((size_t)(k0 / 128) * q.sf_pool_rows) + (size_t)b.pool_block * SFM) * 4;
                for (int c = ptid; c < SFM / 4; c += kProducerThreads)
                    cp_async_16_cg(ssfa + h * SFM * 4 + c * 16, fsrc + c * 16);
                // weight scales: 128 int32 of this n block, already UTCCP-transposed
                const uint8_t* wsrc = wsf + (((size_t)b.expert * (kd / 128) + k0 / 128) * nrows + (size_t)b.n_block * 128) * 4;
                for (int c = ptid; c < 32; c += kProducerThreads) cp_async_16_cg(ssfb + h * 512 + c * 16, wsrc + c * 16);
            }
            cp_async_commit();
            // weights: 128 rows x BK/32 packed 16-byte words -> unpacked, swizzled
            constexpr int kWords = 128 * (BK / 32);
            for (int c0 = ptid; c0 < kWords; c0 += 4 * kProducerThreads) {
                uint4 in[4];
                #pragma unroll
                for (int u = 0; u < 4; ++u) {
                    const int c = c0 + u * kProducerThreads;
                    if (c < kWords) {
                        const int n = c / (BK / 32), wk = c % (BK / 32);
                        in[u] = __ldg(reinterpret_cast<const uint4*>(w + (size_t)n * (kd / 2) + kb * (BK / 2)) + wk);
                    }
                }
                #pragma unroll
                for (int u = 0; u < 4; ++u) {
                    const int c = c0 + u * kProducerThreads;
                    if (c < kWords) {
                        const int n = c / (BK / 32), wk = c % (BK / 32);
                        const int h = wk / 4, ch = (wk % 4) * 2;  // two 16-byte chunks per packed word
                        const uint2 e0 = sm100::unpack_e2m1x8(in[u].x), e1 = sm100::unpack_e2m1x8(in[u].y);
                        const uint2 e2 = sm100::unpack_e2m1x8(in[u].z), e3 = sm100::unpack_e2m1x8(in[u].w);
                        uint8_t* row = sb + h * 128 * 128 + n * 128;
                        *reinterpret_cast<uint4*>(row + ((ch ^ (n & 7)) << 4)) = make_uint4(e0.x, e0.y, e1.x, e1.y);
                        *reinterpret_cast<uint4*>(row + (((ch + 1) ^ (n & 7)) << 4)) = make_uint4(e2.x, e2.y, e3.x, e3.y);
                    }
                }
            }
            cp_async_wait<0>();
            sm100::fence_async_shared();
            __syncwarp();
            if (lane == 0) sm100::mbar_arrive_cluster(m.full + s, 0);
        }
        if (trace) trace_record(p, kRoleProducer, l1 ? kKindL1Load : kKindL2Load, b.expert, b.m_block, b.n_block,
                                wave_of(p, b.expert), b.valid_m, tb, globaltimer());
    }
}

// ------------------------------------------------------------------ MMA issue (warp 7, leader)
// Lane 0 waits (cluster-scope acquire) if `need`; the result is broadcast so the warp stays
// converged and leaves together on a timeout.
__device__ __forceinline__ bool warp_wait(const Params& p, uint64_t* bar, bool need, uint32_t parity) {
    bool ok = true;
    if ((threadIdx.x & 31) == 0 && need) ok = sm100::mbar_wait_cluster(p, bar, parity, kRoleConsumer);
    __syncwarp();
    return __shfl_sync(0xffffffffu, ok ? 1 : 0, 0) != 0;
}

template <int BM, int BK>
__device__ void mma_role(const Sm100Params& q, const Smem& m, uint32_t tmem_base) {
    const Params& p = q.base;
    using TM = Tmem<BM, BK>;
    constexpr int kRows = BM / 2, kHalves = BK / 128;
    const int S = (int)p.num_stages, H = (int)p.hidden, I = (int)p.inter;
    const int lane = threadIdx.x & 31;
    Scheduler<BM> sched(p);
    if (!sched.fetch_counts(p, kRoleConsumer)) return;
    const auto idesc = sm100::instr_desc<BM>();
    const bool trace = p.trace_cap > 0 && lane == 0;
    int it = 0, acc_it = 0;
    for (;;) {
        Block b = sched.next();
        if (b.phase == kPhaseNone) break;
        const bool l1 = b.phase == kPhaseL1;
        b.num_k_blocks = (l1 ? H : I) / BK;
        const uint64_t tb = globaltimer();
        const int acc = acc_it % kAccStages, ar = acc_it / kAccStages;
        ++acc_it;
        // lane 0 waits; the warp reconverges before the elect-one tcgen05 issue (warp-uniform exit)
        if (!warp_wait(p, m.tmem_empty + acc, ar > 0, (uint32_t)((ar - 1) & 1))) return;
        sm100::tc_fence_after();
        const uint32_t tmem_d = tmem_base + TM::kColAcc + acc * BM;
        for (int kb = 0; kb < b.num_k_blocks; ++kb, ++it) {
            const int s = it % S, r = it / S;
            if (!warp_wait(p, m.full + s, true, (uint32_t)(r & 1))) return;
            sm100::tc_fence_after();
            const uint8_t* sa = m.a + (size_t)s * a_bytes(BM, BK);
            const uint8_t* sb = m.b + (size_t)s * b_bytes(BK);
            const uint8_t* ssfa = m.sfa + (size_t)s * sfa_bytes(BM, BK);
            const uint8_t* ssfb = m.sfb + (size_t)s * sfb_bytes(BK);
            if (cute::elect_one_sync()) {
                #pragma unroll
                for (int h = 0; h < kHalves; ++h) {
                    #pragma unroll
                    for (int g = 0; g < sf_block_m(BM) / 128; ++g)
                        sm100::utccp_128rows(ssfa + h * sf_block_m(BM) * 4 + g * 512, tmem_base + TM::kColSfTok + h * TM::kSfTokCols + g * 4);
                    sm100::utccp_128rows(ssfb + h * 512, tmem_base + TM::kColSfW + h * 4);
                }
            }
            __syncwarp();
            #pragma unroll
            for (int k = 0; k < BK / sm100::kUmmaK; ++k) {
                const int h = k / 4, j = k % 4;
                const auto wdesc = sm100::make_kmajor_sw128_desc(sb + h * 128 * 128);
                const auto tdesc = sm100::make_kmajor_sw128_desc(sa + h * kRows * 128);
                sm100::mma<BM>(sm100::advance_k(wdesc, j * 32), sm100::advance_k(tdesc, j * 32), tmem_d, kb > 0 || k > 0,
                               idesc, tmem_base + TM::kColSfW + h * 4, tmem_base + TM::kColSfTok + h * TM::kSfTokCols,
                               (uint32_t)j);
            }
            sm100::commit_pair(m.empty + s);                         // stage free in both CTAs
            if (kb == b.num_k_blocks - 1) sm100::commit_pair(m.tmem_full + acc);  // accumulator ready
            __syncwarp();
        }
        if (trace) trace_record(p, kRoleConsumer, l1 ? kKindL1Mma : kKindL2Mma, b.expert, b.m_block, b.n_block,
                                wave_of(p, b.expert), b.valid_m, tb, globaltimer());
    }
    // drain: the last accumulators must be consumed before TMEM is freed
    for (int a = acc_it - 1; a >= 0 && a >= acc_it - kAccStages; --a)
        if (!warp_wait(p, m.tmem_empty + a % kAccStages, true, (uint32_t)((a / kAccStages) & 1))) return;
}

// ------------------------------------------------------------------ epilogue (warps 8-15)
template <int BM, int BK>
__device__ void epilogue_role(const Sm100Params& q, const Smem& m, uint32_t tmem_base) {
    const Params& p = q.base;
    using TM = Tmem<BM, BK>;
    constexpr int SFM = sf_block_m(BM);
    const int etid = threadIdx.x - kEpilogueWarp0 * 32;
    const int ew = etid >> 5, lane = etid & 31, wg = ew >> 2, qw = ew & 3;
    const int T = (int)p.num_tokens, H = (int)p.hidden, I = (int)p.inter;
    Scheduler<BM> sched(p);
    if (!sched.fetch_counts(p, kRoleConsumer)) return;
    const bool do_clamp = p.clamp < 3.0e38;
    const float clamp_bf = __bfloat162float(__float2bfloat16_rn((float)p.clamp));
    const bool trace = p.trace_cap > 0 && etid == 0;
    const bool gate_lane = (lane & 8) == 0;
    float* red = m.red + wg * 4 * kAtomTokens;  // [4 warps][8 tokens] per warpgroup
    int acc_it = 0;
    bool dead = false;
    for (;;) {
        const Block b = sched.next();
        if (b.phase == kPhaseNone) break;
        const bool l1 = b.phase == kPhaseL1;
        const int acc = acc_it % kAccStages, ar = acc_it / kAccStages;
        ++acc_it;
        if (!dead && !sm100::mbar_wait_cluster(p, m.tmem_full + acc, (uint32_t)(ar & 1), kRoleConsumer)) dead = true;
        __syncwarp();
        dead = __any_sync(0xffffffffu, dead);
        sm100::tc_fence_after();
        const uint64_t te0 = globaltimer();
        const size_t prow0 = (size_t)b.pool_block * BM;
        const uint32_t taddr0 = tmem_base + ((uint32_t)(qw * 32) << 16) + TM::kColAcc + acc * BM;
        #pragma unroll 1
        for (int t0 = wg * (BM / 2); t0 < (wg + 1) * (BM / 2); t0 += kAtomTokens) {
            float v[kAtomTokens];
            if (!dead) sm100::tmem_load8(taddr0 + t0, v);
            else {
                #pragma unroll
                for (int i = 0; i < kAtomTokens; ++i) v[i] = 0.0f;
            }
            if (l1) {
                // gate rows 16j..16j+7, up rows 16j+8..16j+15 (megamoe.layouts.interleave_gate_up)
                float amax = 0.0f;
                float out[kAtomTokens];
                #pragma unroll
                for (int i = 0; i < kAtomTokens; ++i) {
                    const float up = __shfl_xor_sync(0xffffffffu, v[i], 8);
                    const float wt = __ldcg(p.pool_weight + prow0 + t0 + i);
                    out[i] = gate_lane ? swiglu_weighted(v[i], up, wt, do_clamp, clamp_bf) : 0.0f;
                }
                #pragma unroll
                for (int i = 0; i < kAtomTokens; ++i) {
                    float a = fabsf(out[i]);
                    #pragma unroll
                    for (int o = 1; o < 32; o <<= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
                    if (lane == i) amax = a;
                }
                if (lane < kAtomTokens) red[qw * kAtomTokens + lane] = amax;
                named_bar_sync(kBarEpiWG0 + wg, 128);
                // 32 output channels = warps (0,1) or (2,3) of the warpgroup
                const int ch = qw * 16 + (lane >> 4) * 8 + (lane & 7);  // channel in the n block's 64
                const int gidx = b.n_block * 2 + (qw >> 1);              // 32-wide scale group
                #pragma unroll
                for (int i = 0; i < kAtomTokens; ++i) {
                    const int t = t0 + i;
                    const float a = fmaxf(red[qw * kAtomTokens + i], red[(qw ^ 1) * kAtomTokens + i]);
                    float inv;
                    const int l = ue8m0_exponent(a, inv);
                    if (t < b.valid_m) {
                        if (gate_lane) p.l2_pool[(prow0 + t) * I + b.n_block * 64 + ch] = to_e4m3(out[i] * inv);
                        if ((qw & 1) == 0 && lane == 0) {
                            const size_t srow = (size_t)b.pool_block * SFM + utccp_row(t);
                            p.l2_pool_sf[(((size_t)(gidx >> 2)) * q.sf_pool_rows + srow) * 4 + (gidx & 3)] = (uint8_t)(l + 127);
                        }
                    }
                }
                named_bar_sync(kBarEpiWG0 + wg, 128);  // red reused by the next atom
            } else {
                const int ch = b.n_block * 128 + qw * 32 + lane;
                #pragma unroll
                for (int i = 0; i < kAtomTokens; ++i) {
                    const int t = t0 + i;
                    if (t < b.valid_m) {
                        const int tok = __ldcg(p.pool_token + prow0 + t), slot = __ldcg(p.pool_slot + prow0 + t);
                        const __nv_bfloat16 o = __float2bfloat16_rn(v[i]);
                        p.combine_buf[((size_t)slot * T + tok) * H + ch] = *reinterpret_cast<const uint16_t*>(&o);
                    }
                }
            }
        }
        // accumulator stage consumed: one cluster-scope arrive per warp on the leader's barrier
        sm100::tc_fence_before();
        __syncwarp();
        if (lane == 0) sm100::mbar_arrive_cluster(m.tmem_empty + acc, 0);
        if (l1) {
            __threadfence();
            named_bar_sync(kBarEpiAll, kEpilogueThreads);
            if (etid == 0) red_release_or_u64(p.mask + b.pool_block, 1ull << b.n_block);
        }
        if (trace) trace_record(p, kRoleConsumer, l1 ? kKindL1Epilogue : kKindL2Epilogue, b.expert, b.m_block, b.n_block,
                                wave_of(p, b.expert), b.valid_m, te0, globaltimer());
    }
}

// ------------------------------------------------------------------ the kernel
template <int BM, int BK>
__global__ void __launch_bounds__(kThreads, 1)
megamoe_sm100_kernel(const __grid_constant__ Sm100Params q) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 1000)
    extern __shared__ __align__(1024) uint8_t smem[];
    using TM = Tmem<BM, BK>;
    const Params& p = q.base;
    const int S = (int)p.num_stages, E = (int)p.num_experts;
    const Smem m = carve<BM, BK>(smem, S, E);
    const int warp = threadIdx.x >> 5;
    const uint32_t rank = sm100::cluster_rank();
    if (threadIdx.x == 0) {
        for (int s = 0; s < S; ++s) {
            mbar_init(m.full + s, 2 * (kProducerThreads / 32));  // one arrive per producer warp, both CTAs
            mbar_init(m.empty + s, 1);                          // tcgen05.commit (multicast)
        }
        for (int a = 0; a < kAccStages; ++a) {
            mbar_init(m.tmem_full + a, 1);                       // tcgen05.commit (multicast)
            mbar_init(m.tmem_empty + a, 2 * (kEpilogueThreads / 32));  // one per epilogue warp, both CTAs
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    if (warp == kMmaWarp) {
        cute::TMEM::Allocator2Sm alloc;
        alloc.allocate(TM::kCols, m.tmem_ptr);
        alloc.release_allocation_lock();
    }
    sm100::tc_fence_before();
    __syncthreads();
    sm100::cluster_sync();
    sm100::tc_fence_after();
    const uint32_t tmem_base = *reinterpret_cast<volatile uint32_t*>(m.tmem_ptr);

    if (warp < kProducerWarp0) {
        const int64_t sf_rows = q.sf_pool_rows;
        dispatch_pull<BM>(p, m.hist, m.cta_base, m.off_blk, m.scan, UtccpSfRow{sf_rows, sf_block_m(BM)}, (int)q.pull_bytes);
    } else if (warp < kMmaWarp) {
        producer_role<BM, BK>(q, m, rank);
    } else if (warp == kMmaWarp) {
        if (rank == 0) mma_role<BM, BK>(q, m, tmem_base);
    } else {
        epilogue_role<BM, BK>(q, m, tmem_base);
    }
    sm100::tc_fence_before();
    __syncthreads();
    sm100::cluster_sync();  // the pair's MMAs and TMEM reads are all done
    if (warp == kMmaWarp) {
        sm100::tc_fence_after();
        cute::TMEM::Allocator2Sm().free(tmem_base, TM::kCols);
    }
    combine_and_clean<BM>(p, kThreads);
#endif
}

}  // namespace k100
}  // namespace megamoe

// ------------------------------------------------------------------ host API (C ABI, ctypes)
using megamoe::Params;
using megamoe::Sm100Params;

// Template instances: (block_m, block_k) of megamoe.plan's deepgemm-sm100 block table.
#define MEGAMOE_SM100_INSTANCES(X) X(16, 256) X(32, 128) X(64, 128) X(96, 128) X(128, 128) X(192, 128)

template <int BM, int BK>
static int launch_inst(const Sm100Params* q, cudaStream_t stream, size_t smem) {
    auto kern = megamoe::k100::megamoe_sm100_kernel<BM, BK>;
    cudaError_t err = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err != cudaSuccess) return (int)err;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)q->base.num_sms);
    cfg.blockDim = dim3(megamoe::k100::kThreads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = 2; attr[0].val.clusterDim.y = 1; attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    int clusters = 0;
    err = cudaOccupancyMaxActiveClusters(&clusters, (void*)kern, &cfg);
    if (err != cudaSuccess) return (int)err;
    if (clusters * 2 < q->base.num_sms) return -3;  // every CTA must be co-resident (count barrier, grid sync)
    return (int)cudaLaunchKernelEx(&cfg, kern, *q);
}

extern "C" {

int megamoe_sm100_abi_size() { return (int)sizeof(Sm100Params); }

long long megamoe_sm100_stage_bytes(int block_m, int block_k) {
    return (long long)megamoe::k100::stage_bytes(block_m, block_k);
}
long long megamoe_sm100_smem_bytes(int block_m, int block_k, int stages, int num_experts) {
    return (long long)megamoe::k100::smem_bytes(block_m, block_k, stages, num_experts);
}
int megamoe_sm100_tmem_cols(int block_m, int block_k) {
#define X(BM, BK) if (block_m == BM && block_k == BK) return megamoe::k100::Tmem<BM, BK>::kCols;
    MEGAMOE_SM100_INSTANCES(X)
#undef X
    return -1;
}
// 0 if a compiled instance takes these plan numbers and they fit the SM100 limits, else
// the launch error code (see megamoe_sm100_error_string). No GPU needed.
int megamoe_sm100_check_config(int block_m, int block_k, int stages, int experts_per_wave, int num_experts,
                               int hidden, int inter, long long pool_rows, int pull_bytes, int num_sms) {
    if (megamoe_sm100_tmem_cols(block_m, block_k) < 0) return -1;
    if (num_sms < 2 || num_sms % 2) return -2;
    if (hidden % 256 || inter % 128 || (2 * inter) % 256 || 2 * inter / 128 > 64 || num_experts < 1 ||
        num_experts > 256 || stages < 2 || stages > 32 || experts_per_wave < 1 || pool_rows % block_m ||
        hidden % block_k || inter % block_k || pull_bytes < 16 || pull_bytes % 16)
        return -5;
    if (megamoe::k100::smem_bytes(block_m, block_k, stages, num_experts) > 232448) return -4;
    return 0;
}

int megamoe_sm100_launch(const Sm100Params* q, void* stream) {
    const Params& p = q->base;
    int dev = 0, sms = 0, major = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    if (major != 10) return -6;
    if (p.num_sms > sms) return -2;
    const int rc = megamoe_sm100_check_config((int)p.block_m, (int)q->block_k, (int)p.num_stages, (int)p.experts_per_wave,
                                              (int)p.num_experts, (int)p.hidden, (int)p.inter, p.pool_rows,
                                              (int)q->pull_bytes, (int)p.num_sms);
    if (rc != 0) return rc;
    const size_t smem = (size_t)megamoe::k100::smem_bytes((int)p.block_m, (int)q->block_k, (int)p.num_stages, (int)p.num_experts);
    cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
#define X(BM, BK) if (p.block_m == BM && q->block_k == BK) return launch_inst<BM, BK>(q, s, smem);
    MEGAMOE_SM100_INSTANCES(X)
#undef X
    return -1;
}

const char* megamoe_sm100_error_string(int code) {
    switch (code) {
        case -1: return "(block_m, block_k) must be one of (16,256) (32,128) (64,128) (96,128) (128,128) (192,128)";
        case -2: return "num_sms must be even (2-CTA clusters) and at most the device's SM count";
        case -3: return "not every 2-CTA cluster fits on the device at once (one CTA per SM)";
        case -4: return "shared memory for these stages exceeds 232448 bytes";
        case -5: return "unsupported shape or plan numbers";
        case -6: return "the SM100 kernel needs a compute capability 10.x device (sm_100a)";
        default: return cudaGetErrorString((cudaError_t)code);
    }
}

}  // extern "C"
