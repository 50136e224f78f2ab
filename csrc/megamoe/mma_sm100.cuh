// megamoe: the architecture-specific matrix path for SM100 (B200): block-scaled FP8 x FP4
// UMMA (`tcgen05.mma.cta_group::2.kind::mxf8f6f4.block_scale`), accumulators and scale
// factors in tensor memory (TMEM), scales copied into TMEM with `tcgen05.cp` (UTCCP).
//
// Everything that CUTLASS/CuTe (nvidia-cutlass >= 4.2) provides is used from there:
//   cute::UMMA::SmemDescriptor / InstrDescriptorBlockScaled / make_instr_desc_block_scaled
//   cute::SM100_MMA_MXF8F6F4_2x1SM_SS        (the MMA, M = 256 over a 2-CTA pair)
//   cute::SM100::TMEM::UTCCP::SM100_UTCCP_4x32dp128bit_2cta   (scale factors smem -> TMEM)
//   cute::SM100::TMEM::LOAD::SM100_TMEM_LOAD_32dp32b8x (epilogue TMEM -> registers)
//   cute::TMEM::Allocator2Sm                 (TMEM allocation for the pair)
//   cutlass::arch::umma_arrive_multicast_2x1SM, fence_view_async_tmem_load
// Hand-written PTX remains only where no CuTe atom exists with the semantics needed here:
// the cluster-scope mbarrier arrive/wait with a timeout, the tcgen05 thread-sync fences and
// the async-proxy fence after generic-proxy (cp.async / st.shared) writes of UMMA operands.
//
// Operand roles ("swap AB", as the reference): UMMA A = weights (128 rows per CTA -> M =
// 256 per pair, K-major, E2M1 unpacked to one byte per element in shared memory), UMMA B =
// tokens (block_m / 2 rows per CTA -> N = block_m, K-major E4M3). The accumulator of each
// CTA is 128 TMEM lanes (its weight rows = output channels) x block_m columns (tokens).
#pragma once
#include <stdint.h>
#include <cute/arch/config.hpp>
#include <cute/arch/mma_sm100_desc.hpp>
#include <cute/arch/mma_sm100_umma.hpp>
#include <cute/arch/copy_sm100.hpp>
#include <cute/arch/tmem_allocator_sm100.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/float8.h>
#include <cutlass/float_subbyte.h>
#include "common.cuh"

#if !defined(CUTE_ARCH_TCGEN05_MXF8F6F4_MMA_ENABLED) && defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 1000)
#error "CuTe did not enable tcgen05 MXF8F6F4 for this target: compile for sm_100a (arch-specific 'a' target)"
#endif

