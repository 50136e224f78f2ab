// megamoe: the architecture-specific matrix path for SM90 (Hopper): WGMMA.
//
// Two consumer warpgroups per CTA; the CTA tile is 128 weight rows (one N block) x BLOCK_M
// tokens x 128 K per stage. The GEMM runs "swap AB" (as DeepGEMM's SM90 kernels do for small
// M): the weights are WGMMA's A operand (M = 64 rows per warpgroup, warpgroup g owns rows
// [64 g, 64 g + 64) of the N block) and the tokens its B operand (N = BLOCK_M, 16..128), so
// every block_m the plan picks is one `wgmma.m64nBMk32` per K group without padding rows.
//
// Both operands sit in shared memory K-major as 128-byte rows (one K block of FP8) with the
// 16-byte chunk index XOR-swizzled by (row % 8) inside 1024-byte atoms: the 128-byte swizzle
// of a WGMMA shared-memory descriptor (stride between 8-row atoms 1024 B; the K step of 32
// FP8 = 32 B advances the start address, DeepGEMM's idiom). Atoms must be 1024-B aligned.
//
// Numerics (`megamoe.reference.Numerics.sm90(fold_k=None)`): each 32-wide K group is one
// WGMMA with a zeroed accumulator (scale-d = 0), and its FP32 partial sum is promoted into
// the FP32 accumulator as acc = fma(d * 2^sw, 2^sx, acc) with the UE8M0 scales of the
// weight row and the token for that group. The scales arrive in the stage as FP32 tables
// [4][128] (weights) and [4][BLOCK_M] (tokens), converted once per stage by the decode step.
//
// The MMA atoms, the descriptor and the wgmma fences come from CUTLASS/CuTe
// (cute/arch/mma_sm90_gmma.hpp, cute/arch/mma_sm90_desc.hpp).
#pragma once
#include <stdint.h>
#include <utility>
#include <cute/arch/mma_sm90_desc.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>

namespace megamoe {

__device__ __forceinline__ float ue8m0_to_float(uint32_t e) { return __uint_as_float(e << 23); }

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
template <> struct GmmaE4M3<16> { using Op = cute::SM90::GMMA::MMA_64x16x32_F32E4M3E4M3_SS_TN<>; };
template <> struct GmmaE4M3<32> { using Op = cute::SM90::GMMA::MMA_64x32x32_F32E4M3E4M3_SS_TN<>; };
template <> struct GmmaE4M3<64> { using Op = cute::SM90::GMMA::MMA_64x64x32_F32E4M3E4M3_SS_TN<>; };
template <> struct GmmaE4M3<128> { using Op = cute::SM90::GMMA::MMA_64x128x32_F32E4M3E4M3_SS_TN<>; };

template <class Op, int... I>
__device__ __forceinline__ void gmma_zero_acc(uint64_t da, uint64_t db, float* d, std::integer_sequence<int, I...>) {
    Op::fma(da, db, d[I]..., cute::SM90::GMMA::ScaleOut::Zero);
}

// One consumer warpgroup's share of a block: 64 weight rows x BLOCK_M tokens.
// (Measured on the H200: splitting the tokens in two WGMMAs to overlap one half's promotion
// with the other half's WGMMA was 5-10% slower than this plain loop; the two warpgroups
// already overlap each other. benchmarks/NOTES_kernel.md.)
template <int BLOCK_M>
struct Sm90Tile {
    static constexpr int NJ = BLOCK_M / 8;  // n8 column tiles (tokens)
    static_assert(BLOCK_M == 16 || BLOCK_M == 32 || BLOCK_M == 64 || BLOCK_M == 128, "bad block_m");
    using Op = typename GmmaE4M3<BLOCK_M>::Op;

    float acc[NJ][4];
    float part[NJ][4];
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

    // One 128-deep K block. a: [BLOCK_M][128] E4M3 tokens, w: this warpgroup's [64][128] E4M3
    // weight rows, both swizzled and 1024-B aligned; fsx: FP32 [4][BLOCK_M] token scales,
    // fsw: FP32 [4][64] scales of this warpgroup's weight rows. promote_on = false skips the
    // FP32 promotion (timing experiments only: fault_inject bit 16).
    __device__ __forceinline__ void mma_k_block(const uint8_t* a, const uint8_t* w, const float* fsx, const float* fsw,
                                                bool promote_on = true) {
        const uint64_t da = sw128_kmajor_desc(w);
        const uint64_t db = sw128_kmajor_desc(a);
        const int r0 = wi * 16 + lane / 4;
        #pragma unroll
        for (int q = 0; q < 4; ++q) {
            cute::warpgroup_arrive();
            gmma_zero_acc<Op>(da + 2 * q, db + 2 * q, &part[0][0], std::make_integer_sequence<int, NJ * 4>{});
            cute::warpgroup_commit_batch();
            cute::warpgroup_wait<0>();
            #pragma unroll
            for (int j = 0; j < NJ; ++j)
                #pragma unroll
                for (int r = 0; r < 4; ++r) cute::warpgroup_fence_operand(part[j][r]);
            if (!promote_on) continue;
            const float sw0 = fsw[q * 64 + r0], sw1 = fsw[q * 64 + r0 + 8];
            #pragma unroll
            for (int j = 0; j < NJ; ++j) {
                const float2 sx = *reinterpret_cast<const float2*>(fsx + q * BLOCK_M + tok_of(j, 0));
                acc[j][0] = fmaf(part[j][0] * sw0, sx.x, acc[j][0]);
                acc[j][1] = fmaf(part[j][1] * sw0, sx.y, acc[j][1]);
                acc[j][2] = fmaf(part[j][2] * sw1, sx.x, acc[j][2]);
                acc[j][3] = fmaf(part[j][3] * sw1, sx.y, acc[j][3]);
            }
        }
    }
};

}  // namespace megamoe
