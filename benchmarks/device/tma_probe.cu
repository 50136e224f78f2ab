// The bulk-copy engine's figures behind the simulator's estimates (sim/hardware/h200.toml:
// tma_latency_ns, sm_load_gbs) and one its estimates leave out (the read-only stream of all SMs),
// measured with the instruction the kernel's producer uses for weight tiles
// (cp.async.bulk global -> shared, completion counted on an mbarrier, kernel_sm90.cu).
// Driven by benchmarks/device/tma_probe.py (it compiles this file with nvcc -gencode sm_90a,
// runs it and writes the JSON); alone:
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -o /tmp/tma_probe benchmarks/device/tma_probe.cu
//   /tmp/tma_probe > probe.json
// Output: one JSON object on stdout. Latencies are per copy, issue to the mbarrier's phase flip,
// in SM cycles (clock64) and ns (cycles over the SM clock, read in the same kernel as clock64
// cycles per %globaltimer ns over the whole run).
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)

__device__ __forceinline__ uint64_t gtimer() { uint64_t t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }
__device__ __forceinline__ uint32_t s_addr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(uint64_t* b) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(s_addr(b)));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* b) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(s_addr(b)), "r"(bytes) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 :: "r"(s_addr(dst)), "l"(src), "r"(bytes), "r"(s_addr(b)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* b, uint32_t parity) {
    asm volatile("{\n .reg .pred p;\n W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra W;\n}"
                 :: "r"(s_addr(b)), "r"(parity) : "memory");
}

// Latency: one thread per CTA, one copy in flight; copy i reads base + cta_off + i * stride.
// stride 0 re-reads one tile (L2 after the first copy); a stride past the tile reads fresh lines
// (HBM, after the host has flushed the L2). lat[cta * n + i] = cycles of copy i.
__global__ void latency_kernel(const uint8_t* src, size_t cta_off, size_t stride, uint32_t bytes, int n,
                               long long* lat, double* cyc_per_ns) {
    extern __shared__ __align__(128) uint8_t smem[];
    __shared__ uint64_t bar;
    if (threadIdx.x != 0) return;
    mbar_init(&bar);
    const uint8_t* base = src + blockIdx.x * cta_off;
    long long c_begin = clock64(); uint64_t g_begin = gtimer();
    for (int i = 0; i < n; ++i) {
        long long c0 = clock64();
        bulk_load(smem, base + (size_t)i * stride, bytes, &bar);
        mbar_wait(&bar, i & 1);
        long long c1 = clock64();
        lat[(size_t)blockIdx.x * n + i] = c1 - c0;
    }
    long long c_end = clock64(); uint64_t g_end = gtimer();
    if (blockIdx.x == 0) *cyc_per_ns = double(c_end - c_begin) / double(g_end - g_begin);
}

// Streaming: lane 0 of each of the CTA's warps keeps `stages` copies of `bytes` in flight (a
// stage is refilled as soon as its copy lands); warp w of `warps` issues copies w, w + warps, ...
// of its CTA's contiguous span (CTA c starts at c * span), wrapped inside one `window` of bytes (a
// power of two) at the buffer's start when window > 0: an L2-resident loop that every CTA shares,
// each starting at its own c * span inside it. ns[c] = the CTA's time (its slowest warp).
__global__ void stream_kernel(const uint8_t* src, size_t span, size_t window, uint32_t bytes, int stages, int n,
                              unsigned long long* ns) {
    extern __shared__ __align__(128) uint8_t smem[];
    __shared__ uint64_t bars[64];
    __shared__ unsigned long long t_end[32];
    const int warp = threadIdx.x / 32, warps = blockDim.x / 32;
    uint64_t* wb = bars + warp * stages;
    uint8_t* ws = smem + (size_t)warp * stages * bytes;
    if (threadIdx.x % 32 == 0) for (int s = 0; s < stages; ++s) mbar_init(&wb[s]);
    __syncthreads();
    const size_t cta0 = (size_t)blockIdx.x * span, wmask = window ? window - 1 : ~size_t(0);
    uint64_t g0 = gtimer();
    if (threadIdx.x % 32 == 0) {
        for (int i = 0; i < n; ++i) {
            int s = i % stages;
            if (i >= stages) mbar_wait(&wb[s], ((i / stages) - 1) & 1);
            bulk_load(ws + (size_t)s * bytes, src + ((cta0 + ((size_t)i * warps + warp) * bytes) & wmask), bytes, &wb[s]);
        }
        for (int i = n > stages ? n - stages : 0; i < n; ++i) mbar_wait(&wb[i % stages], (i / stages) & 1);
        t_end[warp] = gtimer();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned long long e = 0;
        for (int w = 0; w < warps; ++w) e = t_end[w] > e ? t_end[w] : e;
        ns[blockIdx.x] = e - g0;
    }
}

