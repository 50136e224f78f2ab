// megamoe: architecture-neutral warp roles shared by the SM90 and SM100 kernels: dispatch
// (count -> count barrier -> pool-block offsets -> pull), the SwiGLU / UE8M0 epilogue math
// and the combine (+ workspace clean-up). Nothing here issues matrix instructions; both
// kernels call these same functions, so what the H200 runs is what SM100 compiles.
//
// Two things differ per architecture and are parameters:
//   * where a pulled row's UE8M0 scales go in the pool scale buffer (`SfRow`): SM90 keeps
//     `[K/128][pool_rows][4]` with the row = pool row; SM100 pads every pool block to
//     `sf_block_m` rows and stores them UTCCP-transposed (see `UtccpSfRow`);
//   * the pull chunk (`pull_bytes`, megamoe.plan.bytes_per_pull): a warp copies a row in
//     chunks of that many bytes.
// The EP (R > 1) dispatch is SM90's own (kernel_sm90.cu, dispatch_role_ep); the combine here
// serves both EP1 (grid sync) and EP (NVLink barrier 2).
#pragma once
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>
#include "params.h"
#include "common.cuh"

namespace megamoe {

constexpr int kSharedDispatchThreads = 128;
constexpr uint32_t kSharedBarDispatch = 1;
// dispatch_pull's LOCAL count with COUNTS_BAR > 0: the dispatch warps arrive here once every
// expert's count is in hist[] (the SM90 kernel's one-CTA wide instance, kernel v9.11).
constexpr uint32_t kSharedBarCounts = 4;

// Pool scale row of pool row `row` (SM90 layout: unpadded, untransposed).
struct IdentitySfRow {
    int64_t pool_rows;  // stride between K blocks, in rows
    __device__ __forceinline__ int64_t operator()(int64_t row, int /*bm*/) const { return row; }
    __device__ __forceinline__ int64_t stride() const { return pool_rows; }
};

// UTCCP order inside each 128 rows: [4, 32] -> [32, 4] (megamoe.layouts.utccp_transpose_sf):
// row r of a block is stored at (r & ~127) + (r & 31) * 4 + ((r >> 5) & 3).
__host__ __device__ __forceinline__ int utccp_row(int r) { return (r & ~127) + (r & 31) * 4 + ((r >> 5) & 3); }

// SM100 pool scale layout: pool block b owns rows [b * sf_block_m, (b + 1) * sf_block_m),
// sf_block_m = align(block_m, 128), UTCCP-transposed.
struct UtccpSfRow {
    int64_t sf_pool_rows;  // stride between K blocks, in rows
    int sf_block_m;
    __device__ __forceinline__ int64_t operator()(int64_t row, int bm) const {
        return (row / bm) * sf_block_m + utccp_row((int)(row % bm));
    }
    __device__ __forceinline__ int64_t stride() const { return sf_pool_rows; }
};

// ------------------------------------------------------------------ SwiGLU epilogue math
// The exact per-element math of the L1 epilogue (Numerics.sm90 / the reference): BF16 round
// of gate and up, optional clamp, silu(g) * u, times the top-k weight (FP32).
__device__ __forceinline__ float swiglu_gate(float gate, bool do_clamp, float clamp_bf) {
    const float g = __bfloat162float(__float2bfloat16_rn(gate));
    return do_clamp ? fminf(g, clamp_bf) : g;
}
__device__ __forceinline__ float swiglu_up(float up, bool do_clamp, float clamp_bf) {
    const float u = __bfloat162float(__float2bfloat16_rn(up));
    return do_clamp ? fmaxf(fminf(u, clamp_bf), -clamp_bf) : u;
}
__device__ __forceinline__ float swiglu_weighted(float gate, float up, float w, bool do_clamp, float clamp_bf) {
    const float g = swiglu_gate(gate, do_clamp, clamp_bf), u = swiglu_up(up, do_clamp, clamp_bf);
    const float silu = g / (1.0f + expf(-g));
    return (silu * u) * w;
}
// The same value without the division's slow path, for gates where the fast path is the IEEE
// quotient (swiglu_fast_ok): the reciprocal, one Newton step and the FMA correction that ptxas
// emits for div.rn.f32 (its slow path, behind a per-value branch, handles operands near the
// range limits); a zero gate gives itself (silu(+-0) = +-0). Branch-free: the L1 epilogue's
// values interleave (kernel v7.8).
__device__ __forceinline__ float swiglu_weighted_fast(float gate, float up, float w, bool do_clamp, float clamp_bf) {
    const float g = swiglu_gate(gate, do_clamp, clamp_bf), u = swiglu_up(up, do_clamp, clamp_bf);
    const float b = 1.0f + expf(-g);
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(b));
    r = fmaf(r, fmaf(-b, r, 1.0f), r);
    const float q = __fmul_rn(g, r);
    const float silu = g == 0.0f ? g : fmaf(fmaf(-b, q, g), r, q);
    return (silu * u) * w;
}
// A gate whose division the fast path gets exactly: zero, or 2^-64 <= |g| <= 2^64 with g > -40
// (then b = 1 + e^-g is in [1, 2^58] and the quotient in [2^-65, 2^64]: every intermediate is
// a normal number, far from where div.rn's range check sends it to the slow path).
__device__ __forceinline__ bool swiglu_fast_ok(float gate, bool do_clamp, float clamp_bf) {
    const float g = swiglu_gate(gate, do_clamp, clamp_bf), a = fabsf(g);
    return g == 0.0f || (a >= 0x1p-64f && a <= 0x1p64f && g > -40.0f);
}
// A UE8M0 scale byte's value as FP32, 2^(e - 127) (the pools' FP32 token scales, Params::l1_pool_fsx).
__device__ __forceinline__ float ue8m0_to_float(uint32_t e) { return __uint_as_float(e << 23); }
// Where the pulls write a pool row's FP32 token scales (K block 0, group 0): Params::l1_pool_fsx
// is [H/128][pool_rows / bm][2][bm].
__device__ __forceinline__ float* l1_pool_fsx_row(const Params& p, int row, int bm) {
    return p.l1_pool_fsx + (size_t)(row / bm) * 2 * bm + row % bm;
}
// UE8M0 exponent for a 32-group amax (ceil(log2(amax / 448))) and the matching 2^-e.
__device__ __forceinline__ int ue8m0_exponent(float amax, float& inv_scale) {
    const float scaled = amax * (1.0f / 448.0f);
    const uint32_t bits = __float_as_uint(scaled);
    const int l = (int)(bits >> 23) - 127 + ((bits & 0x7fffffu) != 0);
    inv_scale = ue8m0_to_float((uint32_t)(127 - l));
    return l;
}
__device__ __forceinline__ uint8_t to_e4m3(float v) {
    return (uint8_t)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
}

