// megamoe: the architecture-specific matrix path for SM90 (Hopper): WGMMA with the weights
// decoded straight into registers.
//
// Two consumer warpgroups per CTA; the CTA tile is 128 weight rows (one N block) x BLOCK_M
// tokens x 128 K per stage. The GEMM runs "swap AB" (as DeepGEMM's SM90 kernels do for small
// M): the weights are WGMMA's A operand (M = 64 rows per warpgroup, warpgroup g owns rows
// [64 g, 64 g + 64) of the N block) and the tokens its B operand (N = BLOCK_M, 16..128), so
// every block_m the plan picks is one `wgmma.m64nBMk32` per K group without padding rows.
//
// A comes from registers (the "RS" form): Hopper has no FP4 MMA, so each thread decodes the
// E2M1 values of exactly its fragment into E4M3 registers (fp4.cuh) -- no decoded copy in
// shared memory, no proxy fence or warpgroup barrier for it. Fragment of one k32 step
// (CuTe's ALayout_64x32): lane l of warp w holds rows 16 w + l/4 (registers a0, a2) and
// +8 (a1, a3), K elements [4 t, 4 t + 4) (a0, a1) and [16 + 4 t, 16 + 4 t + 4) (a2, a3) with
// t = l % 4. The weights are stored so that those elements of all four k32 steps of a
// 128-K block are one 16-byte chunk per row and thread (megamoe.layouts.
// permute_e2m1_for_sm90_rs): chunk t of a row's 64-byte K block; its word q (bits
// reordered, fp4.cuh) decodes to (a0 or a1, a2 or a3) of step q through the fold table row
// of that row's K group q.
//
// B (tokens) sits in shared memory K-major as 128-byte rows (one K block of FP8) with the
// 16-byte chunk index XOR-swizzled by (row % 8) inside 1024-byte atoms: the 128-byte swizzle
// of a WGMMA shared-memory descriptor (stride between 8-row atoms 1024 B; the K step of 32
// FP8 = 32 B advances the start address, DeepGEMM's idiom). Atoms must be 1024-B aligned.
//
// Numerics (`megamoe.reference.Numerics.sm90_kernel()`): each 64-wide K group is two chained
// WGMMAs (the first with a zeroed accumulator, scale-d = 0), and their FP32 partial sum d is
// promoted into the FP32 accumulator as acc = fma(d, 2^sx, acc) with the token's scale for that
// group. Both operands' per-32 scales are folded into their E4M3 values: the weights' per row
// (fp4.cuh: E2M1 x 2^(6 - d) for a group 2^d below its row's largest; the epilogue multiplies
// by the row scale 2^(s_max - 133) once), the tokens' per 64-K group (the pools hold them
// folded: megamoe.layouts.fold_e4m3_scales_for_sm90, written by the pull and the L1 epilogue;
// both scale bytes of a group are its s_max). The H200's FP8 WGMMA does not sum exactly (a few
// accumulator bits fewer than FP32, benchmarks/NOTES_kernel.md), so the tensor core's partial
// differs from the reference's exact one in the last bits.
// The weights' table offsets are read as bytes (4 per row and K block), the token scales as
// FP32 [2][BLOCK_M] (one per 64-K group), written beside the pools' scale bytes and copied
// into the stage by the producer: no byte extraction, no per-stage table or warpgroup barrier.
//
// The MMA atoms, the descriptor and the wgmma fences come from CUTLASS/CuTe
// (cute/arch/mma_sm90_gmma.hpp, cute/arch/mma_sm90_desc.hpp).
#pragma once
#include <stdint.h>
#include <utility>
#include <cute/arch/mma_sm90_desc.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>
#include "fp4.cuh"

