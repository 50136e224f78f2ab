// What the H200's FP8 WGMMA returns, bit for bit: one warpgroup per tile runs the kernel's own
// instruction (wgmma.m64n16k32 E4M3 x E4M3 -> F32, A from registers in the kernel's fragment
// layout, B from 128-byte-swizzled shared memory through mma_sm90.cuh's descriptor) on operands
// read from a file, and writes four results per tile:
//   v0: k32 step 0 from a zero accumulator (scale-d 0);
//   v1: step 0 from zero, then step 1 accumulated onto it: one 64-K group of the kernel;
//   v2: steps 0..3 chained (128 K);
//   v3: step 0 accumulated onto a given accumulator C (scale-d 1).
// megamoe.reference's accumulator model is fitted to these (benchmarks/wgmma_acc_fit.py).
//
// Files: in = int32 tiles, then uint8 A [tiles][64][128], uint8 B [tiles][16][128] (K-major
// token rows), float C [tiles][64][16]; out = float [tiles][4][64][16].
// Build here (CUTLASS headers of the nvidia-cutlass wheel), run on the GPU machine:
//   nvcc -std=c++17 -gencode=arch=compute_90a,code=sm_90a -O3 -I csrc/megamoe -I <cutlass include> \
//        -o out/probe/wgmma_acc_probe benchmarks/device/wgmma_acc_probe.cu
//   out/probe/wgmma_acc_probe in.bin out.bin
#include <cstdio>
#include <cstdint>
#include <vector>
#include <cuda_runtime.h>
#include "mma_sm90.cuh"

using namespace megamoe;
using Op = GmmaE4M3<16>::Op;
constexpr int kM = 64, kN = 16, kK = 128, kVariants = 4;

__device__ __forceinline__ void step(const uint32_t (&a)[4], uint64_t desc, float* d, cute::SM90::GMMA::ScaleOut s) {
    // a: row r0's K [4t, 4t+4), row r0+8's, row r0's K [16+4t, ..), row r0+8's (mma_sm90.cuh)
    const uint2 r0 = make_uint2(a[0], a[2]), r8 = make_uint2(a[1], a[3]);
    gmma_rs<Op>(r0, r8, desc, d, s, std::make_integer_sequence<int, 8>{});
}

__global__ void __launch_bounds__(128) probe(const uint8_t* A, const uint8_t* B, const float* C, float* out) {
    __shared__ __align__(1024) uint8_t sb[kN * kK];
    const int tile = blockIdx.x, tid = threadIdx.x;
    const uint8_t* Bt = B + (size_t)tile * kN * kK;
    for (int i = tid; i < kN * 8; i += 128) {  // 16-byte chunk c of row n -> chunk c ^ (n % 8)
        const int n = i / 8, c = i % 8;
        *reinterpret_cast<uint4*>(sb + n * kK + ((c ^ (n % 8)) * 16)) = *reinterpret_cast<const uint4*>(Bt + n * kK + c * 16);
    }
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    const int w = tid / 32, l = tid % 32, t = l % 4;
    const int r0 = 16 * w + l / 4, r8 = r0 + 8;
    const uint8_t* At = A + (size_t)tile * kM * kK;
    uint32_t a[4][4];
    #pragma unroll
    for (int q = 0; q < 4; ++q) {
        a[q][0] = *reinterpret_cast<const uint32_t*>(At + r0 * kK + 32 * q + 4 * t);
        a[q][1] = *reinterpret_cast<const uint32_t*>(At + r8 * kK + 32 * q + 4 * t);
        a[q][2] = *reinterpret_cast<const uint32_t*>(At + r0 * kK + 32 * q + 16 + 4 * t);
        a[q][3] = *reinterpret_cast<const uint32_t*>(At + r8 * kK + 32 * q + 16 + 4 * t);
    }
    const uint64_t desc = sw128_kmajor_desc(sb);
    using S = cute::SM90::GMMA::ScaleOut;
    for (int v = 0; v < kVariants; ++v) {
        float d[8];
        #pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int j = i / 4, r = i % 4;
            const int row = r0 + (r >= 2 ? 8 : 0), col = 8 * j + 2 * t + (r & 1);
            d[i] = v == 3 ? C[((size_t)tile * kM + row) * kN + col] : 0.0f;
        }
        #pragma unroll
        for (int i = 0; i < 8; ++i) cute::warpgroup_fence_operand(d[i]);
        cute::warpgroup_arrive();
        const int steps = v == 1 ? 2 : v == 2 ? 4 : 1;
        for (int q = 0; q < steps; ++q) {
            step(a[q], desc + 2 * q, d, (q == 0 && v != 3) ? S::Zero : S::One);
            cute::warpgroup_commit_batch();
            cute::warpgroup_wait<0>();
        }
        #pragma unroll
        for (int i = 0; i < 8; ++i) cute::warpgroup_fence_operand(d[i]);
        #pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int j = i / 4, r = i % 4;
            const int row = r0 + (r >= 2 ? 8 : 0), col = 8 * j + 2 * t + (r & 1);
            out[(((size_t)tile * kVariants + v) * kM + row) * kN + col] = d[i];
        }
    }
}

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_)); return 1; } } while (0)

int main(int argc, char** argv) {
    if (argc != 3) { fprintf(stderr, "usage: %s IN.bin OUT.bin\n", argv[0]); return 2; }
    FILE* f = fopen(argv[1], "rb");
    if (!f) { fprintf(stderr, "cannot open %s\n", argv[1]); return 2; }
    int32_t tiles = 0;
    if (fread(&tiles, 4, 1, f) != 1 || tiles <= 0) { fprintf(stderr, "bad header\n"); return 2; }
    std::vector<uint8_t> A((size_t)tiles * kM * kK), B((size_t)tiles * kN * kK);
    std::vector<float> C((size_t)tiles * kM * kN), O((size_t)tiles * kVariants * kM * kN);
    if (fread(A.data(), 1, A.size(), f) != A.size() || fread(B.data(), 1, B.size(), f) != B.size() ||
        fread(C.data(), 4, C.size(), f) != C.size()) { fprintf(stderr, "short file\n"); return 2; }
    fclose(f);
    uint8_t *dA, *dB; float *dC, *dO;
    CK(cudaMalloc(&dA, A.size())); CK(cudaMalloc(&dB, B.size()));
    CK(cudaMalloc(&dC, C.size() * 4)); CK(cudaMalloc(&dO, O.size() * 4));
    CK(cudaMemcpy(dA, A.data(), A.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dB, B.data(), B.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dC, C.data(), C.size() * 4, cudaMemcpyHostToDevice));
    probe<<<tiles, 128>>>(dA, dB, dC, dO);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(O.data(), dO, O.size() * 4, cudaMemcpyDeviceToHost));
    f = fopen(argv[2], "wb");
    if (!f || fwrite(O.data(), 4, O.size(), f) != O.size()) { fprintf(stderr, "cannot write %s\n", argv[2]); return 1; }
    fclose(f);
    printf("%d tiles, %zu results\n", tiles, O.size());
    return 0;
}