// ------------------------------------------------------------------ the SM90 activation fold
// Numerics.sm90_kernel() (x_fold_k = 64; megamoe.layouts.fold_e4m3_scales_for_sm90): in each
// 64-K group of a row, the 32-groups that hold a nonzero value are re-encoded with the largest
// of their scales s_max (values of a group 2^d below times 2^-d, rounded to nearest-even E4M3),
// and both scale bytes become s_max; a group of zeros is copied. The SM90 pulls fold each row
// as they copy it (fold_x_chunk), the L1 epilogue each value it quantizes (e4m3_scale). At
// block_m >= kL1Fold128BlockM the pulls fold per 128-K group instead (the L1 GEMM's x only,
// Numerics.sm90_kernel(block_m=...): x_fold_k 128, l2_x_fold_k 64), and the L1 GEMM promotes
// once per K block (mma_sm90.cuh).
// (megamoe.design_sm90.L1_X_FOLD_K; kernel v7.6. Only block_m 128's K loop has the chained form:
// mma_sm90.cuh.)
constexpr int kL1Fold128BlockM = 128;
// 2^-d as FP16 (0 from d = 25).
__device__ __forceinline__ unsigned short pow2_neg_h(int d) {
    return d <= 14 ? (unsigned short)((15 - d) << 10) : d <= 24 ? (unsigned short)(1u << (24 - d)) : 0;
}
__device__ __forceinline__ __half2 pow2_neg_h2(int d) {
    const unsigned short b = pow2_neg_h(d);
    return __halves2half2(__ushort_as_half(b), __ushort_as_half(b));
}
// Two floats as E4M3 (round to nearest even, saturating like to_e4m3): lo in bits 0-7, hi in 8-15.
__device__ __forceinline__ uint32_t e4m3x2_of(float lo, float hi) {
    return (uint32_t)__nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3);
}
// Two E4M3 values (low 16 bits) times m = 2^-d, rounded to nearest-even E4M3 once: E4M3 -> FP16
// is exact, and so is the FP16 product of every value that does not round to zero in E4M3
// anyway (a product's lowest bit is 2^(e - 3 - d) >= 2^-24 unless the product < 2^-20).
__device__ __forceinline__ uint32_t e4m3x2_scale(uint32_t two, __half2 m) {
    const __half2 h = __half2(__nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(two & 0xFFFFu), __NV_E4M3));
    return (uint32_t)__nv_cvt_halfraw2_to_fp8x2(__half2_raw(__hmul2(h, m)), __NV_SATFINITE, __NV_E4M3);
}
__device__ __forceinline__ uint32_t e4m3x4_scale(uint32_t w, __half2 m) {
    return e4m3x2_scale(w, m) | (e4m3x2_scale(w >> 16, m) << 16);
}
// One 16-byte chunk of a row (half a 32-group), called by all 32 lanes at once for chunks
// c0 + lane, c0 a multiple of 8: lanes 8i .. 8i + 7 hold one 128-K block, lanes 2g, 2g + 1 of
// it 32-group g, groups 2h, 2h + 1 the 64-K group h. sfw: the row's scale word of this lane's K
// block (byte g = group g). Returns the folded chunk; `word`: the K block's folded scale word
// (valid in lanes with lane % 8 == 0). Lanes past the row pass zeros (whole K blocks).
// F128: per 128-K group (the whole K block) instead of per 64.
template <bool F128>
__device__ __forceinline__ uint4 fold_x_chunk(uint4 x, uint32_t sfw, int lane, uint32_t& word) {
    const uint32_t s = (sfw >> (8 * ((lane >> 1) & 3))) & 0xFFu;
    uint32_t nz = ((x.x | x.y | x.z | x.w) & 0x7F7F7F7Fu) != 0u;
    nz |= __shfl_xor_sync(0xffffffffu, nz, 1);                // this 32-group has a nonzero value
    const uint32_t se = nz ? s : 0u;                          // (a group of zeros never sets s_max)
    uint32_t any = nz | __shfl_xor_sync(0xffffffffu, nz, 2);  // its 64-K group has one
    uint32_t smax = max(se, __shfl_xor_sync(0xffffffffu, se, 2));
    if constexpr (F128) {                                     // and over the K block
        any |= __shfl_xor_sync(0xffffffffu, any, 4);
        smax = max(smax, __shfl_xor_sync(0xffffffffu, smax, 4));
    }
    const int d = nz ? (int)(smax - s) : 0;
    if (d > 0) {
        const __half2 m = pow2_neg_h2(d);
        x.x = e4m3x4_scale(x.x, m); x.y = e4m3x4_scale(x.y, m);
        x.z = e4m3x4_scale(x.z, m); x.w = e4m3x4_scale(x.w, m);
    }
    const uint32_t ob = any ? smax : s;
    const uint32_t b1 = __shfl_down_sync(0xffffffffu, ob, 2), b2 = __shfl_down_sync(0xffffffffu, ob, 4),
                   b3 = __shfl_down_sync(0xffffffffu, ob, 6);
    word = ob | (b1 << 8) | (b2 << 16) | (b3 << 24);
    return x;
}
// A whole row (hv 16-byte chunks, hv a multiple of 8) and its scale words, folded, by one warp:
// eight chunks per lane in flight. LDCG: read through L2 only (a peer's buffer, EP); F128:
// folded per 128-K group (fold_x_chunk). Beside each
// K block's scale word, its two 64-K groups' scales as FP32 (Params::l1_pool_fsx: fsx_dst is the
// row's K block 0 group 0 entry, group 1 is fsx_half further, K blocks fsx_stride apart).
template <bool LDCG, bool F128, int kWarps = 1>
__device__ __forceinline__ void pull_row_fold(const uint4* src, uint4* dst, const uint32_t* sf_src, uint32_t* sf_dst,
                                              int64_t sf_stride, float* fsx_dst, int64_t fsx_stride, int fsx_half,
                                              int hv, int lane, int wib = 0) {
    for (int v0 = 32 * wib; v0 < hv; v0 += 32 * kWarps * 8) {
        uint4 buf[8];
        uint32_t sfw[8];
        #pragma unroll
        for (int u = 0; u < 8; ++u) {
            const int v = v0 + u * 32 * kWarps + lane;
            buf[u] = make_uint4(0u, 0u, 0u, 0u);
            sfw[u] = 0u;
            if (v < hv) {
                buf[u] = LDCG ? __ldcg(src + v) : __ldg(src + v);
                sfw[u] = LDCG ? __ldcg(sf_src + v / 8) : __ldg(sf_src + v / 8);
            }
        }
        #pragma unroll
        for (int u = 0; u < 8; ++u) {
            const int v = v0 + u * 32 * kWarps + lane;
            if (v0 + u * 32 * kWarps >= hv) break;  // warp-uniform
            uint32_t word;
            const uint4 f = fold_x_chunk<F128>(buf[u], sfw[u], lane, word);
            if (v < hv) {
                dst[v] = f;
                if ((lane & 7) == 0) {
                    sf_dst[(size_t)(v / 8) * sf_stride] = word;
                    float* f = fsx_dst + (size_t)(v / 8) * fsx_stride;
                    f[0] = ue8m0_to_float(word & 0xFFu);
                    f[fsx_half] = ue8m0_to_float((word >> 16) & 0xFFu);
                }
            }
        }
    }
}

