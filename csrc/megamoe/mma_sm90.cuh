// megamoe: the architecture-specific matrix path for SM90 (Hopper).
//
// One consumer k-block step: 8 consumer warps, CTA tile BLOCK_M x 128, K = 128 per stage.
// A (E4M3 pool rows) and B (E2M1 decoded to E4M3 by the producer) sit in shared memory as
// 128-byte rows with the 16-byte chunk index XOR-swizzled by (row % 8). Each 32-wide K group
// is one `mma.sync.m16n8k32` E4M3 x E4M3 -> FP32 with a zero accumulator, and the partial sum
// is promoted into the FP32 accumulator times 2^(sx + sw) (the UE8M0 scales of the row and
// column for that group). That is the numerics `w_fold_k=None, x_fold_k=None` of
// megamoe.reference: scales applied per 32-K group on an FP32 partial sum.
//
// An SM100 path replaces this file (tcgen05 block-scaled MMA, TMEM accumulators); the
// fragment-to-(row, col) map exposed by `Sm90Tile::row_of/col_of` is what the shared
// epilogue needs.
#pragma once
#include <stdint.h>

namespace megamoe {

__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}

__device__ __forceinline__ void mma_e4m3_16x8x32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%10,%10,%10};"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(0.0f));
}

__device__ __forceinline__ float ue8m0_to_float(uint32_t e) { return __uint_as_float(e << 23); }

template <int BLOCK_M>
struct Sm90Tile {
    static constexpr int kWarpsN = BLOCK_M >= 64 ? 4 : 8;
    static constexpr int kWarpsM = 8 / kWarpsN;
    static constexpr int MT = BLOCK_M / kWarpsM / 16;   // m16 tiles per warp
    static constexpr int NT = 128 / kWarpsN / 8;        // n8 tiles per warp (even: gate/up pairs)
    static_assert(MT >= 1 && NT % 2 == 0, "bad tile");

    float acc[MT][NT][4];
    int warp_m, warp_n;

    __device__ __forceinline__ void init(int consumer_warp) {
        warp_m = consumer_warp / kWarpsN;
        warp_n = consumer_warp % kWarpsN;
    }
    __device__ __forceinline__ void zero() {
        #pragma unroll
        for (int i = 0; i < MT; ++i)
            #pragma unroll
            for (int j = 0; j < NT; ++j)
                #pragma unroll
                for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.0f;
    }
    // Fragment element (i, j, r) -> tile-local row / column.
    __device__ __forceinline__ int row_of(int i, int r) const {
        return warp_m * MT * 16 + i * 16 + (int)(threadIdx.x & 31) / 4 + (r >= 2 ? 8 : 0);
    }
    __device__ __forceinline__ int col_of(int j, int r) const {
        return warp_n * NT * 8 + j * 8 + ((int)(threadIdx.x & 31) % 4) * 2 + (r & 1);
    }

    // One 128-deep K block. a: [BLOCK_M][128] swizzled, b: [128][128] swizzled,
    // sfa: [BLOCK_M][4] UE8M0, sfb: [128][4] UE8M0.
    __device__ __forceinline__ void mma_k_block(const uint8_t* a, const uint8_t* b, const uint8_t* sfa,
                                                const uint8_t* sfb) {
        const int lane = (int)(threadIdx.x & 31);
        const uint32_t a_base = smem_u32(a), b_base = smem_u32(b);
        #pragma unroll(MT >= 4 ? 1 : 4)
        for (int q = 0; q < 4; ++q) {
            uint32_t af[MT][4], bf[NT][2];
            #pragma unroll
            for (int i = 0; i < MT; ++i) {
                const int r = warp_m * MT * 16 + i * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
                const int ch = q * 2 + (lane >> 4);
                ldmatrix_x4(a_base + r * 128 + ((ch ^ (r & 7)) << 4), af[i][0], af[i][1], af[i][2], af[i][3]);
            }
            #pragma unroll
            for (int jp = 0; jp < NT / 2; ++jp) {
                const int n = warp_n * NT * 8 + jp * 16 + (lane & 7) + (lane >> 4) * 8;
                const int ch = q * 2 + ((lane >> 3) & 1);
                ldmatrix_x4(b_base + n * 128 + ((ch ^ (n & 7)) << 4), bf[2 * jp][0], bf[2 * jp][1],
                            bf[2 * jp + 1][0], bf[2 * jp + 1][1]);
            }
            float sx[MT][2], sw[NT][2];
            #pragma unroll
            for (int i = 0; i < MT; ++i) {
                sx[i][0] = ue8m0_to_float(sfa[row_of(i, 0) * 4 + q]);
                sx[i][1] = ue8m0_to_float(sfa[row_of(i, 2) * 4 + q]);
            }
            #pragma unroll
            for (int j = 0; j < NT; ++j) {
                sw[j][0] = ue8m0_to_float(sfb[col_of(j, 0) * 4 + q]);
                sw[j][1] = ue8m0_to_float(sfb[col_of(j, 1) * 4 + q]);
            }
            #pragma unroll
            for (int i = 0; i < MT; ++i)
                #pragma unroll
                for (int j = 0; j < NT; ++j) {
                    float d[4];
                    mma_e4m3_16x8x32(d, af[i], bf[j]);
                    acc[i][j][0] = fmaf(d[0] * sw[j][0], sx[i][0], acc[i][j][0]);
                    acc[i][j][1] = fmaf(d[1] * sw[j][1], sx[i][0], acc[i][j][1]);
                    acc[i][j][2] = fmaf(d[2] * sw[j][0], sx[i][1], acc[i][j][2]);
                    acc[i][j][3] = fmaf(d[3] * sw[j][1], sx[i][1], acc[i][j][3]);
                }
        }
    }
};

}  // namespace megamoe
