// What one K block of the SM90 kernel's WGMMAs costs at each N (tokens): the premise of candidates
// TN / TN8 (benchmarks/NOTES_kernel.md, fifty-first session), measured without the rest of the
// kernel. One CTA per SM, WGS warpgroups (2: the kernel's two consumer warpgroups, sharing the SM's
// tensor cores), each running ITERS K blocks of the kernel's instruction, `wgmma.m64nNk32` E4M3 x
// E4M3 -> F32 with A from registers (mma_sm90.cuh's gmma_rs) and B from 128-byte-swizzled shared
// memory (its descriptor): per K block four k32 steps chained into one partial (as the kernel's
// block_m 128 L1 GEMM), wait, and (PROMOTE) the partial promoted into the accumulator with one
// FFMA per element, as the kernel does. Operand values are fixed (timing only).
// SPLIT (N = 128 only): each k32 step as two n64 WGMMAs over the two halves of the tokens (B
// descriptors 64 rows = 8192 B apart), into two 32-float halves of the partial: whether N = 128's
// slower rate is the instruction's or the accumulator's (session 52).
// Each warpgroup's thread 0 records globaltimer and clock64 around its K blocks; the host prints
// JSON: per (N, warpgroups, promote, split) the median over CTAs of ns and cycles per K block.
// Build (CUTLASS headers of the nvidia-cutlass wheel), run on the GPU machine:
//   python3 benchmarks/device/wgmma_n_probe.py OUT.json
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
#include "mma_sm90.cuh"

namespace probe {
using namespace cute::SM90::GMMA;
template <int N> struct OpOf;
template <> struct OpOf<8> { using Op = MMA_64x8x32_F32E4M3E4M3_RS_TN<>; };
template <> struct OpOf<16> { using Op = MMA_64x16x32_F32E4M3E4M3_RS_TN<>; };
template <> struct OpOf<32> { using Op = MMA_64x32x32_F32E4M3E4M3_RS_TN<>; };
template <> struct OpOf<64> { using Op = MMA_64x64x32_F32E4M3E4M3_RS_TN<>; };
template <> struct OpOf<96> { using Op = MMA_64x96x32_F32E4M3E4M3_RS_TN<>; };
template <> struct OpOf<128> { using Op = MMA_64x128x32_F32E4M3E4M3_RS_TN<>; };
}  // namespace probe

constexpr int kIters = 512;
constexpr int kTokens = 128;  // token rows in shared memory (the widest N)

__device__ __forceinline__ uint64_t globaltimer() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

template <int N, bool PROMOTE, bool SPLIT = false>
__global__ void __launch_bounds__(256, 1) k_blocks(int wgs, unsigned long long* out) {
    static_assert(!SPLIT || N == 128, "SPLIT runs N = 128 as two n64 WGMMAs");
    using Op = typename probe::OpOf<SPLIT ? N / 2 : N>::Op;
    constexpr int NV = N / 2;  // accumulator floats per thread
    __shared__ __align__(1024) uint8_t sb[kTokens * 128];
    for (int i = threadIdx.x; i < kTokens * 128 / 16; i += blockDim.x)
        reinterpret_cast<uint4*>(sb)[i] = make_uint4(0x38383838u, 0x38383838u, 0x38383838u, 0x38383838u);  // E4M3 1.0
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    const int wg = threadIdx.x / 128;
    if (wg >= wgs) return;
    const uint64_t db = megamoe::sw128_kmajor_desc(sb);
    uint2 a0 = make_uint2(0x30303030u, 0x30303030u), a8 = a0;
    float part[NV], acc[NV];
    #pragma unroll
    for (int j = 0; j < NV; ++j) acc[j] = 0.0f;
    constexpr auto seq = std::make_integer_sequence<int, SPLIT ? NV / 2 : NV>{};
    constexpr uint64_t kHalf = (64 * 128) >> 4;  // the second n64's B: 64 token rows on (descriptor units)
    __syncwarp();
    const uint64_t t0 = globaltimer();
    const long long c0 = clock64();
    for (int it = 0; it < kIters; ++it) {
        cute::warpgroup_arrive();
        #pragma unroll
        for (int k = 0; k < 4; ++k) {
            const auto so = k == 0 ? cute::SM90::GMMA::ScaleOut::Zero : cute::SM90::GMMA::ScaleOut::One;
            megamoe::gmma_rs<Op>(a0, a8, db + 2 * k, part, so, seq);
            if constexpr (SPLIT) megamoe::gmma_rs<Op>(a0, a8, db + kHalf + 2 * k, part + NV / 2, so, seq);
        }
        cute::warpgroup_commit_batch();
        cute::warpgroup_wait<0>();
        #pragma unroll
        for (int j = 0; j < NV; ++j) cute::warpgroup_fence_operand(part[j]);
        if constexpr (PROMOTE) {
            #pragma unroll
            for (int j = 0; j < NV; ++j) acc[j] = fmaf(part[j], 1.0009765625f, acc[j]);
        }
    }
    const long long c1 = clock64();
    const uint64_t t1 = globaltimer();
    float s = 0.0f;
    #pragma unroll
    for (int j = 0; j < NV; ++j) s += PROMOTE ? acc[j] : part[j];
    if (threadIdx.x % 128 == 0) {
        unsigned long long* o = out + (blockIdx.x * 2 + wg) * 3;
        o[0] = t1 - t0;
        o[1] = (unsigned long long)(c1 - c0);
        o[2] = (unsigned long long)(s != s);  // keeps the sums live (never NaN here)
    }
}