namespace megamoe {

// Shared-memory descriptor of a K-major operand with the 128-byte swizzle (rows of 128 B).
__device__ __forceinline__ uint64_t sw128_kmajor_desc(const void* smem_ptr) {
    cute::GmmaDescriptor d;
    d.bitfield.start_address_ = (uint16_t)(static_cast<uint32_t>(__cvta_generic_to_shared(smem_ptr)) >> 4);
    d.bitfield.leading_byte_offset_ = 1;      // unused by swizzled K-major layouts
    d.bitfield.stride_byte_offset_ = 1024 >> 4;  // 8 rows x 128 B
    d.bitfield.base_offset_ = 0;              // atoms are 1024-B aligned
    d.bitfield.layout_type_ = (uint8_t)cute::SM90::GMMA::LayoutType::B128;
    return d.desc_;
}

template <int N> struct GmmaE4M3;
template <> struct GmmaE4M3<16> { using Op = cute::SM90::GMMA::MMA_64x16x32_F32E4M3E4M3_RS_TN<>; };
template <> struct GmmaE4M3<32> { using Op = cute::SM90::GMMA::MMA_64x32x32_F32E4M3E4M3_RS_TN<>; };
template <> struct GmmaE4M3<64> { using Op = cute::SM90::GMMA::MMA_64x64x32_F32E4M3E4M3_RS_TN<>; };
template <> struct GmmaE4M3<96> { using Op = cute::SM90::GMMA::MMA_64x96x32_F32E4M3E4M3_RS_TN<>; };
template <> struct GmmaE4M3<128> { using Op = cute::SM90::GMMA::MMA_64x128x32_F32E4M3E4M3_RS_TN<>; };

template <class Op, int... I>
__device__ __forceinline__ void gmma_rs(const uint2& r0, const uint2& r8, uint64_t db, float* d,
                                        cute::SM90::GMMA::ScaleOut acc, std::integer_sequence<int, I...>) {
    Op::fma(r0.x, r8.x, r0.y, r8.y, db, d[I]..., acc);
}

// One consumer warpgroup's share of a block: 64 weight rows x BLOCK_M tokens. A K block is two
// 64-K groups (h = 0, 1), each two chained k32 WGMMAs into a partial accumulator, promoted once.
// How many groups are in flight is set by the registers their partials take (NP partials of
// BLOCK_M / 2 floats each, beside the accumulator):
//   block_m 16..64: both groups issued at once (two commit groups, four WGMMAs), each promoted
//     as it completes.
//   block_m 128: the accumulator and one partial take 128 registers, a second would spill:
//     one group in flight (all four k32 steps decoded up front); the two warpgroups
//     overlap each other (one promotes while the other's WGMMAs run). In the L1 GEMM, whose
//     tokens are folded per 128-K group at this block_m, group 1 chains onto group 0's partial
//     and the K block is promoted once.
template <int BLOCK_M>
struct Sm90Tile {
    static constexpr int NJ = BLOCK_M / 8;  // n8 column tiles (tokens)
    static_assert(BLOCK_M == 16 || BLOCK_M == 32 || BLOCK_M == 64 || BLOCK_M == 128, "bad block_m");
    using Op = typename GmmaE4M3<BLOCK_M>::Op;
    static constexpr int NP = BLOCK_M <= 64 ? 2 : 1;  // partial accumulators (64-K groups in flight)
    static constexpr int WGMMAS_IN_FLIGHT = 2 * NP;  // k32 WGMMAs in flight (design_sm90.WGMMAS_IN_FLIGHT)
    // Tokens per step of the WGMMA N a block runs at: its valid rows rounded up to this (block_m
    // 128: N = 32 / 64 / 96 / 128, mma_k_block<NA>), else the whole block_m (design_sm90.WGMMA_N_STEP)
    static constexpr int WGMMA_N_STEP = BLOCK_M == 128 ? 32 : BLOCK_M;
    // No shared-memory load of a token scale sits between a WGMMA wait and its promotion: at
    // block_m <= 64 each thread loads its tokens' scales of both groups into registers before it
    // decodes (4 NJ registers); at block_m 128 (too few registers for that) a group's scales are
    // loaded while its WGMMAs run, as many as fit (group 1: half, group 0 of the L2 GEMM: a
    // quarter), the rest after the wait. (Read at the promotion, the loads cost block_m 16 / 32
    // 2% / 5% in kernel v7.5, block_m 64 7% and block_m 128 8-10% until v8.4:
    // benchmarks/NOTES_kernel.md.)

    float acc[NJ][4];
    float part[NP][NJ][4];
    uint2 ra0[4], ra8[4];  // decoded E4M3 A fragments of the four k32 steps: rows row_of(0) and row_of(2)
    int wg, wi, lane;