// ------------------------------------------------------------------ dispatch (128 threads)
// An even split of n things over the grid: this CTA's [n c / C, n (c + 1) / C).
__device__ __forceinline__ int2 cta_range(int64_t n) {
    return make_int2((int)(n * blockIdx.x / gridDim.x), (int)(n * (blockIdx.x + 1) / gridDim.x));
}

// Step 1 of every dispatch (EP1 here, EP in kernel_sm90.cu): hist[e] = this CTA's items of
// expert e in [i0, i1), item_pos[i] = the item's rank among them in item order; a bad
// expert id raises kErrBadExpert and the item is skipped. All 128 dispatch threads call it.
__device__ __forceinline__ void count_items(const Params& p, int* hist, int i0, int i1) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int K = (int)p.topk, E = (int)p.num_experts;
    for (int e = tid; e < E; e += kSharedDispatchThreads) hist[e] = 0;
    named_bar_sync(kSharedBarDispatch, kSharedDispatchThreads);
    if (warp == 0) {
        for (int base = i0; base < i1; base += 32) {
            const int i = base + lane;
            int e = -1;
            if (i < i1) {
                e = p.topk_idx[i];
                if (e < -1 || e >= E) { raise_error(p, kErrBadExpert, kRoleDispatch, e, i / K, i % K, -1, 0); e = -1; }
            }
            const uint32_t peers = __match_any_sync(0xffffffffu, e);
            const int rank = __popc(peers & ((1u << lane) - 1u));
            const int leader = __ffs(peers) - 1;
            int b = 0;
            if (e >= 0) b = hist[e];
            __syncwarp();
            if (e >= 0 && lane == leader) hist[e] = b + __popc(peers);
            __syncwarp();
            if (e >= 0) p.item_pos[i] = b + rank;
        }
    }
    named_bar_sync(kSharedBarDispatch, kSharedDispatchThreads);
}