namespace megamoe {
namespace sm100 {

using WeightT = cutlass::detail::float_e2m1_unpacksmem_t;  // E2M1 in an 8-bit container
using TokenT = cutlass::float_e4m3_t;
using ScaleT = cutlass::float_ue8m0_t;

constexpr int kUmmaM = 256;   // 2-CTA pair, 128 weight rows per CTA
constexpr int kUmmaK = 32;    // one UE8M0 scale per 32 K (mxf8f6f4, scale_vec::1X)
constexpr int kRowBytes = 128;  // one SWIZZLE_128B row: 128 one-byte elements of K

// Bit position of an E2M1 value inside its byte in shared memory for kind::f8f6f4
// (the "unpacked" format TMA's 16U4_ALIGN8B mode writes). NOT verified on hardware.
constexpr int kE2M1UnpackShift = 2;

// 8 packed E2M1 (one 32-bit word, element j in nibble j) -> 8 bytes, nibble at kE2M1UnpackShift.
__device__ __forceinline__ uint2 unpack_e2m1x8(uint32_t w) {
    // spread nibbles to bytes: element j -> byte j
    const uint32_t lo = __byte_perm(w, 0u, 0x5140u), hi = __byte_perm(w, 0u, 0x5342u);  // bytes [b0,0,b1,0], [b2,0,b3,0]
    const uint32_t a = ((lo & 0x000f000fu) | ((lo & 0x00f000f0u) << 4));   // [n0, n1, n2, n3]
    const uint32_t b = ((hi & 0x000f000fu) | ((hi & 0x00f000f0u) << 4));   // [n4, n5, n6, n7]
    return make_uint2(a << kE2M1UnpackShift, b << kE2M1UnpackShift);
}

// ------------------------------------------------------------------ descriptors
// K-major SWIZZLE_128B operand tile: rows of 128 bytes, 8-row (1024-byte) swizzle atoms,
// 16-byte chunk index XOR (row % 8). Base must be 1024-byte aligned.
__device__ __forceinline__ cute::UMMA::SmemDescriptor make_kmajor_sw128_desc(const void* smem) {
    cute::UMMA::SmemDescriptor d;
    d.desc_ = 0;
    d.start_address_ = (uint16_t)(smem_u32(smem) >> 4);
    d.leading_byte_offset_ = 1;           // unused for swizzled K-major
    d.stride_byte_offset_ = 1024 >> 4;    // next 8-row atom
    d.version_ = 1;                       // SM100 descriptor
    d.base_offset_ = 0;
    d.lbo_mode_ = 0;
    d.layout_type_ = (uint8_t)cute::UMMA::LayoutType::SWIZZLE_128B;
    return d;
}
// Advance a K-major SW128 descriptor by `bytes` along K inside the 128-byte row.
__device__ __forceinline__ uint64_t advance_k(cute::UMMA::SmemDescriptor d, uint32_t bytes) {
    d.lo += bytes >> 4;
    return (uint64_t)d;
}
// Descriptor for one UTCCP source: 32 rows x 16 bytes, contiguous (no swizzle).
__device__ __forceinline__ uint64_t make_sf_desc(const void* smem) {
    cute::UMMA::SmemDescriptor d;
    d.desc_ = 0;
    d.start_address_ = (uint16_t)(smem_u32(smem) >> 4);
    d.leading_byte_offset_ = 0;
    d.stride_byte_offset_ = 0;
    d.version_ = 1;
    d.layout_type_ = (uint8_t)cute::UMMA::LayoutType::SWIZZLE_NONE;
    return (uint64_t)d;
}

template <int UMMA_N>
__device__ __forceinline__ cute::UMMA::InstrDescriptorBlockScaled instr_desc() {
    return cute::UMMA::make_instr_desc_block_scaled<WeightT, TokenT, float, ScaleT, kUmmaM, UMMA_N,
                                                    cute::UMMA::Major::K, cute::UMMA::Major::K>();
}

// One UMMA: D[tmem_d] (+)= A(weights) x B(tokens)^T with the k-th 32-wide scale of each row.
template <int UMMA_N>
__device__ __forceinline__ void mma(uint64_t a_desc, uint64_t b_desc, uint32_t tmem_d, bool accumulate,
                                    cute::UMMA::InstrDescriptorBlockScaled idesc, uint32_t tmem_sfa, uint32_t tmem_sfb,
                                    uint32_t sf_id) {
    // The scale-factor id (byte of the 32-bit TMEM word) rides in the TMEM address' top bits.
    const uint32_t sfa = tmem_sfa | (sf_id << 30), sfb = tmem_sfb | (sf_id << 30);
    const uint64_t rt = cute::UMMA::make_runtime_instr_desc_block_scaled(idesc, sfa, sfb);
    using Mma = cute::SM100_MMA_MXF8F6F4_2x1SM_SS<WeightT, TokenT, float, ScaleT, kUmmaM, UMMA_N,
                                                  cute::UMMA::Major::K, cute::UMMA::Major::K>;
    Mma::fma(a_desc, b_desc, tmem_d, accumulate ? 1u : 0u, rt, sfa & 0x3fffffffu, sfb & 0x3fffffffu);
}

// 128 rows of packed int32 scales (UTCCP-transposed: 32 rows x 16 bytes) -> 4 TMEM columns
// of both CTAs of the pair (issued by the leader CTA).
__device__ __forceinline__ void utccp_128rows(const void* smem, uint32_t tmem_col) {
    cute::SM100::TMEM::UTCCP::SM100_UTCCP_4x32dp128bit_2cta::copy(make_sf_desc(smem), tmem_col);
}

// MMA completion -> mbarrier in both CTAs of the pair (same smem offset).
__device__ __forceinline__ void commit_pair(uint64_t* bar) {
    cutlass::arch::umma_arrive_multicast_2x1SM(bar, (uint16_t)0x3);
}

__device__ __forceinline__ void tmem_load8(uint32_t taddr, float (&v)[8]) {
    uint32_t r[8];
    cute::SM100::TMEM::LOAD::SM100_TMEM_LOAD_32dp32b8x::copy(taddr, r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7]);
    cutlass::arch::fence_view_async_tmem_load();
    #pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = __uint_as_float(r[i]);
}

// ------------------------------------------------------------------ sync helpers (PTX)
__device__ __forceinline__ void tc_fence_before() { asm volatile("tcgen05.fence::before_thread_sync;" ::: "memory"); }
__device__ __forceinline__ void tc_fence_after() { asm volatile("tcgen05.fence::after_thread_sync;" ::: "memory"); }
// Generic-proxy shared-memory writes (cp.async, st.shared) -> visible to UMMA (async proxy).
__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

__device__ __forceinline__ uint32_t cluster_rank() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// Arrive (release, cluster scope) on the mbarrier at the same smem offset in CTA `cta`.
__device__ __forceinline__ void mbar_arrive_cluster(uint64_t* bar, uint32_t cta) {
    asm volatile("{\n .reg .b32 ra;\n mapa.shared::cluster.u32 ra, %0, %1;\n"
                 " mbarrier.arrive.release.cluster.shared::cluster.b64 _, [ra];\n}"
                 :: "r"(smem_u32(bar)), "r"(cta) : "memory");
}
__device__ __forceinline__ bool mbar_try_wait_cluster(uint64_t* bar, uint32_t parity) {
    uint32_t ok;
    asm volatile("{\n .reg .pred P;\n mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 P, [%1], %2;\n"
                 " selp.u32 %0, 1, 0, P;\n}" : "=r"(ok) : "r"(smem_u32(bar)), "r"(parity) : "memory");
    return ok != 0;
}
// Wait (cluster-scope acquire) for the phase with `parity`; false on timeout / abort.
__device__ __forceinline__ bool mbar_wait_cluster(const Params& p, uint64_t* bar, uint32_t parity, uint32_t role) {
    if (mbar_try_wait_cluster(bar, parity)) return true;
    Deadline d(pipeline_timeout_ns(p));
    while (!mbar_try_wait_cluster(bar, parity)) {
        if (!d.tick(p)) {
            if (!aborted(p)) raise_error(p, kErrTimeoutPipeline, role, -1, -1, -1, -1, parity);
            return false;
        }
    }
    return true;
}

}  // namespace sm100
}  // namespace megamoe