    __device__ __forceinline__ void init(int consumer_thread) {
        wg = consumer_thread >> 7;
        wi = (consumer_thread >> 5) & 3;
        lane = consumer_thread & 31;
    }
    __device__ __forceinline__ void zero() {
        #pragma unroll
        for (int j = 0; j < NJ; ++j)
            #pragma unroll
            for (int r = 0; r < 4; ++r) acc[j][r] = 0.0f;
    }
    // Fragment element (j, r) -> weight row inside the 128-row N block / token inside the block.
    __device__ __forceinline__ int row_of(int r) const { return wg * 64 + wi * 16 + lane / 4 + (r >= 2 ? 8 : 0); }
    __device__ __forceinline__ int tok_of(int j, int r) const { return j * 8 + (lane & 3) * 2 + (r & 1); }

    // 64-K group h (k32 steps 2h, 2h + 1) into partial pb, as one commit group.
    __device__ __forceinline__ void group(int h, uint64_t db, int pb) {
        constexpr auto seq = std::make_integer_sequence<int, NJ * 4>{};
        gmma_rs<Op>(ra0[2 * h], ra8[2 * h], db + 4 * h, &part[pb][0][0], cute::SM90::GMMA::ScaleOut::Zero, seq);
        gmma_rs<Op>(ra0[2 * h + 1], ra8[2 * h + 1], db + 4 * h + 2, &part[pb][0][0], cute::SM90::GMMA::ScaleOut::One, seq);
        cute::warpgroup_commit_batch();
    }
    // After the wait for group h's WGMMAs (partial pb): keep the compiler from reusing those
    // registers earlier (the WGMMAs read and write them asynchronously).
    template <int NA = NJ>
    __device__ __forceinline__ void fence_group(int h, int pb) {
        #pragma unroll
        for (int q = 2 * h; q < 2 * h + 2; ++q) {
            cute::warpgroup_fence_operand(ra0[q].x); cute::warpgroup_fence_operand(ra0[q].y);
            cute::warpgroup_fence_operand(ra8[q].x); cute::warpgroup_fence_operand(ra8[q].y);
        }
        #pragma unroll
        for (int j = 0; j < NA; ++j)
            #pragma unroll
            for (int r = 0; r < 4; ++r) cute::warpgroup_fence_operand(part[pb][j][r]);
    }
    // 64-K group h's token scales of n8 tiles [J0, J1) into sx: fsx, the stage's FP32 token
    // scales [2][BLOCK_M]; one float2 per n8 tile (tokens tok_of(j, 0) and tok_of(j, 1))
    template <int J0, int J1>
    __device__ __forceinline__ void load_scales(const float* fsx, int h, float2 (&sx)[NJ]) const {
        #pragma unroll
        for (int j = J0; j < J1; ++j) sx[j] = *reinterpret_cast<const float2*>(fsx + h * BLOCK_M + tok_of(j, 0));
    }
    // acc += part * 2^sx(token) for one 64-K group (the weight scale is in the decoded values and
    // the epilogue's row scale); sx: that group's scales (load_scales)
    template <int NA = NJ>
    __device__ __forceinline__ void promote(int pb, const float2 (&sx)[NJ]) {
        #pragma unroll
        for (int j = 0; j < NA; ++j) {
            acc[j][0] = fmaf(part[pb][j][0], sx[j].x, acc[j][0]);
            acc[j][1] = fmaf(part[pb][j][1], sx[j].y, acc[j][1]);
            acc[j][2] = fmaf(part[pb][j][2], sx[j].x, acc[j][2]);
            acc[j][3] = fmaf(part[pb][j][3], sx[j].y, acc[j][3]);
        }
    }
    // Operands of one 128-deep K block. w0 / w8: this thread's 16-byte chunk of packed E2M1
    // (shared memory, read one word per k32 step) for its rows row_of(0) and row_of(2) (see
    // the file comment); o0 / o8: those rows' 4 fold-table offsets (byte q = K group q); tab:
    // the fold table in shared memory (fp4.cuh); a: [BLOCK_M][128] E4M3 tokens, swizzled and
    // 1024-B aligned; fsx: FP32 [2][BLOCK_M] token scales (one per 64-K group).
    __device__ __forceinline__ void decode(const uint32_t* w0, const uint32_t* w8, uint32_t o0, uint32_t o8,
                                           const uint8_t* tab, int q) {
        ra0[q] = decode_e2m1x8(w0[q], *reinterpret_cast<const uint2*>(tab + byte_of(o0, q)));
        ra8[q] = decode_e2m1x8(w8[q], *reinterpret_cast<const uint2*>(tab + byte_of(o8, q)));
    }