// Exclusive scan over the experts by the 128 dispatch threads (each thread its own run of
// experts, then the warps, then the four warp sums in scan[4]): emit(e, v(0) + .. + v(e - 1))
// for every expert; *total (if given) = the sum over all experts, to every thread; returns the
// thread's running sum past its last expert (the total for the last thread). One barrier inside;
// scan[] holds the warp sums until the caller's next one.
template <class V, class Emit>
__device__ __forceinline__ int scan_experts(int E, int* scan, V v, Emit emit, int* total) {
    constexpr int kThreads = kSharedDispatchThreads;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int per = (E + kThreads - 1) / kThreads;
    const int e0 = tid * per, e1 = min(E, e0 + per);
    int local = 0;
    for (int e = e0; e < e1; ++e) local += v(e);
    int incl = local;
    #pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int x = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += x;
    }
    if (lane == 31) scan[warp] = incl;
    named_bar_sync(kSharedBarDispatch, kThreads);
    int run = incl - local;
    for (int w = 0; w < warp; ++w) run += scan[w];
    if (total) *total = scan[0] + scan[1] + scan[2] + scan[3];
    for (int e = e0; e < e1; ++e) { emit(e, run); run += v(e); }
    return run;
}

// The pull of a CTA's only item by all four dispatch warps, each a quarter of the row (kernel
// v8.6; block_m 16 only, the sizes where a CTA can have one item: up to ~22 tokens at top-k 6 on
// 132 CTAs). One warp folding a 4 KB row chunk after chunk took ~3 us at one token on the H200,
// most of the pull (benchmarks/NOTES_kernel.md, session 28). Warp 0's lane 0 stores the row's
// metadata and releases the arrival count once every warp's stores are fenced (the dispatch
// barrier orders them before the release).
// (LOCAL: the item and its expert from shared memory, item_expert[0..1], written by the count:
// two dependent global loads fewer before the row's.)
template <int BM, bool LOCAL, class SfRow>
__device__ __forceinline__ void whole_cta_pull(const Params& p, const int* off_blk, const int* cta_base, SfRow sf_row,
                                               int i0, const int* item_expert, int hv, int warp, int lane) {
    constexpr int kWarps = kSharedDispatchThreads / 32;
    const int K = (int)p.topk, H = (int)p.hidden;
    const int i = LOCAL ? item_expert[0] : p.item_order[i0];
    const int e = LOCAL ? item_expert[1] : p.topk_idx[i];
    const int row = off_blk[e] * BM + cta_base[e];
    if (row >= p.pool_rows) return;  // overflow already raised (every warp returns)
    const int t = i / K;
    const int64_t srow = sf_row((int64_t)row, BM);
    // The item's top-k weight, loaded in flight with the row (kernel v9.10; until v9.9 it was
    // loaded after the row's stores, one more round trip before the release: 0.984-0.986 /
    // 0.987-0.990x v9.9's kernel time at 1 / 2 tokens in two A/Bs on the H200, no change beyond
    // their spread at 3-8 tokens; benchmarks/NOTES_kernel.md, session 44).
    const float wt = warp == 0 && lane == 0 ? __ldg(p.topk_w + i) : 0.0f;
    pull_row_fold<false, (BM >= kL1Fold128BlockM), kWarps>(
        reinterpret_cast<const uint4*>(p.x + (size_t)t * H), reinterpret_cast<uint4*>(p.l1_pool + (size_t)row * H),
        reinterpret_cast<const uint32_t*>(p.x_sf + (size_t)t * (H / 32)), reinterpret_cast<uint32_t*>(p.l1_pool_sf) + srow,
        sf_row.stride(), l1_pool_fsx_row(p, row, BM), 2 * p.pool_rows, BM, hv, lane, warp);
    if (warp == 0 && lane == 0) {
        p.pool_token[row] = t;
        p.pool_slot[row] = i % K;
        p.pool_weight[row] = wt;
    }
    fence_proxy_async_global();  // the row is read by TMA (the async proxy)
    named_bar_sync(kSharedBarDispatch, kSharedDispatchThreads);
    if (warp == 0 && lane == 0 && p.fault_inject != 1) red_release_add_u32(p.arrival + row / BM, 1u);
}