template <int N, bool PROMOTE, bool SPLIT = false>
static void run(int sms, int wgs, bool first) {
    unsigned long long* d;
    cudaMalloc(&d, sizeof(unsigned long long) * sms * 2 * 3);
    cudaMemset(d, 0, sizeof(unsigned long long) * sms * 2 * 3);
    for (int rep = 0; rep < 3; ++rep) k_blocks<N, PROMOTE, SPLIT><<<sms, 256>>>(wgs, d);  // the last one kept
    cudaError_t e = cudaDeviceSynchronize();
    std::vector<unsigned long long> h(sms * 2 * 3);
    cudaMemcpy(h.data(), d, h.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost);
    cudaFree(d);
    std::vector<double> ns, cyc;
    for (int b = 0; b < sms; ++b)
        for (int w = 0; w < wgs; ++w) {
            ns.push_back((double)h[(b * 2 + w) * 3] / kIters);
            cyc.push_back((double)h[(b * 2 + w) * 3 + 1] / kIters);
        }
    std::sort(ns.begin(), ns.end());
    std::sort(cyc.begin(), cyc.end());
    const double p50 = ns[ns.size() / 2];
    // FLOP per K block and warpgroup: 2 x 64 rows x N tokens x 128 K; over every warpgroup of every SM
    const double tflops = 2.0 * 64 * N * 128 * wgs * sms / p50 / 1e3;
    printf("%s  {\"n\": %d, \"warpgroups\": %d, \"promote\": %s, \"split\": %s, \"ns_per_k_block_p50\": %.2f, \"ns_p10\": %.2f, "
           "\"ns_p90\": %.2f, \"cycles_per_k_block_p50\": %.1f, \"tflops\": %.1f, \"error\": \"%s\"}",
           first ? "" : ",\n", N, wgs, PROMOTE ? "true" : "false", SPLIT ? "true" : "false", p50, ns[ns.size() / 10], ns[ns.size() * 9 / 10],
           cyc[cyc.size() / 2], tflops, e == cudaSuccess ? "" : cudaGetErrorString(e));
}

template <bool PROMOTE>
static void all_n(int sms, int wgs, bool& first) {
    run<8, PROMOTE>(sms, wgs, first); first = false;
    run<16, PROMOTE>(sms, wgs, first);
    run<32, PROMOTE>(sms, wgs, first);
    run<64, PROMOTE>(sms, wgs, first);
    run<96, PROMOTE>(sms, wgs, first);
    run<128, PROMOTE>(sms, wgs, first);
    run<128, PROMOTE, true>(sms, wgs, first);
}

int main() {
    cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    const int sms = prop.multiProcessorCount;
    printf("{\"device\": \"%s\", \"sms\": %d, \"iters\": %d, \"rows\": [\n", prop.name, sms, kIters);
    bool first = true;
    for (int wgs : {2, 1}) {
        all_n<true>(sms, wgs, first);
        all_n<false>(sms, wgs, first);
    }
    printf("\n]}\n");
    return 0;
}
