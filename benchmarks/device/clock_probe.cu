// What the in-kernel trace's clock reads cost (one thread, clock64 cycles per operation): a
// %globaltimer read whose value is used at once, clock64, %smid, a returning atomicAdd, and the
// %globaltimer step (its resolution). Build and run on the GPU machine:
//   nvcc -arch=sm_90a -O3 -o /tmp/clock_probe benchmarks/device/clock_probe.cu && /tmp/clock_probe
// H200, fifteenth session: %globaltimer read + use 6 cycles, clock64 7, %smid 4; step 32 ns
// (benchmarks/NOTES_kernel.md). The atomic's figure (20-29) is not a round trip to L2: the
// loop lets the compiler overlap it, so it is no measure of the consumer's slot reserve.
#include <cstdio>
#include <cstdint>
__device__ __forceinline__ uint64_t gt() { uint64_t t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }
__device__ __forceinline__ uint32_t smid() { uint32_t s; asm volatile("mov.u32 %0, %%smid;" : "=r"(s)); return s; }
__global__ void k(long long* out, uint64_t* sink, unsigned* ctr) {
    long long c0, c1; uint64_t acc = 0;
    // (a) globaltimer read + dependent use, 64 times
    c0 = clock64();
    for (int i = 0; i < 64; ++i) { acc += gt(); asm volatile("" :: "l"(acc)); }
    c1 = clock64(); out[0] = (c1 - c0) / 64;
    // (b) clock64 + use
    c0 = clock64();
    for (int i = 0; i < 64; ++i) { acc += clock64(); asm volatile("" :: "l"(acc)); }
    c1 = clock64(); out[1] = (c1 - c0) / 64;
    // (c) smid
    c0 = clock64();
    for (int i = 0; i < 64; ++i) { acc += smid(); asm volatile("" :: "l"(acc)); }
    c1 = clock64(); out[2] = (c1 - c0) / 64;
    // (d) atomicAdd with return + use
    c0 = clock64();
    for (int i = 0; i < 64; ++i) { acc += atomicAdd(ctr, 1u); asm volatile("" :: "l"(acc)); }
    c1 = clock64(); out[3] = (c1 - c0) / 64;
    // (e) globaltimer read, independent (no use until the end)
    uint64_t t[16];
    c0 = clock64();
    #pragma unroll
    for (int i = 0; i < 16; ++i) t[i] = gt();
    c1 = clock64(); out[4] = (c1 - c0) / 16;
    for (int i = 0; i < 16; ++i) acc += t[i];
    // (f) globaltimer resolution: distinct consecutive values
    uint64_t a = gt(), b; int n = 0; do { b = gt(); ++n; } while (b == a && n < 100000);
    out[5] = (long long)(b - a); out[6] = n;
    *sink = acc;
}
int main() {
    long long* o; uint64_t* s; unsigned* c;
    cudaMalloc(&o, 64); cudaMalloc(&s, 8); cudaMalloc(&c, 4); cudaMemset(c, 0, 4);
    for (int r = 0; r < 3; ++r) {
        k<<<1, 1>>>(o, s, c); cudaDeviceSynchronize();
        long long h[8]; cudaMemcpy(h, o, 56, cudaMemcpyDeviceToHost);
        printf("cycles per op: globaltimer+use %lld, clock64+use %lld, smid+use %lld, atomicAdd+use %lld, globaltimer issue-only %lld; globaltimer step %lld ns after %lld reads\n",
               h[0], h[1], h[2], h[3], h[4], h[5], h[6]);
    }
    return 0;
}