// Scratch in shared memory: hist[E], cta_base[E], off_blk[E], scan[16] (scan[0..3] the scans'
// warp sums, scan[4..5] (LOCAL) the CTA's item and its expert when it has one item).
// FOLD_X: SM90 (Numerics.sm90_kernel()): each row is folded per 64-K group as it is copied
// (pull_row_fold, per 128 at block_m >= kL1Fold128BlockM; whole rows, SfRow the identity).
// The CTA pulls its items sorted by expert (stably, so every item keeps its pool row): the pool
// blocks then fill in expert order, i.e. in wave order, and the first waves' L1 blocks start
// while later rows are still being pulled. (Until kernel v7.9 it pulled them in token order:
// every pool block took rows from almost every CTA and was complete only at the end of the
// pull; every CTA's first L1 block waited for the whole pull, 230 / 444 us at 4096 / 8192
// tokens on the H200: benchmarks/NOTES_kernel.md.)
// LOCAL (the SM90 kernel's wide instances, kernel v8.9 at one CTA per SM, v9.7 at two): no count barrier. Every CTA counts all T K
// items itself (6-180 at the 1-30 tokens of those instances on V4-Flash) and CTA 0 hands the totals to
// the schedulers; an item's pool row is its rank among its expert's items in item order. At one
// token on the H200 the count and its barrier took ~5 us before the first pull in kernel v8.8's
// trace; this path measured 0.977 / 0.985 / 0.995x v8.8's kernel time at 1 / 4 / 12 tokens
// (benchmarks/NOTES_kernel.md, session 34).
template <int BM, class SfRow, bool FOLD_X = false, bool LOCAL = false, int COUNTS_BAR = 0, bool TR = true>
__device__ void dispatch_pull(const Params& p, int* hist, int* cta_base, int* off_blk, int* scan, SfRow sf_row,
                              int pull_bytes) {
    constexpr int kThreads = kSharedDispatchThreads;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int T = (int)p.num_tokens, K = (int)p.topk, E = (int)p.num_experts, H = (int)p.hidden;
    // This CTA's items (token, slot), an even split of the T K items in item order. (Until kernel
    // v8.5 a CTA took the items of its tokens [T c / C, T (c + 1) / C): at one token one CTA
    // pulled all top-k items with its four warps in two rounds, ~5 us each on the H200.)
    const int2 ir = cta_range((int64_t)T * K);
    const int i0 = ir.x, i1 = ir.y;
    const bool trace = trace_on<TR>(p) && tid == 0;

    // 1. count: in-order rank of each item among this CTA's items of the same expert.
    uint64_t ts = trace_clock<TR>();
    // (LOCAL: an error raised before the pull is read here, in flight with the count, instead of
    // one more round trip before the pull; a pull after an error stays inside the pool)
    const bool aborted_early = LOCAL && aborted(p);
    const int e_first = LOCAL && tid < T * K ? p.topk_idx[tid] : -1;  // (LOCAL) item tid's expert, in flight with the count's
    count_items(p, hist, i0, i1);
    // 2. publish: one add per expert this CTA has items of, into the sums (expert_count[E ..
    //    2E)); the sum before ours is our base. Then, after the scan's barrier below, one
    //    release add to the count barrier (expert_count[2E]). Kernel v8.5: until v8.4 every
    //    CTA added (1 << 32) | items to each of the E counters the schedulers poll, and the
    //    barrier was their high halves; at one token the count and its barrier took ~6 us
    //    on the H200 (benchmarks/NOTES_kernel.md, session 27).
    unsigned long long* sums = p.expert_count + E;
    for (int e = tid; e < E; e += kThreads) {
        if constexpr (LOCAL) cta_base[e] = 0;  // the items before i0 are added in step 3
        else cta_base[e] = hist[e] > 0 ? (int)atomicAdd(sums + e, (unsigned long long)(uint32_t)hist[e]) : 0;
    }
    if (tid == 0) progress(p, 0, 2);
    // 2b. sort (while the other CTAs publish): item_order[i0 + s] = the item at position s of
    //     this CTA's items sorted by expert, s = (its items of lower experts) + item_pos; off_blk
    //     holds the first term until step 3. cta_base[e] -= that term, so that the pool row of
    //     position s is off_blk[e] * BM + cta_base[e] + s.
    int n_items;
    scan_experts(E, scan, [&](int e) { return hist[e]; }, [&](int e, int run) { off_blk[e] = run; cta_base[e] -= run; },
                 &n_items);
    if (!LOCAL && tid == 0) red_release_add_u64(sums + E, 1ull);  // every thread's adds returned before the scan's barrier
    named_bar_sync(kSharedBarDispatch, kThreads);
    if (!LOCAL || n_items > 1)  // (LOCAL with one item: the count below keeps it in scan[4..5])
        for (int i = i0 + tid; i < i1; i += kThreads) {
            const int e = p.topk_idx[i];
            if (e >= 0 && e < E) p.item_order[i0 + off_blk[e] + p.item_pos[i]] = i;
        }
    named_bar_sync(kSharedBarDispatch, kThreads);

    // 3. the counts: after the count barrier (thread 0 polls), or (LOCAL) every item counted
    //    here (bad expert ids were raised by the CTA that owns the item). CTA 0 hands them to
    //    every CTA's schedulers: (grid size << 32) | count, what Scheduler::fetch_counts waits
    //    for. Then the pool-block offsets (exclusive scan).
    if constexpr (LOCAL) {
        for (int e = tid; e < E; e += kThreads) hist[e] = 0;
        named_bar_sync(kSharedBarDispatch, kThreads);
        for (int i = tid; i < T * K; i += kThreads) {
            const int e = i == tid ? e_first : p.topk_idx[i];
            if (e >= 0 && e < E) {
                atomicAdd(hist + e, 1);
                if (i < i0) atomicAdd(cta_base + e, 1);
                if (n_items == 1 && i >= i0 && i < i1) { scan[4] = i; scan[5] = e; }
            }
        }
        named_bar_sync(kSharedBarDispatch, kThreads);
        if constexpr (COUNTS_BAR > 0) named_bar_arrive(kSharedBarCounts, COUNTS_BAR);  // hist[] holds every count
        if (blockIdx.x == 0)
            for (int e = tid; e < E; e += kThreads)
                st_relaxed_u64(p.expert_count + e, ((unsigned long long)gridDim.x << 32) | (uint32_t)hist[e]);
        if (trace) trace_record(p, kRoleDispatch, kKindCount, -1, -1, -1, -1, i1 - i0, ts, globaltimer());
    } else {
        if (trace) trace_record(p, kRoleDispatch, kKindCount, -1, -1, -1, -1, i1 - i0, ts, globaltimer());
        ts = trace_clock<TR>();
        if (tid == 0) wait_counts_ready(p, sums + E, kRoleDispatch, p.timeout_ns);
        named_bar_sync(kSharedBarDispatch, kThreads);
        for (int e = tid; e < E; e += kThreads) {
            const unsigned long long n = ld_acquire_u64(sums + e);
            hist[e] = (int)(uint32_t)n;
            if (blockIdx.x == 0) st_relaxed_u64(p.expert_count + e, ((unsigned long long)gridDim.x << 32) | n);
        }
        named_bar_sync(kSharedBarDispatch, kThreads);
    }
    {
        const int run = scan_experts(E, scan, [&](int e) { return (hist[e] + BM - 1) / BM; },
                                     [&](int e, int r) { off_blk[e] = r; }, static_cast<int*>(nullptr));
        if (tid == kThreads - 1 && (int64_t)run * BM > p.pool_rows)
            raise_error(p, kErrPoolOverflow, kRoleDispatch, -1, run, -1, -1, (uint32_t)p.pool_rows);
    }
    named_bar_sync(kSharedBarDispatch, kThreads);
    if (tid == 0) progress(p, 0, 4);
    if (!LOCAL && trace) trace_record(p, kRoleDispatch, kKindGridSync, -1, -1, -1, -1, 0, ts, globaltimer());
    if (LOCAL ? aborted_early : aborted(p)) return;

    // 4. pull: one warp per item, in sorted order, the row in pull_bytes chunks, its scales,
    //    metadata, then the pool block's arrival count (release).
    ts = trace_clock<TR>();
    const int chunk_vec = max(16, pull_bytes) / 16;  // uint4 per chunk
    const int hv = H / 16, hk = H / 128;
    if constexpr (FOLD_X && BM == 16) {
        if (n_items == 1) {
            whole_cta_pull<BM, LOCAL>(p, off_blk, cta_base, sf_row, i0, scan + 4, hv, warp, lane);
            if (tid == 0) progress(p, 0, 5);
            if (trace) trace_record(p, kRoleDispatch, kKindPull, -1, -1, -1, -1, 0, ts, globaltimer());
            return;
        }
    }
    for (int j = warp; j < n_items; j += kThreads / 32) {  // position j of the sorted items
        const int i = p.item_order[i0 + j];
        const int e = p.topk_idx[i];
        const int row = off_blk[e] * BM + cta_base[e] + j;
        if (row >= p.pool_rows) continue;  // overflow already raised
        const int t = i / K, k = i % K;
        const float wt = __ldg(p.topk_w + i);  // in flight with the row (was loaded after its stores)
        const uint4* src = reinterpret_cast<const uint4*>(p.x + (size_t)t * H);
        uint4* dst = reinterpret_cast<uint4*>(p.l1_pool + (size_t)row * H);
        const uint32_t* sf_src = reinterpret_cast<const uint32_t*>(p.x_sf + (size_t)t * (H / 32));
        uint32_t* sf_dst = reinterpret_cast<uint32_t*>(p.l1_pool_sf);
        const int64_t srow = sf_row((int64_t)row, BM);
        if constexpr (FOLD_X) {
            pull_row_fold<false, (BM >= kL1Fold128BlockM)>(src, dst, sf_src, sf_dst + srow, sf_row.stride(),
                                                           l1_pool_fsx_row(p, row, BM),
                                                           2 * p.pool_rows, BM, hv, lane);
        } else {
            for (int c0 = 0; c0 < hv; c0 += chunk_vec) {
                const int c1 = min(hv, c0 + chunk_vec);
                for (int v0 = c0; v0 < c1; v0 += 32 * 8) {
                    uint4 buf[8];
                    #pragma unroll
                    for (int u = 0; u < 8; ++u) {
                        const int v = v0 + u * 32 + lane;
                        if (v < c1) buf[u] = __ldg(src + v);
                    }
                    #pragma unroll
                    for (int u = 0; u < 8; ++u) {
                        const int v = v0 + u * 32 + lane;
                        if (v < c1) dst[v] = buf[u];
                    }
                }
            }
            for (int kb = lane; kb < hk; kb += 32) sf_dst[(size_t)kb * sf_row.stride() + srow] = __ldg(sf_src + kb);
        }
        if (lane == 0) {
            p.pool_token[row] = t;
            p.pool_slot[row] = k;
            p.pool_weight[row] = wt;
        }
        fence_proxy_async_global();  // the row is read by TMA (the async proxy)
        __syncwarp();  // every lane's stores before lane 0's gpu-scope release
        if (lane == 0 && p.fault_inject != 1) red_release_add_u32(p.arrival + row / BM, 1u);
    }
    if (tid == 0) progress(p, 0, 5);
    if (trace) trace_record(p, kRoleDispatch, kKindPull, -1, -1, -1, -1, 0, ts, globaltimer());
}