    // One K block: decode, issue, wait, promote.
    // one (block_m 128 only: the L1 GEMM, its tokens folded per 128-K group, both of the
    // stage's scales equal): the four k32 steps chained into one partial, promoted once;
    // otherwise two 64-K groups, each promoted (kernel v7.6). A run-time flag in one loop: two
    // copies of the loop left ptxas short of registers, and the wait between the two pairs
    // stays in both forms (skipping it in a branch made ptxas serialize the WGMMAs).
    // NA: the n8 token tiles the WGMMAs cover (block_m 128 only: the block's valid rows rounded up
    // to 32, kernel v9.12; the tiles past them keep the zeros of zero(), their tokens are past
    // valid_m, which both epilogues leave out). Below 128, NA = NJ.
    template <int NA = NJ>
    __device__ __forceinline__ void mma_k_block(const uint32_t* w0, const uint32_t* w8, uint32_t o0, uint32_t o8,
                                                const uint8_t* tab, const uint8_t* a, const float* fsx, bool one) {
        static_assert(NA == NJ || (NP == 1 && NA % 4 == 0 && NA > 0 && NA < NJ), "active tiles: n32 steps at block_m 128");
        const uint64_t db = sw128_kmajor_desc(a);
        if constexpr (NP == 2) {
            float2 sx[2][NJ];
            load_scales<0, NJ>(fsx, 0, sx[0]);
            load_scales<0, NJ>(fsx, 1, sx[1]);
            #pragma unroll
            for (int q = 0; q < 4; ++q) decode(w0, w8, o0, o8, tab, q);
            cute::warpgroup_arrive();
            group(0, db, 0);
            group(1, db, 1);
            cute::warpgroup_wait<1>();
            fence_group(0, 0);
            promote(0, sx[0]);
            cute::warpgroup_wait<0>();
            fence_group(1, 1);
            promote(1, sx[1]);
        } else {
            // All four groups decoded first, and the first pair committed as soon as it is issued
            // (a commit placed after more code became an empty commit group of its own in the
            // SASS, waited for too); ptxas gives pair 2-3's fragments pair 0-1's registers either
            // way, so the decode does not overlap the pair's WGMMAs (kernel v8.4).
            using OpA = typename GmmaE4M3<NA * 8>::Op;
            constexpr auto seq = std::make_integer_sequence<int, NA * 4>{};
            constexpr int NE0 = NA / 4, NE1 = NA / 2;  // scales loaded while the WGMMAs run (more spilled)
            #pragma unroll
            for (int q = 0; q < 4; ++q) decode(w0, w8, o0, o8, tab, q);
            cute::warpgroup_arrive();
            gmma_rs<OpA>(ra0[0], ra8[0], db, &part[0][0][0], cute::SM90::GMMA::ScaleOut::Zero, seq);
            gmma_rs<OpA>(ra0[1], ra8[1], db + 2, &part[0][0][0], cute::SM90::GMMA::ScaleOut::One, seq);
            cute::warpgroup_commit_batch();
            float2 sx[NJ];
            if (!one) load_scales<0, NE0>(fsx, 0, sx);
            cute::warpgroup_wait<0>();
            fence_group<NA>(0, 0);
            if (!one) {  // group 0 promoted before group 1 reuses the partial
                load_scales<NE0, NA>(fsx, 0, sx);
                promote<NA>(0, sx);
            }
            cute::warpgroup_arrive();
            gmma_rs<OpA>(ra0[2], ra8[2], db + 4, &part[0][0][0],
                        one ? cute::SM90::GMMA::ScaleOut::One : cute::SM90::GMMA::ScaleOut::Zero, seq);
            gmma_rs<OpA>(ra0[3], ra8[3], db + 6, &part[0][0][0], cute::SM90::GMMA::ScaleOut::One, seq);
            cute::warpgroup_commit_batch();
            float2 sy[NJ];  // (folded per 128 in the L1 GEMM: group 1's scale is group 0's)
            load_scales<0, NE1>(fsx, 1, sy);
            cute::warpgroup_wait<0>();
            load_scales<NE1, NA>(fsx, 1, sy);
            fence_group<NA>(0, 0);
            fence_group<NA>(1, 0);
            promote<NA>(0, sy);
        }
    }
};

}  // namespace megamoe
