// megamoe: architecture-neutral device helpers (sm_90a and later): timers, timeouts,
// errors, grid sync, mbarriers, cp.async, trace records. Shared by the SM90 path and a
// future SM100 path; nothing here issues matrix instructions.
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>
#include "params.h"

namespace megamoe {

__device__ __forceinline__ uint64_t globaltimer() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
// The SM cycle counter, low 32 bits (differences are exact modulo 2^32: 2.5 s at 1.7 GHz).
__device__ __forceinline__ uint32_t clock32() {
    uint32_t c;
    asm volatile("mov.u32 %0, %%clock;" : "=r"(c));
    return c;
}
__device__ __forceinline__ uint32_t smid() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(r));
    return r;
}
__device__ __forceinline__ uint32_t lane_id() { return threadIdx.x & 31; }

// ---------------------------------------------------------------- memory ordering
__device__ __forceinline__ uint32_t ld_acquire_u32(const uint32_t* p) {
    uint32_t v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ unsigned long long ld_acquire_u64(const unsigned long long* p) {
    unsigned long long v;
    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
// Relaxed loads for spin loops: an acquire load invalidates the SM's L1 (CCTL.IVALL) every
// time it runs, so a spin polls with these and acquires once when the value is there.
__device__ __forceinline__ uint32_t ld_relaxed_u32(const uint32_t* p) {
    uint32_t v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ unsigned long long ld_relaxed_u64(const unsigned long long* p) {
    unsigned long long v;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void red_release_add_u32(uint32_t* p, uint32_t v) {
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void red_release_add_u64(unsigned long long* p, unsigned long long v) {
    asm volatile("red.release.gpu.global.add.u64 [%0], %1;" :: "l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void st_relaxed_u64(unsigned long long* p, unsigned long long v) {
    asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" :: "l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void red_release_or_u64(unsigned long long* p, unsigned long long v) {
    asm volatile("red.release.gpu.global.or.b64 [%0], %1;" :: "l"(p), "l"(v) : "memory");
}

// ---------------------------------------------------------------- errors / timeouts
// threadIdx.x read where it is used: values derived from it in an epilogue are not hoisted
// by the compiler to the kernel's start, where they would hold registers through the K loop.
__device__ __forceinline__ uint32_t tid_here() {
    uint32_t t;
    asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
    return t;
}
// x, which the compiler cannot see through: a test of it is redone where it stands (not hoisted
// out of a loop and held as a predicate).
__device__ __forceinline__ uint32_t opaque_u32(uint32_t x) {
    asm volatile("mov.u32 %0, %0;" : "+r"(x));
    return x;
}
__device__ __forceinline__ bool aborted(const Params& p) {
    return *reinterpret_cast<volatile uint32_t*>(p.error) != 0;
}
__device__ __forceinline__ void raise_error(const Params& p, uint32_t code, uint32_t role, int expert,
                                            int m, int n, int k, uint32_t observed) {
    if (atomicCAS(p.error, 0u, code) == 0u) {
        p.error[1] = blockIdx.x; p.error[2] = role; p.error[3] = (uint32_t)expert;
        p.error[4] = (uint32_t)m; p.error[5] = (uint32_t)n; p.error[6] = (uint32_t)k;
        p.error[7] = observed;
        __threadfence();
    }
}

// A spin-wait helper: call `poll()` until it returns true; gives up (returns false)
// after p.timeout_ns or when another thread raised an error.
struct Deadline {
    uint64_t start; int64_t limit; uint32_t iters;
    __device__ __forceinline__ explicit Deadline(int64_t limit_ns) : start(globaltimer()), limit(limit_ns), iters(0) {}
    // true = keep waiting. Each poll backs off briefly so that waiting warps leave the
    // issue slots to the warps that work (measured with ncu on the H200: spinning warps
    // executed most of the kernel's instructions).
    __device__ __forceinline__ bool tick(const Params& p) {
        __nanosleep(64);
        if ((++iters & 255u) != 0) return true;
        if (aborted(p)) return false;
        return (int64_t)(globaltimer() - start) < limit;
    }
};

// A barrier on one 64-bit counter (high half: CTAs that published, low half: items): wait
// until all gridDim.x CTAs published, polling with acquire loads for at most limit_ns (the
// schedulers' expert counts, the EP dispatch's send counts). v holds the last value read.
// False after the timeout (kErrTimeoutCounts raised for `role`, naming counter e) or when
// another error aborted the call.
__device__ __forceinline__ bool wait_published(const Params& p, const unsigned long long* ctr, unsigned long long& v,
                                               int e, uint32_t role, int64_t limit_ns) {
    v = ld_acquire_u64(ctr);
    if ((uint32_t)(v >> 32) == gridDim.x) return true;
    Deadline d(limit_ns);
    while ((uint32_t)((v = ld_acquire_u64(ctr)) >> 32) != gridDim.x) {
        if (!d.tick(p)) {
            if (!aborted(p)) raise_error(p, kErrTimeoutCounts, role, e, -1, -1, -1, (uint32_t)(v >> 32));
            return false;
        }
    }
    return true;
}

// A barrier on one counter that each CTA bumps once (release): wait until it holds gridDim.x,
// polling with acquire loads for at most limit_ns (the EP1 count barrier: dispatch_pull).
// False after the timeout (kErrTimeoutCounts raised for `role`, observed = the CTAs in) or when
// another error aborted the call.
__device__ __forceinline__ bool wait_counts_ready(const Params& p, const unsigned long long* ready, uint32_t role,
                                                  int64_t limit_ns) {
    unsigned long long v = ld_acquire_u64(ready);
    if (v == gridDim.x) return true;
    Deadline d(limit_ns);
    while ((v = ld_acquire_u64(ready)) != gridDim.x) {
        if (!d.tick(p)) {
            if (!aborted(p)) raise_error(p, kErrTimeoutCounts, role, -1, -1, -1, -1, (uint32_t)v);
            return false;
        }
    }
    return true;
}

// ---------------------------------------------------------------- mbarrier
__device__ __forceinline__ uint32_t smem_u32(const void* ptr) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(smem_u32(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
    asm volatile("{\n .reg .b64 st;\n mbarrier.arrive.release.cta.shared::cta.b64 st, [%0];\n}"
                 :: "r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ bool mbar_try_wait(uint64_t* bar, uint32_t parity) {
    uint32_t ok;
    asm volatile("{\n .reg .pred P;\n mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 P, [%1], %2;\n"
                 " selp.u32 %0, 1, 0, P;\n}" : "=r"(ok) : "r"(smem_u32(bar)), "r"(parity) : "memory");
    return ok != 0;
}
// The same with a suspend-time hint: the warp sleeps in hardware until the phase completes
// or about `kMbarSuspendNs` passed, instead of spinning on the issue slots.
constexpr uint32_t kMbarSuspendNs = 20000;
__device__ __forceinline__ bool mbar_try_wait_suspend(uint64_t* bar, uint32_t parity) {
    uint32_t ok;
    asm volatile("{\n .reg .pred P;\n mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 P, [%1], %2, %3;\n"
                 " selp.u32 %0, 1, 0, P;\n}" : "=r"(ok) : "r"(smem_u32(bar)), "r"(parity), "n"(kMbarSuspendNs) : "memory");
    return ok != 0;
}
// A shared-memory pipeline wait is downstream of the waits that feed the ring (arrival
// counts, arrival masks, expert counts): it waits 1.5x the timeout, so that when a block's
// data never comes, the wait that names the cause (started at about the same time) raises
// the error first. (The final grid sync waits 2x.)
__device__ __forceinline__ int64_t pipeline_timeout_ns(const Params& p) { return p.timeout_ns + p.timeout_ns / 2; }
// Wait until ready(again) holds: one try at once (again = false), then tries until the
// pipeline timeout (again = true); false on timeout/abort (error raised, `info` its payload).
template <class Ready>
__device__ __forceinline__ bool pipeline_wait(const Params& p, Ready ready, uint32_t role, uint32_t info) {
    if (ready(false)) return true;
    Deadline d(pipeline_timeout_ns(p));
    while (!ready(true)) {
        if (!d.tick(p)) {
            if (!aborted(p)) raise_error(p, kErrTimeoutPipeline, role, -1, -1, -1, -1, info);
            return false;
        }
    }
    return true;
}
// Wait for the phase with `parity` to complete (the retries suspend: mbar_try_wait_suspend).
__device__ __forceinline__ bool mbar_wait(const Params& p, uint64_t* bar, uint32_t parity, uint32_t role) {
    return pipeline_wait(p, [&](bool again) { return again ? mbar_try_wait_suspend(bar, parity) : mbar_try_wait(bar, parity); },
                         role, parity);
}

// ---------------------------------------------------------------- named barriers
// Non-aligned form: threads of a warp may arrive diverged (after per-thread spin waits).
__device__ __forceinline__ void named_bar_sync(uint32_t id, uint32_t threads) {
    __syncwarp();
    asm volatile("barrier.sync %0, %1;" :: "r"(id), "r"(threads) : "memory");
}

// Arrive at a named barrier without waiting for it (the other threads' barrier.sync counts it).
__device__ __forceinline__ void named_bar_arrive(uint32_t id, uint32_t threads) {
    __syncwarp();
    asm volatile("barrier.arrive %0, %1;" :: "r"(id), "r"(threads) : "memory");
}

// Named barrier that also ANDs a predicate over the participating threads: every thread
// gets the same answer (so a role can leave early only all together, never stranding the
// others at a later named barrier).
__device__ __forceinline__ bool named_bar_and(uint32_t id, uint32_t threads, bool pred) {
    uint32_t out;
    __syncwarp();
    asm volatile("{\n .reg .pred p, q;\n setp.ne.u32 p, %1, 0;\n barrier.red.and.pred q, %2, %3, p;\n"
                 " selp.u32 %0, 1, 0, q;\n}" : "=r"(out) : "r"((uint32_t)pred), "r"(id), "r"(threads) : "memory");
    return out != 0;
}

// ---------------------------------------------------------------- cp.async (sm_80+)
__device__ __forceinline__ void cp_async_16_cg(void* smem, const void* gmem) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(smem_u32(smem)), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory"); }

// ---------------------------------------------------------------- TMA (sm_90+)
// Arrive on `bar` (one of its expected arrivals) and add `bytes` to the transaction count the
// phase waits for: the TMA copies issued against `bar` complete them (complete_tx::bytes).
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
    asm volatile("{\n .reg .b64 st;\n mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 st, [%0], %1;\n}"
                 :: "r"(smem_u32(bar)), "r"(bytes) : "memory");
}
// Global memory written through the generic proxy (st.global) and read by TMA (the async
// proxy) in another CTA: the writer fences before its release, the reader after its acquire
// (PTX ISA, memory consistency model: proxies).
__device__ __forceinline__ void fence_proxy_async_global() {
    asm volatile("fence.proxy.async.global;" ::: "memory");
}

// ---------------------------------------------------------------- grid sync
// One 32-bit counter: CTA 0 adds 0x80000000-(n-1), the others add 1, so bit 31 flips once
// all n CTAs arrived; the counter needs no reset between launches. Its only use is the last
// wait of the kernel, downstream of every other one, so it waits twice the timeout: a CTA
// that finished early must not time out before the wait that is stuck names the cause.
__device__ __forceinline__ bool grid_sync(const Params& p, uint32_t role) {
    bool ok = true;
    if (threadIdx.x == 0) {
        __threadfence();
        const uint32_t n = gridDim.x;
        const uint32_t add = blockIdx.x == 0 ? 0x80000000u - (n - 1) : 1u;
        const uint32_t old = atomicAdd(p.grid_sync, add);
        if (((ld_acquire_u32(p.grid_sync) ^ old) & 0x80000000u) == 0) {
            Deadline d(2 * p.timeout_ns);
            while (((ld_acquire_u32(p.grid_sync) ^ old) & 0x80000000u) == 0) {
                if (!d.tick(p)) {
                    if (!aborted(p)) raise_error(p, kErrTimeoutGridSync, role, -1, -1, -1, -1, old);
                    ok = false;
                    break;
                }
            }
        }
    }
    return ok;
}

// ---------------------------------------------------------------- NVLink barrier (EP)
// Peers' copies of a symmetric-buffer field: same layout on every rank, so base + offset.
__device__ __forceinline__ uint8_t* peer_ptr(const Params& p, int r, int64_t off) {
    return reinterpret_cast<uint8_t*>(__ldg(p.peer_base + r)) + off;
}
__device__ __forceinline__ unsigned long long ld_acquire_sys_u64(const unsigned long long* p) {
    unsigned long long v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void red_release_sys_add_u64(unsigned long long* p, unsigned long long v) {
    asm volatile("red.release.sys.global.add.u64 [%0], %1;" :: "l"(p), "l"(v) : "memory");
}

// This call's number: the calls this rank completed + 1, kept in device memory (so a CUDA
// graph of the call replays correctly). Every CTA reads it before it arrives at a barrier,
// and CTA 0 adds one only after the last barrier has seen every CTA of every rank arrive, so
// all CTAs of a call read the same number.
__device__ __forceinline__ int64_t call_epoch(const Params& p) {
    int64_t v;
    asm volatile("ld.relaxed.gpu.global.s64 %0, [%1];" : "=l"(v) : "l"(p.epoch_counter) : "memory");
    return v + 1;
}

// One CTA's arrival at NVLink barrier `which` (1 = after the source-index exchange, 2 = before
// combine) and its wait for every CTA of every rank. Called by ONE thread per CTA after the
// arriving threads made their stores visible (__threadfence_system + a CTA barrier). Each rank
// keeps flag[j] = arrivals of rank j's CTAs, monotonic over calls: barrier `which` of call
// `epoch` completes when flag[j] >= (2*(epoch-1) + which) * CTAs for every j (this rank
// included, so it is also the grid sync). Gives up after timeout_ns with kErrTimeoutNvlBarrier
// naming this rank, the barrier and the first rank that did not arrive.
__device__ __forceinline__ bool nvl_barrier(const Params& p, int which, uint32_t role) {
    const int R = (int)p.num_ranks, me = (int)p.rank;
    const unsigned long long n = gridDim.x;
    const unsigned long long target = (unsigned long long)(2 * (call_epoch(p) - 1) + which) * n;
    __threadfence_system();
    for (int j = 0; j < R; ++j)
        red_release_sys_add_u64(reinterpret_cast<unsigned long long*>(peer_ptr(p, j, p.off_flag)) + me, 1ull);
    const unsigned long long* mine = reinterpret_cast<const unsigned long long*>(peer_ptr(p, me, p.off_flag));
    for (int j = 0; j < R; ++j) {
        unsigned long long v = ld_acquire_sys_u64(mine + j);
        if (v >= target) continue;
        Deadline d(p.timeout_ns);
        while ((v = ld_acquire_sys_u64(mine + j)) < target) {
            if (!d.tick(p)) {
                if (!aborted(p)) raise_error(p, kErrTimeoutNvlBarrier, role, which, me, j, -1, (uint32_t)(v + n - target));
                return false;
            }
        }
    }
    return true;
}

// ---------------------------------------------------------------- debug progress
__device__ __forceinline__ void progress(const Params& p, int slot, uint32_t v) {
    if (p.progress != nullptr) *reinterpret_cast<volatile uint32_t*>(p.progress + blockIdx.x * 32 + slot) = v;
}

// ---------------------------------------------------------------- trace
// 48-byte record: u32 sm, u32 (role<<16|kind), i32 expert, m_block, n_block, wave, tokens,
// extra, u64 t_start_ns, u64 t_end_ns (globaltimer).
// Slots for n records of this CTA, from trace_count[block]. Issued early (e.g. when a block
// starts) the atomic's round trip overlaps the block's work instead of stalling the recording
// warp at its end. Only one thread per role reserves, but ptxas turns an atomic on a
// warp-uniform address into a warp-aggregated one (elect a leader, shuffle the result to the
// warp), and that shuffle waited for the round trip (~1 us under load) at once, at every block
// start. So the address carries lane & (trace_cap >> 62): 0 for every real capacity, but not
// provably uniform, and the atomic stays a plain one (kernel v7.2, benchmarks/NOTES_kernel.md).
__device__ __forceinline__ uint32_t trace_reserve(const Params& p, uint32_t n) {
    uint32_t lane;
    asm("mov.u32 %0, %%laneid;" : "=r"(lane));
    return atomicAdd(p.trace_count + blockIdx.x + (lane & (uint32_t)((uint64_t)p.trace_cap >> 62)), n);
}
__device__ __forceinline__ void trace_write(const Params& p, uint32_t idx, uint32_t role, uint32_t kind, int expert,
                                            int m, int n, int wave, int tokens, uint64_t t0, uint64_t t1) {
    if (idx >= (uint32_t)p.trace_cap) return;
    uint32_t* rec = reinterpret_cast<uint32_t*>(p.trace + ((size_t)blockIdx.x * p.trace_cap + idx) * 6);
    uint4 a = make_uint4(smid(), (role << 16) | kind, (uint32_t)expert, (uint32_t)m);
    uint4 b = make_uint4((uint32_t)n, (uint32_t)wave, (uint32_t)tokens, blockIdx.x);
    *reinterpret_cast<uint4*>(rec) = a;
    *reinterpret_cast<uint4*>(rec + 4) = b;
    *reinterpret_cast<uint2*>(rec + 8) = make_uint2((uint32_t)t0, (uint32_t)(t0 >> 32));
    *reinterpret_cast<uint2*>(rec + 10) = make_uint2((uint32_t)t1, (uint32_t)(t1 >> 32));
}
// Whether this thread's role records, in an instance compiled with or without trace code: TR =
// false instances (the SM90 kernel's untraced launches, kernel v9.13) hold none of it, neither
// the slot atomics nor the records' clock reads; TR = true records when the launch passes a
// capacity. trace_clock is a record's time stamp (0 where no record is written).
template <bool TR>
__device__ __forceinline__ bool trace_on(const Params& p) { return TR && p.trace_cap > 0; }
template <bool TR>
__device__ __forceinline__ uint64_t trace_clock() {
    if constexpr (TR) return globaltimer();
    else return 0;
}
__device__ __forceinline__ void trace_record(const Params& p, uint32_t role, uint32_t kind, int expert, int m,
                                             int n, int wave, int tokens, uint64_t t0, uint64_t t1) {
    if (p.trace_cap == 0) return;
    trace_write(p, trace_reserve(p, 1), role, kind, expert, m, n, wave, tokens, t0, t1);
}

}  // namespace megamoe