// ------------------------------------------------------------------ combine (+ clean-up)
// The combine's slot loads in flight per thread (mirrored by megamoe.design_sm90.COMBINE_SLOTS;
// kernel v8.0). From block_m kCombineBatchBlockM on, a token's slots are loaded four at a time
// (predicated, in flight together, added after): with one load in flight per thread the
// combine read ~2.1 TB/s at 8192 tokens on the H200 (28 / 225 us at 1024 / 8192 tokens in
// kernel v7.9's traces; v8.0: 19 / 147 us). Below it (block_m 16: up to 512 tokens, the
// combine under 1% of the time) each slot's load still waits behind the branch on its index:
// the batched loop, in this function, makes ptxas lay out the block_m 16 K loop in 178 instead
// of 159 instructions, measured +4..+7% at 64 / 256 tokens (benchmarks/NOTES_kernel.md,
// sessions 19-20).
constexpr int kCombineBatchBlockM = 32;
template <int BM>
__host__ __device__ constexpr int combine_slots() { return BM >= kCombineBatchBlockM ? 4 : 1; }

// Vector hv (8 BF16 channels, 16 bytes) of token t's slot-k row in the combine buffer [topk,
// combine_rows, H] (L2 only: each vector is read once).
__device__ __forceinline__ uint4 combine_vec(const Params& p, int k, int t, int H, int hv) {
    return __ldcg(reinterpret_cast<const uint4*>(p.combine_buf + ((size_t)k * p.combine_rows + t) * H) + hv);
}
// acc[0..7] += the 8 BF16 channels of raw, in FP32.
__device__ __forceinline__ void add_bf16x8(float* acc, const uint4& raw) {
    const __nv_bfloat162* b2 = reinterpret_cast<const __nv_bfloat162*>(&raw);
    #pragma unroll
    for (int u = 0; u < 4; ++u) {
        const float2 f = __bfloat1622float2(b2[u]);
        acc[2 * u] += f.x;
        acc[2 * u + 1] += f.y;
    }
}