static void flush_l2(uint8_t* scratch, size_t bytes) { CK(cudaMemset(scratch, (int)(rand() & 0xff), bytes)); CK(cudaDeviceSynchronize()); }

static void pct(std::vector<double> v, double* out) {  // p10, p50, p90
    std::sort(v.begin(), v.end());
    const double q[3] = {0.1, 0.5, 0.9};
    for (int j = 0; j < 3; ++j) out[j] = v[std::min(v.size() - 1, (size_t)(q[j] * (v.size() - 1) + 0.5))];
}

int main() {
    cudaDeviceProp prop; CK(cudaGetDeviceProperties(&prop, 0));
    const int sms = prop.multiProcessorCount;
    const size_t buf_bytes = size_t(4) << 30, flush_bytes = size_t(512) << 20;
    uint8_t *buf, *scratch; CK(cudaMalloc(&buf, buf_bytes)); CK(cudaMalloc(&scratch, flush_bytes));
    CK(cudaMemset(buf, 0x11, buf_bytes));
    CK(cudaFuncSetAttribute(latency_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
    CK(cudaFuncSetAttribute(stream_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
    long long* d_lat; double* d_cpn; unsigned long long* d_ns;
    const int n = 64;
    CK(cudaMalloc(&d_lat, sizeof(long long) * n * sms)); CK(cudaMalloc(&d_cpn, sizeof(double)));
    CK(cudaMalloc(&d_ns, sizeof(unsigned long long) * sms));
    printf("{\"device\": \"%s\", \"sms\": %d, \"l2_bytes\": %d, \"copies_per_sample\": %d,\n \"latency\": [", prop.name, sms,
           prop.l2CacheSize, n);
    // Latency rows: (bytes, where, CTAs). "hbm": fresh 64 KiB-strided tiles after an L2 flush;
    // "l2": the same tile again (the first copy of each CTA, a miss, left out).
    const uint32_t sizes[3] = {2048, 8192, 16384};
    bool first = true;
    for (int ctas : {1, sms}) for (uint32_t bytes : sizes) for (int hbm = 1; hbm >= 0; --hbm) {
        const size_t stride = hbm ? (64 << 10) : 0, cta_off = size_t(n) * (64 << 10);
        flush_l2(scratch, flush_bytes);
        latency_kernel<<<ctas, 32, bytes>>>(buf, cta_off, stride, bytes, n, d_lat, d_cpn);
        CK(cudaGetLastError()); CK(cudaDeviceSynchronize());
        std::vector<long long> lat(size_t(n) * ctas); double cpn;
        CK(cudaMemcpy(lat.data(), d_lat, sizeof(long long) * lat.size(), cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(&cpn, d_cpn, sizeof(double), cudaMemcpyDeviceToHost));
        std::vector<double> cyc;
        for (int c = 0; c < ctas; ++c) for (int i = hbm ? 0 : 1; i < n; ++i) cyc.push_back(double(lat[size_t(c) * n + i]));
        double p[3]; pct(cyc, p);
        printf("%s\n  {\"bytes\": %u, \"source\": \"%s\", \"ctas\": %d, \"samples\": %zu, \"cycles_per_ns\": %.4f, "
               "\"cycles_p10\": %.0f, \"cycles_p50\": %.0f, \"cycles_p90\": %.0f, \"ns_p10\": %.1f, \"ns_p50\": %.1f, \"ns_p90\": %.1f}",
               first ? "" : ",", bytes, hbm ? "hbm" : "l2", ctas, cyc.size(), cpn, p[0], p[1], p[2], p[0] / cpn, p[1] / cpn,
               p[2] / cpn);
        first = false;
    }
    printf("],\n \"stream\": [");
    // Streaming rows: (CTAs, issuing warps per CTA, stages per warp, bytes per copy, where). One CTA
    // alone bounds one SM's engine (with four issuing warps, as the kernel's producer, the issue
    // loop is not the limit); every SM at once gives the read-only HBM stream through the engines,
    // and, re-reading one 4 MiB window together, the L2's aggregate rate to the SMs (fiftieth session).
    first = true;
    struct Row { int ctas, warps, stages; uint32_t bytes; bool l2; };
    const Row rows[] = {{1, 1, 8, 16384, false}, {1, 1, 8, 16384, true}, {1, 1, 16, 8192, false}, {1, 1, 16, 8192, true},
                        {1, 4, 2, 16384, false}, {1, 4, 2, 16384, true}, {1, 4, 4, 8192, false}, {1, 4, 4, 8192, true},
                        {1, 4, 8, 4096, true}, {1, 8, 2, 8192, true},
                        {sms, 1, 8, 16384, false}, {sms, 1, 16, 8192, false}, {sms, 1, 4, 8192, false}, {sms, 4, 4, 8192, false},
                        {sms, 4, 4, 8192, true}, {sms, 4, 2, 16384, true}};
    for (const Row& r : rows) {
        const int copies = r.l2 ? 8192 : (r.ctas == 1 ? 8192 : 2048);  // per CTA
        const int per_warp = copies / r.warps;
        const size_t window = r.l2 ? (size_t(4) << 20) : 0;  // one CTA's span, or its place in the shared window
        const size_t span = (r.l2 ? window / r.ctas : buf_bytes / sms) / r.bytes * r.bytes;
        const size_t smem = size_t(r.warps) * r.stages * r.bytes;
        double best = 0, gbs_all[3];
        std::vector<double> runs;
        for (int rep = 0; rep < 5; ++rep) {
            flush_l2(scratch, flush_bytes);
            if (r.l2) stream_kernel<<<r.ctas, 32 * r.warps, smem>>>(buf, span, window, r.bytes, r.stages, per_warp / 4, d_ns);
            stream_kernel<<<r.ctas, 32 * r.warps, smem>>>(buf, span, window, r.bytes, r.stages, per_warp, d_ns);
            CK(cudaGetLastError()); CK(cudaDeviceSynchronize());
            std::vector<unsigned long long> ns(r.ctas);
            CK(cudaMemcpy(ns.data(), d_ns, sizeof(unsigned long long) * r.ctas, cudaMemcpyDeviceToHost));
            const double t = double(*std::max_element(ns.begin(), ns.end()));
            runs.push_back(double(r.ctas) * per_warp * r.warps * r.bytes / t);  // bytes per ns = GB/s
            best = std::max(best, runs.back());
        }
        pct(runs, gbs_all);
        printf("%s\n  {\"ctas\": %d, \"warps\": %d, \"stages_per_warp\": %d, \"bytes\": %u, \"source\": \"%s\", "
               "\"copies_per_cta\": %d, \"runs\": 5, \"gbs_p50\": %.1f, \"gbs_max\": %.1f}",
               first ? "" : ",", r.ctas, r.warps, r.stages, r.bytes, r.l2 ? "l2" : "hbm", per_warp * r.warps, gbs_all[1], best);
        first = false;
    }
    printf("]}\n");
    return 0;
}