// Called by every thread of every CTA after all roles finished: grid sync (EP: NVLink
// barrier 2, every rank's L2 rows are in their source ranks' combine buffers), then sum the
// valid slots of each token in FP32 (slot order), BF16 out; then zero the counters so the
// next call starts clean (every reader finished before the barrier).
// The SM90 kernel's wide instance (1-12 tokens on V4-Flash, kernel v8.8): a token's slots, up to
// this many, loaded at once with their top-k indices, the rows of masked slots included (they lie
// inside the combine buffer; read, not added): one round trip per token instead of an index and
// then a row per slot. In that instance of its own the loop leaves the other instances' K loops
// as they were (the shared block_m 16 one is why combine_slots<16>() is 1). Measured on the H200:
// 0.982 / 0.987 / 0.987x v8.7's kernel time at 1 / 4 / 12 tokens (benchmarks/NOTES_kernel.md).
constexpr int kCombineSlotsWide = 8;
template <int BM, int SLOTS = combine_slots<BM>(), bool TR = true>
__device__ void combine_and_clean(const Params& p, int threads) {
    const bool trace = trace_on<TR>(p) && threadIdx.x == 0;
    const bool ep = p.num_ranks > 1;
    if (threadIdx.x == 0) progress(p, 7, 1);
    uint64_t ts = trace_clock<TR>();
    if (ep) {
        __threadfence_system();
        __syncthreads();
        if (threadIdx.x == 0 && nvl_barrier(p, 2, kRoleDispatch) && blockIdx.x == 0)
            atomicAdd(reinterpret_cast<unsigned long long*>(p.epoch_counter), 1ull);  // this call is done
    } else {
        grid_sync(p, kRoleDispatch);
    }
    __syncthreads();
    if (threadIdx.x == 0) progress(p, 7, 2);
    if (trace) trace_record(p, kRoleDispatch, ep ? kKindNvlBarrier : kKindGridSync, -1, -1, -1, -1, ep ? 2 : 1, ts, globaltimer());
    if (aborted(p)) return;
    ts = trace_clock<TR>();
    const int T = (int)p.num_tokens, H = (int)p.hidden, K = (int)p.topk, E = (int)p.num_experts;
    const size_t nvec = (size_t)T * (H / 8);
    // Each thread sums 8 channels (one 16-byte vector) of a token per step, grid-stride, over
    // its valid slots in slot order; SLOTS of them are loaded at a time (combine_slots<BM>(), or
    // kCombineSlotsWide in the SM90 wide instance).
    constexpr int kSlots = SLOTS;
    for (size_t v = (size_t)blockIdx.x * threads + threadIdx.x; v < nvec; v += (size_t)gridDim.x * threads) {
        const int t = (int)(v / (H / 8));
        const int hv = (int)(v % (H / 8));
        float acc[8];
        #pragma unroll
        for (int u = 0; u < 8; ++u) acc[u] = 0.0f;
        if constexpr (kSlots == 1) {
            for (int k = 0; k < K; ++k) {
                if (__ldg(p.topk_idx + (size_t)t * K + k) < 0) continue;
                add_bf16x8(acc, combine_vec(p, k, t, H, hv));
            }
        } else if constexpr (kSlots == kCombineSlotsWide) {
            for (int k0 = 0; k0 < K; k0 += kSlots) {
                uint4 raw[kSlots];
                int idx[kSlots];
                #pragma unroll
                for (int u = 0; u < kSlots; ++u) {
                    const int k = k0 + u;
                    idx[u] = -1;
                    if (k < K) {
                        idx[u] = __ldg(p.topk_idx + (size_t)t * K + k);
                        raw[u] = combine_vec(p, k, t, H, hv);
                    }
                }
                #pragma unroll
                for (int u = 0; u < kSlots; ++u)
                    if (idx[u] >= 0) add_bf16x8(acc, raw[u]);
            }
        } else {
            for (int k0 = 0; k0 < K; k0 += kSlots) {
                uint4 raw[kSlots];
                bool ok[kSlots];
                #pragma unroll
                for (int u = 0; u < kSlots; ++u) {
                    const int k = k0 + u;
                    ok[u] = k < K && __ldg(p.topk_idx + (size_t)t * K + k) >= 0;
                    if (ok[u]) raw[u] = combine_vec(p, k, t, H, hv);
                }
                #pragma unroll
                for (int u = 0; u < kSlots; ++u)
                    if (ok[u]) add_bf16x8(acc, raw[u]);
            }
        }
        uint4 out;
        __nv_bfloat162* o2 = reinterpret_cast<__nv_bfloat162*>(&out);
        #pragma unroll
        for (int u = 0; u < 4; ++u) o2[u] = __floats2bfloat162_rn(acc[2 * u], acc[2 * u + 1]);
        reinterpret_cast<uint4*>(p.y + (size_t)t * H)[hv] = out;
    }
    const size_t nblk = (size_t)p.pool_rows / BM;
    for (size_t i = (size_t)blockIdx.x * threads + threadIdx.x; i < nblk; i += (size_t)gridDim.x * threads) {
        p.arrival[i] = 0;
        p.mask[i] = 0;
    }
    const size_t n_local = (size_t)(ep ? E / p.num_ranks : E);  // experts this rank owns
    const size_t n_count = ep ? n_local : 2 * n_local + 2;  // EP1: + the sums, the count barrier, the ticket
    for (size_t i = (size_t)blockIdx.x * threads + threadIdx.x; i < n_count; i += (size_t)gridDim.x * threads)
        p.expert_count[i] = 0;
    if (ep)
        for (size_t i = (size_t)blockIdx.x * threads + threadIdx.x; i < (size_t)E; i += (size_t)gridDim.x * threads)
            p.send_count[i] = 0;
    if (threadIdx.x == 0) progress(p, 7, 3);
    if (trace_on<TR>(p)) {
        __syncthreads();
        if (trace) trace_record(p, kRoleDispatch, kKindCombine, -1, -1, -1, -1, 0, ts, globaltimer());
    }
}

}  // namespace megamoe
