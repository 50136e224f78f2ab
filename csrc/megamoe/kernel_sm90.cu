// megamoe: the persistent FP8 x FP4 MoE mega-kernel for SM90 (H100/H200), EP = 1 or R ranks
// (expert parallelism over NVLink: dispatch_role_ep, the L2 write-back and NVLink barriers).
//
// One launch, one CTA per SM, 512 threads in three warp-specialized roles:
//   warps 0-3   dispatch : count items per expert, publish counts, pull rows + scales into
//                          the expert-contiguous L1 pool, bump per-pool-block arrival counts;
//                          at the end grid sync + combine (all 16 warps help).
//   warps 4-7   producer : the K blocks of a `num_stages` ring, round-robin over four warps
//                          (two at block_m 128; the others only lend registers); lane 0 of
//                          the K block's warp issues its TMA loads: the token tile (pool rows,
//                          a 2-D tensor map with the 128-byte swizzle WGMMA reads), its FP32
//                          scales, and the packed E2M1 weight tile + scales (bulk copies of the
//                          contiguous tiles of megamoe.layouts.transform_weights_for_sm90);
//                          each stage's full barrier completes when the bytes land
//                          (complete_tx). Each producer warp waits on its free stages, the
//                          arrival counts (L1) and arrival masks (L2, per K block).
//   warps 8-15  consumer : the matrix path (mma_sm90.cuh: E2M1 -> E4M3 decode into WGMMA
//                          registers, FP8 WGMMA, FP32 promotion) and both epilogues (SwiGLU +
//                          clamp + top-k weight + per-32 UE8M0 requantization into the L2
//                          pool and the arrival-mask bit; BF16 rows into the combine buffer).
// The block order is the scheduler's (scheduler.cuh, DeepGEMM MegaMoEScheduler rule).
#include <cuda.h>  // CUtensorMap (types only: the encoder comes through cudaGetDriverEntryPointByVersion)
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <stdint.h>
#include <string.h>
#include <type_traits>  // std::integral_constant (at_block_m)
#include "params.h"
#include "common.cuh"
#include "scheduler.cuh"
#include "fp4.cuh"
#include "mma_sm90.cuh"
#include "roles_shared.cuh"
#include <cute/arch/copy_sm90_desc.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/arch/cluster_sm90.hpp>  // elect_one_sync

namespace megamoe {

// The kernel's one parameter: the plan and buffers (Params, mirrored by ctypes) and the two
// TMA descriptors of the token tiles, encoded by the host launcher from Params (pool address,
// rows, K, block_m): L1 pool [pool_rows, H] and L2 pool [pool_rows, I], box 128 B x block_m
// rows, 128-byte swizzle (the layout of the WGMMA shared-memory descriptor, mma_sm90.cuh).
struct Sm90Args {
    CUtensorMap pool_map[2];
    Params p;
};

constexpr int kThreads = 512;
constexpr int kDispatchThreads = 128, kProducerThreads = 128, kConsumerThreads = 256;
constexpr int kConsumerWarps = 8;
// Register split per warpgroup (setmaxnreg), chosen by timing on the H200 (benchmarks/NOTES_kernel.md):
// 64/96/176 while the producer copied with cp.async; 64/48/200 with one TMA producer lane
// (-2..-4% at block_m 128); 64/64/192 since v6.3: on 48 registers the producer's per-K-block
// path reloaded ~14 spilled values (the decode and direct token scales of v6.3 were +3..+5%
// slower at 16-256 tokens on 48 and -7..-10% faster on 64).
constexpr uint32_t kRegsEven = 128, kRegsDispatch = 64, kRegsProducer = 64, kRegsConsumer = 192;
static_assert(kRegsDispatch + kRegsProducer + 2 * kRegsConsumer == 4 * kRegsEven, "register split");
// Two CTAs per SM (kernel v9.2; the CTAS = 2 instance, block_m 16 without the wide walk, EP1;
// mirrored by megamoe.design_sm90.ctas_per_sm and PAIR_REGS): that instance's whole kernel used 76
// registers at the consumers' 192, so two CTAs of 512 threads fit one SM's 65536 registers at 64
// per thread. __maxnreg__(64) keeps the block_m 16 K loop's SASS (152 instructions); the
// __launch_bounds__(512, 2) form of the same cap took the shared base out of the uniform
// registers (170). The split 48 / 48 / 80 (kernel v9.6; 32 / 64 / 80 until v9.5, where the
// dispatch warps' pull spilled and a one-item pull took 5-9 us against 3.2 at one CTA): 0.978 /
// 0.981 / 0.990 / 0.997 of v9.5's time at 3 / 6 / 12-16 / 64-256 tokens on the H200
// (benchmarks/NOTES_kernel.md, session 40). Twice the consumer warps per scheduler hide the K
// loop's latency: 0.89x the one-CTA time at 64-512 tokens on the H200.
constexpr uint32_t kRegsPairDispatch = 48, kRegsPairProducer = 48, kRegsPairConsumer = 80;
template <int CTAS> struct RegSplit {
    static constexpr uint32_t even = kRegsEven / CTAS;
    static constexpr uint32_t dispatch = CTAS == 1 ? kRegsDispatch : kRegsPairDispatch;
    static constexpr uint32_t producer = CTAS == 1 ? kRegsProducer : kRegsPairProducer;
    static constexpr uint32_t consumer = CTAS == 1 ? kRegsConsumer : kRegsPairConsumer;
    static_assert(dispatch + producer + 2 * consumer == 4 * even, "register split");
};
template <uint32_t R> __device__ __forceinline__ void setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" :: "n"(R)); }
template <uint32_t R> __device__ __forceinline__ void setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" :: "n"(R)); }
constexpr uint32_t kBarDispatch = 1, kBarConsumer = 2, kBarProducer = 3;
// The one-CTA wide instance at one rank (1-2 tokens on V4-Flash, kernel v9.11): its producer warps
// take the counts from their own CTA's hist[] (dispatch_pull's LOCAL count: every CTA counts every
// item) at named barrier kSharedBarCounts, instead of polling, one expert counter after another,
// the copy CTA 0 publishes in global memory. Measured on the H200 against v9.10 (CUPTI kernel
// time, crossover rounds): 0.971 at 1 token; the same in the two-CTA wide instance read 1.001-1.010
// at 3-16 tokens, and with the consumers reading them too 0.989 at 1 token (their K loop re-laid
// out), so neither (benchmarks/NOTES_kernel.md, session 44).
constexpr int kCountsBarThreads = kDispatchThreads + kProducerThreads;
constexpr uint32_t kHistOffset = 1024;  // the dispatch scratch (hist[E], ...) after the barrier kilobyte
template <bool WIDE, int CTAS>
__host__ __device__ constexpr bool counts_from_shared() { return WIDE && CTAS == 1; }
constexpr int kL1EpilogueBarriers = 4;  // the kBarConsumer barriers of one L1 epilogue (consumer_role)
static_assert(kDispatchThreads == kSharedDispatchThreads && kBarDispatch == kSharedBarDispatch,
              "the dispatch warps run roles_shared.cuh's count_items / dispatch_pull with its barrier");

__host__ __device__ constexpr size_t align128(size_t x) { return (x + 127) & ~size_t(127); }
constexpr int kMaxStages = 16;
constexpr uint32_t kFoldTableOffset = 2 * kMaxStages * 8;  // the fold table (fp4.cuh) after the full/empty barriers
static_assert(kFoldTableOffset + kFoldTableBytes <= kHistOffset, "fold table inside the barrier kilobyte");
constexpr uint32_t kTraceScratchOffset = 416;  // the producer's pending idle-wait times (4 x u64)
static_assert(kTraceScratchOffset >= kFoldTableOffset + kFoldTableBytes && kTraceScratchOffset + 32 <= kHistOffset,
              "trace scratch after the fold table, inside the barrier kilobyte");

// The release relay (kernel v8.1): once the dispatch warps have pulled every row, one dispatch
// lane takes over the L1 epilogue's GPU-scope release of the arrival-mask bit, so that the
// consumer thread that did it (and its warpgroup, at its next WGMMA) no longer waits for the
// release's memory fence. A ring of kRelaySlots requests in the barrier kilobyte: a request is
// pool_block * 64 + n_block (the mask is 64 bits wide), kRelayDone ends the ring. The consumer
// writes it and arrives on the slot's full barrier (release.cta: its block's stores, ordered
// before it by the consumers' named barrier, come with it); the dispatch lane waits on it
// (acquire.cta), releases the bit at GPU scope (cumulative, so those stores are visible to
// whoever acquires the bit), and frees the slot. Before the pull ends the consumer releases
// itself (`on` not yet set): a release must not wait for the pull. `on` is written and read
// with shared-memory atomics (either order is correct; a build with plain accesses had one
// racecheck hazard, this one none). Only at block_m 16 (relay_release<BM>()): against v8.0 on
// the H200 a first build with the relay at every block_m read 0.961-0.971 of its time at
// 16-256 tokens (block_m 16), 1.002 at 1024 (32) and 1.010-1.011 at 4096 / 8192 (128); this
// one 0.960-0.969 at 16-512 tokens, the other instances' SASS v8.0's (benchmarks/NOTES_kernel.md,
// session 21). Mirrored by design_sm90.RELAY_RELEASE.
template <int BM>
__host__ __device__ constexpr bool relay_release() { return BM == 16; }
// The ring's first fill paced by arrivals (kernel v9.8): during the call's first S K blocks a
// producer warp issues K block it only once stage it - F has landed, F = first_fill_per_sm<BM>() /
// CTAs per SM (0: the whole ring at once, as before). Before, every CTA issued its whole ring at
// once (at two CTAs per SM 264 x 8 stages of ~11 KB with their token tiles and scales, ~24 MB over
// the H200), and each SM's first MMA started 3.3-5 us after the first issue in kernel v9.7's
// 3-16-token traces; that the burst is the cause is the A/B's reading, the traces do not isolate
// it. Four stages per SM in flight (~6 MB over the H200) measured against v9.7 (CUPTI kernel time,
// 8 crossover rounds, outputs bitwise): 0.972 / 0.974 / 0.982 / 0.983 / 0.987 / 0.994 / 0.996 at
// 1 / 3 / 6 / 8 / 12 / 16 / 64 tokens; eight per SM 0.976-0.998.
// At every block_m both read 1.016-1.017 at 1024 tokens (block_m 32) with the same K loop count,
// a layout cost of the instance, not of a start-up pacing (27 us of 1580), and 1.000 at 4096: so
// only at block_m 16, the other instances' SASS v9.7's (benchmarks/NOTES_kernel.md, session 42).
// Mirrored by megamoe.design_sm90.FIRST_FILL_PER_SM.
template <int BM>
__host__ __device__ constexpr int first_fill_per_sm() { return BM == 16 ? 4 : 0; }
// Where the consumers walk to their next block (kernel v9.0): at block_m >= 32 inside the
// epilogue, right after its first global loads are issued, so that the walk's dependent chain
// (shuffles, a ballot, an integer division) runs during their round trip; at block_m 16 after
// the epilogue, as before. Measured on the H200 (CUPTI kernel time against v8.9, 8 crossover
// rounds): 0.968 at 1024 tokens (block_m 32), 0.972 / 0.973 at 4096 / 8192 (128), 0.994-1.006 at
// 1-64 (16). With the walk in the epilogue at block_m 16 as well: 1.000 at 16-256 and 1.012 /
// 1.037 at 4 / 1 tokens (the wide instance). The gain comes with this SASS, not with the walk's
// place alone: a form with the trace's wave number computed at the block's start read 1.011 at
// 1024 tokens and 0.976 at 4096 / 8192. The block order is unchanged
// (benchmarks/NOTES_kernel.md, session 35).
template <int BM>
__host__ __device__ constexpr bool walk_in_epilogue() { return BM >= 32; }
// Whether the consumers take their blocks from the producer's block descriptors instead of walking
// the scheduler themselves (kernel v9.1, block_m 16; see read_desc): the walk (~190 instructions
// of dependent shuffles, a ballot and divisions) cost each consumer block ~0.4-0.8 us wherever it
// ran. Measured on the H200 against v9.0 (CUPTI kernel time, 8 crossover rounds): 0.909-0.914 at
// 16-256 tokens, 0.929 at 4, 0.989 at 1. At every block_m: 1.007 / 1.020 / 1.011 at 1024 / 4096 /
// 8192 tokens (the block_m 32 K loop grew by 18 instructions: the shared-memory base left the
// uniform registers), so the consumers at block_m >= 32 keep walking inside the epilogue. Mirrored
// by design_sm90.BLOCK_DESCRIPTORS (benchmarks/NOTES_kernel.md, session 36).
template <int BM>
__host__ __device__ constexpr bool block_descriptors() { return BM == 16; }
// Whether untraced launches run an instance of their own, without any trace code (kernel v9.13),
// and the traced instance's consumer writes its records from the top of the CTA's buffer with no
// atomic (consumer_role). Measured against v9.12 (untraced, CUPTI kernel time, 6 crossover
// rounds, outputs bitwise equal): 0.946 / 0.974 at 2 / 1 tokens, 0.990-0.993 at 16-256 (block_m
// 16), 0.980 at 2048 / 2730 (64), 0.987-0.990 at 4096 / 8192 (128), and traced over untraced
// +1.7-2.0% at 5 stages at block_m 128 (v9.12: +4.3-4.5%). Not at block_m 32: there both new
// instances read 1.06-1.08, and the traced one ran 5.5% faster with its consumer's record stores
// than without them (probe PC), so block_m 32 keeps v9.12's one instance, its run-time trace test
// and its per-block slot atomic (its SASS v9.12's). Mirrored by design_sm90.UNTRACED_INSTANCE
// (benchmarks/NOTES_kernel.md, session 55).
template <int BM>
__host__ __device__ constexpr bool untraced_instance() { return BM != 32; }
constexpr uint32_t kRelayOffset = 448;
constexpr int kRelaySlots = 16;
constexpr uint32_t kRelayDone = 0xFFFFFFFFu;
struct Relay {
    uint64_t full[kRelaySlots];   // the consumer's request arrived (count 1)
    uint64_t empty[kRelaySlots];  // the dispatch lane took it (count 1)
    uint32_t req[kRelaySlots];
    uint32_t on;                  // set by the dispatch lane once it serves
    uint32_t sent;                // requests sent so far (the consumer's thread 0 only)
};
static_assert(kRelayOffset >= kTraceScratchOffset + 32 && kRelayOffset % 8 == 0 && kRelayOffset + sizeof(Relay) <= kHistOffset,
              "release relay after the trace scratch, inside the barrier kilobyte");
constexpr uint32_t kDescOffset = 784;  // the block descriptors: 3 x kMaxStages u32 (block_descriptors)
static_assert(kDescOffset >= kRelayOffset + sizeof(Relay) && kDescOffset + 3 * kMaxStages * 4 <= kHistOffset,
              "block descriptors after the relay, inside the barrier kilobyte");
// Two CTAs per SM (blocks by ticket, kernel v9.3): the producer's ticket broadcast (2 x u32), its
// log of the phases of the blocks it took (16 x u8, block j at j % 16) and the log's length (u32)
constexpr uint32_t kTicketOffset = 976, kBlockLogOffset = 984, kBlockLogLenOffset = 1000;
static_assert(kTicketOffset >= kDescOffset + 3 * kMaxStages * 4 && kBlockLogOffset >= kTicketOffset + 8 &&
              kBlockLogLenOffset >= kBlockLogOffset + 16 && kBlockLogLenOffset + 4 <= kHistOffset,
              "block tickets and their log after the descriptors, inside the barrier kilobyte");
__device__ __forceinline__ Relay* relay_of(uint64_t* full) {
    return reinterpret_cast<Relay*>(reinterpret_cast<uint8_t*>(full) + kRelayOffset);
}
// One request (the consumer's thread 0). Waits for its slot only if the dispatch lane is
// kRelaySlots requests behind; false if that wait failed (error raised or seen).
__device__ __forceinline__ bool relay_send(const Params& p, Relay* r, uint32_t q) {
    const uint32_t n = r->sent;
    const uint32_t slot = n % kRelaySlots;
    if (n >= (uint32_t)kRelaySlots && !mbar_wait(p, &r->empty[slot], ((n / kRelaySlots) + 1) & 1u, kRoleConsumer))
        return false;
    r->req[slot] = q;
    r->sent = n + 1;
    mbar_arrive(&r->full[slot]);
    return true;
}
// The L1 epilogue's release of its arrival-mask bit: relayed once the dispatch lane serves.
__device__ __noinline__ void release_mask_bit(const Params& p, Relay* r, int pool_block, int n_block) {
    if (atomicOr(&r->on, 0u) == 0u || !relay_send(p, r, (uint32_t)pool_block * 64u + (uint32_t)n_block))
        red_release_or_u64(p.mask + pool_block, 1ull << n_block);
}
// The dispatch lane after the pull: serve requests until kRelayDone (or a failed wait).
__device__ __noinline__ void relay_serve(const Params& p, Relay* r) {
    atomicOr(&r->on, 1u);
    for (uint32_t k = 0;; ++k) {
        const uint32_t slot = k % kRelaySlots;
        if (!mbar_wait(p, &r->full[slot], (k / kRelaySlots) & 1u, kRoleDispatch)) return;
        const uint32_t q = *reinterpret_cast<volatile uint32_t*>(&r->req[slot]);
        if (q == kRelayDone) return;
        red_release_or_u64(p.mask + (q >> 6), 1ull << (q & 63u));
        mbar_arrive(&r->empty[slot]);
    }
}

// Shared-memory layout (mirrored by megamoe.design_sm90.smem_bytes). Every stage starts on a
// 1024-B boundary, and so does its shared-memory WGMMA operand (the token tile): the 128-byte
// swizzle atoms of the descriptor (mma_sm90.cuh) must be 1024-B aligned. The weights stay
// packed in the stage (the consumers decode them into registers).
__host__ __device__ constexpr size_t align1024(size_t x) { return (x + 1023) & ~size_t(1023); }
__host__ __device__ constexpr size_t stage_bytes(int bm) {
    // a [bm][128] | bpk [128][64] | sfb [128][4] | fsx f32 [2][bm] (the token scales per 64-K group)
    return align1024((size_t)bm * 128 + 8192 + 512 + (size_t)bm * 8);
}
__host__ __device__ constexpr size_t fixed_bytes(int bm, int num_experts) {
    // barriers + fold table (kFoldTableOffset) | dispatch scratch | the L1 epilogue's scratch
    // `red` [20][bm] f32: per-warp amax [8][bm], then the tokens' scales [4][bm] in rows 0-3 and
    // the block's L2-pool tile [bm][64] bytes in rows 4-19
    return align1024(kHistOffset + align128((size_t)num_experts * 12 + 64) + align128((size_t)20 * bm * 4));
}
__host__ __device__ constexpr size_t smem_bytes(int bm, int stages, int num_experts) {
    return fixed_bytes(bm, num_experts) + (size_t)stages * stage_bytes(bm);
}

struct Stage {
    uint8_t *a, *bpk, *sfb;
    float* fsx;
};
template <int BM>
__device__ __forceinline__ Stage get_stage(uint8_t* base, int s) {
    Stage st;
    st.a = base + (size_t)s * stage_bytes(BM);
    st.bpk = st.a + BM * 128;
    st.sfb = st.bpk + 8192;
    st.fsx = reinterpret_cast<float*>(st.sfb + 512);
    return st;
}

// ------------------------------------------------------------------ EP dispatch (warps 0-3, R > 1)
// Source side: count this CTA's items per (global) expert, publish the per-CTA histogram and a
// 64-bit count (CTAs << 32 | items), wait for every CTA of this rank, then write each item's
// token*K+slot into its owner's source-index table at its position in this rank's ascending
// list for the expert (prefix of earlier CTAs' counts + in-CTA rank); CTA 0 writes the per-expert
// send counts into the owners' recv_count. NVLink barrier 1. Owner side: receive counts ->
// per-local-expert item and pool-block offsets -> counts for the scheduler; then pull every pool
// position of the local experts in the plan's round-robin min-remaining order over source ranks
// (megamoe.plan.pull_order), reading rows, scales and top-k weights from the source rank's
// symmetric buffer over NVLink and recording the token source metadata (rank, token, slot).
// Inlined into the one kernel function (a separate function would add a ptxas entry); its loops
// are kept small (no unrolled round-robin, one 16-B copy per lane in flight x4) because every
// register it holds raises the kernel's spills (ptxas allocates one budget for all roles).
template <bool TR>
__device__ __forceinline__ void dispatch_role_ep(const Params& p, const int BM, int* hist, int* cta_base, int* off_blk,
                                              int* scan) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int T = (int)p.num_tokens, K = (int)p.topk, E = (int)p.num_experts, H = (int)p.hidden;
    const int R = (int)p.num_ranks, me = (int)p.rank, EL = E / R;
    const int cap = (int)p.combine_rows;  // source-index capacity per (local expert, source rank)
    const int c = blockIdx.x;
    const int2 tr = cta_range(T);  // this CTA's tokens; its items (token, slot) in token order
    const int i0 = tr.x * K, i1 = tr.y * K;
    const bool trace = trace_on<TR>(p) && tid == 0;

    // 1. count (as EP1): in-order rank of each item among this CTA's items of the same expert.
    uint64_t ts = trace_clock<TR>();
    count_items(p, hist, i0, i1);
    // 2. publish this CTA's histogram, then the count (release through the fence + atomic).
    for (int e = tid; e < E; e += kDispatchThreads) {
        p.cta_hist[(size_t)c * E + e] = hist[e];
        __threadfence();
        atomicAdd(p.send_count + e, (1ull << 32) | (unsigned long long)(uint32_t)hist[e]);
    }
    if (trace) trace_record(p, kRoleDispatch, kKindCount, -1, -1, -1, -1, i1 - i0, ts, globaltimer());
    // 3. wait for every CTA of this rank; this CTA's base = items of earlier CTAs (ascending order).
    ts = trace_clock<TR>();
    for (int e = tid; e < E; e += kDispatchThreads) {
        unsigned long long v;
        wait_published(p, p.send_count + e, v, e, kRoleDispatch, p.timeout_ns);
        const int total = (int)(uint32_t)v;
        cta_base[e] = 0;
        if (total > cap) raise_error(p, kErrSrcOverflow, kRoleDispatch, e, me, -1, -1, (uint32_t)total);
        if (c == 0) {  // send counts into the owner's receive table
            const int dst = e / EL, el = e - dst * EL;
            reinterpret_cast<int32_t*>(peer_ptr(p, dst, p.off_recv_count))[el * R + me] = total;
        }
    }
    named_bar_sync(kBarDispatch, kDispatchThreads);
    // The base is a sum over the c earlier CTAs' histogram rows, latency-bound (one L2 round
    // trip per few rows): with E % 4 == 0 a thread reads four experts per 16-byte load and the
    // threads left over (E / 4 < 128) split the rows between them; integer partial sums meet
    // in shared memory (any order: the same result).
    {
        const int vec = (E & 3) == 0 ? 4 : 1, cols = E / vec;
        const int groups = max(1, kDispatchThreads / cols), g = tid / cols;
        for (int q = tid - g * cols; g < groups && q < cols; q += kDispatchThreads) {
            int4 acc = make_int4(0, 0, 0, 0);
            if (vec == 4) {
                const int4* col = reinterpret_cast<const int4*>(p.cta_hist) + q;
                #pragma unroll 8
                for (int c2 = g; c2 < c; c2 += groups) {
                    const int4 h = __ldcg(col + (size_t)c2 * cols);
                    acc.x += h.x; acc.y += h.y; acc.z += h.z; acc.w += h.w;
                }
                atomicAdd(cta_base + 4 * q, acc.x); atomicAdd(cta_base + 4 * q + 1, acc.y);
                atomicAdd(cta_base + 4 * q + 2, acc.z); atomicAdd(cta_base + 4 * q + 3, acc.w);
            } else {
                #pragma unroll 8
                for (int c2 = g; c2 < c; c2 += groups) acc.x += __ldcg(p.cta_hist + (size_t)c2 * E + q);
                atomicAdd(cta_base + q, acc.x);
            }
        }
    }
    named_bar_sync(kBarDispatch, kDispatchThreads);
    // 4. source-index table entries in the owners' symmetric buffers.
    for (int i = i0 + tid; i < i1; i += kDispatchThreads) {
        const int e = p.topk_idx[i];
        if (e < 0 || e >= E) continue;
        const int q = cta_base[e] + p.item_pos[i];
        if (q >= cap) continue;  // overflow already raised
        const int dst = e / EL, el = e - dst * EL;
        reinterpret_cast<int32_t*>(peer_ptr(p, dst, p.off_src_idx))[((size_t)el * R + me) * cap + q] = i;
    }
    __threadfence_system();
    named_bar_sync(kBarDispatch, kDispatchThreads);
    if (trace) trace_record(p, kRoleDispatch, kKindIndexExchange, -1, -1, -1, -1, i1 - i0, ts, globaltimer());
    if (tid == 0) progress(p, 0, 2);
    // 5. NVLink barrier 1: every CTA of every rank wrote its table entries and counts.
    ts = trace_clock<TR>();
    if (tid == 0) nvl_barrier(p, 1, kRoleDispatch);
    named_bar_sync(kBarDispatch, kDispatchThreads);
    if (trace) trace_record(p, kRoleDispatch, kKindNvlBarrier, -1, -1, -1, -1, 1, ts, globaltimer());
    // 6. receive counts [EL][R] -> item offsets (cta_base[0..EL]) and pool-block offsets (off_blk).
    const int32_t* rc = reinterpret_cast<const int32_t*>(peer_ptr(p, me, p.off_recv_count));
    for (int x = tid; x < EL * R; x += kDispatchThreads) hist[x] = __ldcg(rc + x);
    named_bar_sync(kBarDispatch, kDispatchThreads);
    if (warp == 0) {
        const int per = (EL + 31) / 32;
        const int e0 = min(EL, lane * per), e1 = min(EL, e0 + per);
        int li = 0, lb = 0;
        for (int e = e0; e < e1; ++e) {
            int tot = 0;
            for (int s = 0; s < R; ++s) tot += hist[e * R + s];
            li += tot; lb += (tot + BM - 1) / BM;
        }
        int ii = li, ib = lb;
        #pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int vi = __shfl_up_sync(0xffffffffu, ii, o), vb = __shfl_up_sync(0xffffffffu, ib, o);
            if (lane >= o) { ii += vi; ib += vb; }
        }
        int ri = ii - li, rb = ib - lb;
        for (int e = e0; e < e1; ++e) {
            int tot = 0;
            for (int s = 0; s < R; ++s) tot += hist[e * R + s];
            cta_base[e] = ri; off_blk[e] = rb;
            ri += tot; rb += (tot + BM - 1) / BM;
        }
        if (lane == 31) {
            cta_base[EL] = ii;
            scan[0] = ii;
            if ((int64_t)ib * BM > p.pool_rows) raise_error(p, kErrPoolOverflow, kRoleDispatch, -1, ib, -1, -1, (uint32_t)p.pool_rows);
        }
    }
    named_bar_sync(kBarDispatch, kDispatchThreads);
    // counts for the producer/consumer schedulers (high half = CTAs that published, CTA 0 the totals)
    for (int e = tid; e < EL; e += kDispatchThreads)
        atomicAdd(p.expert_count + e, (1ull << 32) | (c == 0 ? (unsigned long long)(uint32_t)(cta_base[e + 1] - cta_base[e]) : 0ull));
    if (tid == 0) progress(p, 0, 4);
    if (aborted(p)) return;

    // 7. pull: this CTA's share of the pool positions, one warp per item.
    ts = trace_clock<TR>();
    const int N = scan[0];
    const int2 jr = cta_range(N);  // this CTA's pool positions
    const int j0 = jr.x, j1 = jr.y;
    const int hv = H / 16;
    const int32_t* tab = reinterpret_cast<const int32_t*>(peer_ptr(p, me, p.off_src_idx));
    for (int j = j0 + warp; j < j1; j += 4) {
        int lo = 0, hi = EL - 1;  // largest local expert whose first item <= j (never an empty one)
        while (lo < hi) { const int mid = (lo + hi + 1) >> 1; if (cta_base[mid] <= j) lo = mid; else hi = mid - 1; }
        const int e = lo, pos = j - cta_base[e];
        // round-robin min-remaining: rounds of L = min remaining over the active ranks, ranks interleaved
        int s = 0, q = 0;
        {
            int off = 0, rem = pos;
            #pragma unroll 1
            for (int round = 0; round < R; ++round) {
                int na = 0, L = 0x7fffffff;
                #pragma unroll 1
                for (int r = 0; r < R; ++r) {
                    const int left = hist[e * R + r] - off;
                    if (left > 0) { ++na; L = min(L, left); }
                }
                if (na == 0) break;
                if (rem < L * na) {
                    int want = rem % na;
                    #pragma unroll 1
                    for (int r = 0; r < R; ++r) {
                        if (hist[e * R + r] - off > 0) { if (want == 0) { s = r; break; } --want; }
                    }
                    q = off + rem / na;
                    break;
                }
                rem -= L * na; off += L;
            }
        }
        const int item = __ldcg(tab + ((size_t)e * R + s) * cap + q);
        if (item < 0 || item >= cap * K) {  // a peer that failed this call: never read outside its buffer
            if (lane == 0) raise_error(p, kErrSrcOverflow, kRoleDispatch, e, s, q, -1, (uint32_t)item);
            continue;
        }
        const int t = item / K, k = item - (item / K) * K;
        const int row = off_blk[e] * BM + pos;
        if (row >= p.pool_rows) continue;  // overflow already raised
        // the row and its scales, folded per 64-K group (128 at block_m >= kL1Fold128BlockM) as
        // they are copied (roles_shared.cuh)
        const uint4* src = reinterpret_cast<const uint4*>(peer_ptr(p, s, p.off_x) + (size_t)t * H);
        uint4* dst = reinterpret_cast<uint4*>(p.l1_pool + (size_t)row * H);
        const uint32_t* sf_src = reinterpret_cast<const uint32_t*>(peer_ptr(p, s, p.off_x_sf) + (size_t)t * (H / 32));
        uint32_t* sf_dst = reinterpret_cast<uint32_t*>(p.l1_pool_sf);
        float* fsx_dst = l1_pool_fsx_row(p, row, BM);
        if (BM >= kL1Fold128BlockM)
            pull_row_fold<true, true>(src, dst, sf_src, sf_dst + row, p.pool_rows, fsx_dst, 2 * p.pool_rows, BM, hv, lane);
        else
            pull_row_fold<true, false>(src, dst, sf_src, sf_dst + row, p.pool_rows, fsx_dst, 2 * p.pool_rows, BM, hv, lane);
        if (lane == 0) {
            p.pool_token[row] = t;
            p.pool_slot[row] = k;
            p.pool_rank[row] = s;
            p.pool_weight[row] = __ldcg(reinterpret_cast<const float*>(peer_ptr(p, s, p.off_topk_w)) + item);
        }
        fence_proxy_async_global();  // the row is read by TMA (the async proxy)
        __syncwarp();
        if (lane == 0 && p.fault_inject != 1) red_release_add_u32(p.arrival + row / BM, 1u);
    }
    if (tid == 0) progress(p, 0, 5);
    if (trace) trace_record(p, kRoleDispatch, kKindPull, -1, -1, -1, -1, j1 - j0, ts, globaltimer());
}

// ------------------------------------------------------------------ block descriptors
// The producer lane that issues a block's first K block writes the block into the descriptor of
// that K block's stage before its arrive on the stage's full barrier (release.cta); the consumers
// read it after their wait on that barrier (acquire.cta), so that only the producer warps walk
// the scheduler. A stage is rewritten only after every consumer warp released it. A descriptor
// with phase kPhaseNone (a plain arrive, no bytes) ends the block list.
// Three words per stage, as three arrays [kMaxStages] u32 in the barrier kilobyte (kDescOffset):
// (phase << 30) | (n_block << 16) | expert, pool_block, (m_block << 8) | valid_m.
__device__ __forceinline__ uint32_t* desc_of(uint64_t* full) {
    return reinterpret_cast<uint32_t*>(reinterpret_cast<uint8_t*>(full) + kDescOffset);
}
__device__ __forceinline__ void write_desc(uint64_t* full, int s, const Block& b) {
    uint32_t* d = desc_of(full);
    d[s] = ((uint32_t)b.phase << 30) | ((uint32_t)b.n_block << 16) | (uint32_t)b.expert;
    d[kMaxStages + s] = (uint32_t)b.pool_block;
    d[2 * kMaxStages + s] = ((uint32_t)b.m_block << 8) | (uint32_t)b.valid_m;
}
__device__ __forceinline__ uint32_t ld_shared_u32(uint32_t addr) {
    uint32_t v;
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(addr) : "memory");
    return v;
}
__device__ __forceinline__ Block read_desc(const Params& p, uint64_t* full, int s) {
    const uint32_t d = smem_u32(desc_of(full)) + 4u * (uint32_t)s;
    // every lane reads the same word: a warp reduction makes the phase and the K-block count
    // warp-uniform for the compiler (uniform registers, no divergence checks in the K loop)
    const uint32_t x = __reduce_or_sync(0xffffffffu, ld_shared_u32(d)), z = ld_shared_u32(d + 8u * kMaxStages);
    Block b;
    b.phase = (int)(x >> 30);
    b.n_block = (int)((x >> 16) & 0x3FFFu);
    b.expert = (int)(x & 0xFFFFu);
    b.pool_block = (int)ld_shared_u32(d + 4u * kMaxStages);
    b.m_block = (int)(z >> 8);
    b.valid_m = (int)(z & 0xFFu);
    b.num_k_blocks = (int)((b.phase == kPhaseL1 ? p.hidden : p.inter) / 128);
    return b;
}

// Two CTAs per SM: the producer's log of the phases of the blocks it took (kPhaseNone: the end),
// block j at j % 16, then the log's length; the consumers read it only after an error.
__device__ __forceinline__ void log_block(uint64_t* full, int j, int phase) {
    uint8_t* base = reinterpret_cast<uint8_t*>(full);
    reinterpret_cast<volatile uint8_t*>(base + kBlockLogOffset)[j & 15] = (uint8_t)phase;
    __threadfence_block();
    *reinterpret_cast<volatile uint32_t*>(base + kBlockLogLenOffset) = (uint32_t)(j + 1);
}

// ------------------------------------------------------------------ producer (warps 4-7)
// NW producer warps share the ring: K block `it` (counted over the whole block list) is
// issued by producer warp it % NW, so the per-K-block work (the free-stage wait, the
// expect_tx and four copy instructions, the L2 mask check) of consecutive K blocks runs on
// different warp schedulers: one warp paced the ring at small block_m (~110 dependent
// instructions per K block; four warps: -11..-16% at 16-256 tokens). At block_m 128 the
// consumers pace the ring and the idle producer warps' instructions cost them issue slots:
// two warps there (four: +1..+1.5% at 4096-8192 tokens; benchmarks/NOTES_kernel.md). Every
// producer warp walks the block list and waits for the arrival counts (L1) itself; lane 0
// issues its K blocks' TMA loads against the stage's full barrier. A block's operand
// addresses are computed once per block (Loads) and the stage index and the free-stage
// wait's parity are kept incrementally.
template <int BM, bool WIDE = false, int CTAS = 1, bool TR = false>
struct Producer {
    static constexpr bool TICKETS = CTAS == 2;  // two CTAs per SM take their blocks by ticket
    static constexpr int NW = BM == 128 ? 2 : 4;
    const Params& p;
    const CUtensorMap* pool_map;
    uint8_t* stages;
    uint64_t *full, *empty;
    int S, ptid, wix;        // wix: this warp's index among the producer warps
    int it = 0;              // K blocks walked so far (by every producer warp)
    int s = 0;               // it % S
    uint32_t round_par = 0;  // (it / S) & 1: a free-stage wait (it >= S) waits for parity round_par ^ 1
    // profile (fault_inject bit 32): SM cycles waiting for a free stage (32 bits: 2.5 s at
    // 1.7 GHz; one register of the producer's 64)
    uint32_t cyc_wait_empty = 0;

    __device__ __forceinline__ Producer(const Params& p_, const CUtensorMap* maps, uint8_t* st, uint64_t* f, uint64_t* e)
        : p(p_), pool_map(maps), stages(st), full(f), empty(e) {
        S = (int)p.num_stages;
        ptid = threadIdx.x - kDispatchThreads;
        wix = ptid >> 5;
    }
    __device__ __forceinline__ bool mine() const { return (it & (NW - 1)) == wix; }
    // The ring's first fill, paced by arrivals (first_fill_per_sm): K block it < S is issued once
    // stage it - kFill has landed (phase 0 of its full barrier; or of its empty barrier, the
    // consumers having released it already, which a warp that fell behind may find instead: that
    // phase cannot complete twice before this K block is issued, so the wait cannot miss it). The
    // tries spin: a suspending try on one barrier could sleep through the other's phase.
    static constexpr int kFill = first_fill_per_sm<BM>() / CTAS;
    __device__ __forceinline__ bool first_fill_wait(int k) {
        return pipeline_wait(p, [&](bool) { return mbar_try_wait(full + k, 0u) || mbar_try_wait(empty + k, 0u); },
                             kRoleProducer, 0u);
    }
    __device__ __forceinline__ void advance() {
        ++it;
        if (++s == S) { s = 0; round_par ^= 1u; }
    }

    // One block's loads: the token tile (2-D tensor map, K coordinate kb * 128), its FP32
    // scales (Params::l1_pool_fsx / l2_pool_fsx: 8 x BM contiguous bytes per K block) and the packed
    // weight tile + scales (contiguous 128-row x 128-K tiles, megamoe.layouts). Few registers:
    // the byte count and the timing bits are re-read from the kernel parameters.
    struct Loads {
        const float* fsx;              // K block 0: the pool block's [2][BM] FP32 token scales
        const uint8_t *w, *wsf;        // K block 0
        int row;                       // first pool row
        bool l1;
    };
    __device__ __forceinline__ Loads loads_of(const Block& b) const {
        const bool l1 = b.phase == kPhaseL1;
        const int kd = l1 ? (int)p.hidden : (int)p.inter;               // K extent of this GEMM
        const int nb = l1 ? 2 * (int)p.inter / 128 : (int)p.hidden / 128;  // N blocks per expert
        const size_t tile0 = ((size_t)b.expert * nb + b.n_block) * (kd / 128);
        const int row = b.pool_block * BM;
        return Loads{(l1 ? p.l1_pool_fsx : p.l2_pool_fsx) + (size_t)row * 2, (l1 ? p.w1 : p.w2) + tile0 * 8192,
                     (l1 ? p.w1_sf : p.w2_sf) + tile0 * 512, row, l1};
    }

    __device__ __forceinline__ bool issue(const Loads& L, int kb, const Block& b) {
        const bool prof = p.fault_inject & 32;
        const uint32_t c0 = prof ? clock32() : 0u;
        if (it >= S) {
            if (!mbar_wait(p, empty + s, round_par ^ 1u, kRoleProducer)) return false;
        } else if (kFill > 0 && it >= kFill && !first_fill_wait(it - kFill)) {
            return false;
        }
        if (prof) cyc_wait_empty += clock32() - c0;
        __syncwarp();
        if ((ptid & 31) == 0) {
            const Stage st = get_stage<BM>(stages, s);
            // timing experiments only (fault_inject bits 8, 64, 128): skip the weight tile, the
            // token tile, the token scales
            const bool weights = !(p.fault_inject & 8), tokens = !(p.fault_inject & 64), scales = !(p.fault_inject & 128);
            if (block_descriptors<BM>() && kb == 0) write_desc(full, s, b);  // the block, for the consumers
            mbar_arrive_expect_tx(full + s, (uint32_t)((tokens ? BM * 128 : 0) + (scales ? BM * 8 : 0) + (weights ? 8192 + 512 : 0)));
            if (tokens)  // rows pool_block * BM .. + BM, K elements kb * 128 .. + 128
                cute::SM90_TMA_LOAD_2D::copy(pool_map + (L.l1 ? 0 : 1), full + s,
                                             static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_NORMAL), st.a, kb * 128, L.row);
            if (scales) cute::SM90_BULK_COPY_G2S::copy(L.fsx + (size_t)kb * p.pool_rows * 2, full + s, st.fsx, BM * 8);
            if (weights) {
                cute::SM90_BULK_COPY_G2S::copy(L.w + (size_t)kb * 8192, full + s, st.bpk, 8192);
                cute::SM90_BULK_COPY_G2S::copy(L.wsf + (size_t)kb * 512, full + s, st.sfb, 512);
            }
        }
        advance();
        return true;
    }

    // Every stage's last TMA loads have landed (the CTA must not exit with copies in flight
    // into its shared memory, e.g. after an error made the consumers stop waiting). The loads
    // read valid addresses and complete by themselves: bounded by the timeout, not by aborts.
    __device__ void run() {
        run_blocks();
        const uint64_t t0 = globaltimer();
        for (int i = it > S ? it - S : 0; i < it; ++i)
            while (!mbar_try_wait(full + i % S, (uint32_t)((i / S) & 1)) && (int64_t)(globaltimer() - t0) < p.timeout_ns) {}
    }

    // Two CTAs per SM (Params::ctas_per_sm 2, kernel v9.3): blocks by ticket. The next block is the
    // list's block t, t taken from the ticket counter (Params::expert_count[2E + 1]) by producer
    // lane 0 when the producer is ready for it, none ahead (one ahead: 1.066x v9.2's time at 16
    // tokens, none ahead 0.999x; benchmarks/NOTES_kernel.md, session 38). The four producer warps
    // read the ticket at named barrier 3 and leave together (the AND of their ok flags), so a warp
    // whose wait gave up never strands the others there. Lane 0 logs each block's phase, and the
    // end, for the consumers' error path (follow_block_log). TICKETS is true in the two-CTA
    // instance only (its one-CTA instances carry no ticket code: 1.042x v9.2's time at 1024 tokens
    // with the run-time test alone, session 38); the run-time test keeps fault bit 256 (the static
    // deal, in MegaMoEScheduler's order) for experiments.
    // The list by ticket is in the wave-lag order (kernel v9.4; megamoe.policies.WaveLagScheduler,
    // the plan's order at two CTAs per SM): L1(0), L1(1), L2(0), L1(2), L2(1), ..., L1(W-1),
    // L2(W-2), L2(W-1), where L1(w) / L2(w) are wave w's passes. A wave's L2 blocks come after the
    // next wave's L1 blocks, so the CTAs that take them find their L1 rows done instead of waiting
    // at the masks while the next wave's L1 blocks wait behind them (at 16 tokens, eight short
    // waves, the producers waited 52 us per CTA in v9.3.1's trace; v9.4: 0.896x its time). The
    // cursor maps a ticket to (pass, index) and only moves forward (a CTA's tickets grow); each L1
    // pass entered costs one reduction of its wave's m blocks; the walk is then put at the block.
    struct LagCursor {
        int lo = 0, hi = 0;            // the current pass's tickets [lo, hi)
        int ph = kPhaseNone, w = 0;    // its phase and wave (first expert)
        int pool = 0;                  // the wave's first pool block
        int lw = -1, lp = 0, lm = 0;   // the last L1 pass's wave (-1: none yet), first pool block, m blocks
        int pp = 0, pm = 0;            // the same for the L1 pass before it
    };
    // Moves c to the pass holding ticket t; false past the list's end.
    __device__ __forceinline__ bool lag_seek(Scheduler<BM, WIDE>& sched, LagCursor& c, int t) {
        const int epw = (int)p.experts_per_wave, E = sched.num_experts;
        while (t >= c.hi) {
            int nw;
            bool l1;
            if (c.ph == kPhaseNone) { nw = 0; l1 = true; }
            else if (c.ph == kPhaseL1) {
                if (c.w == 0 && epw < E) { nw = epw; l1 = true; }
                else { nw = c.w == 0 ? 0 : c.w - epw; l1 = false; }
            } else if (c.w + 2 * epw < E) { nw = c.w + 2 * epw; l1 = true; }
            else if (c.w + epw < E) { nw = c.w + epw; l1 = false; }
            else return false;
            int m;
            if (l1) {
                c.pp = c.lp;
                c.pm = c.lm;
                c.lp = c.lw < 0 ? 0 : c.lp + c.lm;
                c.lw = nw;
                c.lm = sched.wave_m_blocks(nw);
                c.pool = c.lp;
                m = c.lm * sched.num_l1_n();
            } else {
                const bool last = nw == c.lw;
                c.pool = last ? c.lp : c.pp;
                m = (last ? c.lm : c.pm) * sched.num_l2_n();
            }
            c.ph = l1 ? kPhaseL1 : kPhaseL2;
            c.w = nw;
            c.lo = c.hi;
            c.hi += m;
        }
        sched.seek(c.ph, c.w, c.pool, t - c.lo);
        return true;
    }

    __device__ void run_blocks() {
        Scheduler<BM, WIDE> sched(p);
        LagCursor lag;
        const bool tk = TICKETS && p.ctas_per_sm == 2 && !(p.fault_inject & 256);
        unsigned long long* ticket_ctr = p.expert_count + 2 * p.num_experts + 1;
        volatile uint32_t* tk_slot = reinterpret_cast<volatile uint32_t*>(reinterpret_cast<uint8_t*>(full) + kTicketOffset);
        int jt = 0;  // blocks taken (by ticket)
        bool ok = true;  // false: a wait gave up (error raised)
        if (counts_from_shared<WIDE, CTAS>() && p.num_ranks == 1) {
            named_bar_sync(kSharedBarCounts, kCountsBarThreads);
            sched.fetch_counts_shared(reinterpret_cast<const int*>(reinterpret_cast<const uint8_t*>(full) + kHistOffset));
        } else {
            ok = sched.fetch_counts(p, kRoleProducer);
        }
        if (!tk && !ok) return;
        const bool trace = trace_on<TR>(p) && ptid == 0;
        const uint32_t c_start = clock32();
        uint32_t cyc_wait_dep = 0;  // profile: waiting for arrival counts / masks
        for (;;) {
            if (tk) {
                if (ptid == 0) tk_slot[jt & 1] = (uint32_t)atomicAdd(ticket_ctr, 1ull);
                if (!named_bar_and(kBarProducer, kProducerThreads, ok)) {
                    if (ptid == 0) log_block(full, jt, kPhaseNone);
                    return;
                }
                const uint32_t t = tk_slot[jt & 1];
                if (!lag_seek(sched, lag, (int)t)) sched.seek(kPhaseL1, sched.num_experts, 0, 0);  // past the end: none
            }
            const Block b = sched.next();
            if (tk) {
                if (ptid == 0) log_block(full, jt, b.phase);
                ++jt;
            }
            if (b.phase == kPhaseNone) break;
            const uint64_t tb = trace_clock<TR>();
            const uint32_t tslot = trace ? trace_reserve(p, 1) : 0;  // the block's load record
            const int wave = b.expert / (int)p.experts_per_wave;
            if (ptid == 0) progress(p, 1, (uint32_t)((b.phase << 28) | (b.expert << 16) | (b.m_block << 8) | b.n_block));
            // Idle-wait records are written after the loads they held up have been issued: a
            // record's slot comes from an atomic, and waiting for its return before the issue
            // put ~1 us per wait on the consumers' path (trace overhead 3.5% at 64 tokens, v6.6).
            // The wait's times wait in shared memory (tw: [0] L1 start, [1] L1 end, [2] L2 start,
            // [3] L2 end; 0 = none), not in the producer's 64 registers.
            uint64_t* tw_buf = full + kTraceScratchOffset / 8;
            if (trace) tw_buf[1] = tw_buf[3] = 0;
            uint32_t cd = clock32();
            if (b.phase == kPhaseL1) {
                uint32_t v = ld_acquire_u32(p.arrival + b.pool_block);
                if (v != (uint32_t)b.valid_m) {
                    const uint64_t tw = trace_clock<TR>();
                    Deadline d(p.timeout_ns);
                    while (ok && (v = ld_relaxed_u32(p.arrival + b.pool_block)) != (uint32_t)b.valid_m) {
                        if (!d.tick(p)) {
                            if (!aborted(p)) raise_error(p, kErrTimeoutArrival, kRoleProducer, b.expert, b.m_block, b.n_block, -1, v);
                            ok = false;
                        }
                    }
                    if (ok) {
                        (void)ld_acquire_u32(p.arrival + b.pool_block);  // acquire the rows the relaxed poll saw
                        if (trace) { tw_buf[0] = tw; tw_buf[1] = globaltimer(); }
                    }
                }
                fence_proxy_async_global();  // the pulled rows, to the TMA loads below
            }
            cyc_wait_dep += clock32() - cd;
            unsigned long long have = 0;
            const Loads L = loads_of(b);
            for (int kb = 0; ok && kb < b.num_k_blocks; ++kb) {
                if (!mine()) {  // another producer warp's K block
                    advance();
                    continue;
                }
                if (b.phase == kPhaseL2) {
                    const unsigned long long need = 3ull << (2 * kb);
                    if ((have & need) != need) {
                        cd = clock32();
                        have = ld_acquire_u64(p.mask + b.pool_block);
                        if ((have & need) != need) {
                            const uint64_t tw = trace_clock<TR>();
                            Deadline d(p.timeout_ns);
                            while (ok && ((have = ld_relaxed_u64(p.mask + b.pool_block)) & need) != need) {
                                if (!d.tick(p)) {
                                    if (!aborted(p)) raise_error(p, kErrTimeoutMask, kRoleProducer, b.expert, b.m_block, b.n_block, kb, (uint32_t)have);
                                    ok = false;
                                }
                            }
                            if (!ok) break;
                            have = ld_acquire_u64(p.mask + b.pool_block);  // acquire the rows the relaxed poll saw
                            if (trace) { tw_buf[2] = tw; tw_buf[3] = globaltimer(); }
                        }
                        fence_proxy_async_global();  // the L1 epilogue's rows, to the TMA loads below
                        cyc_wait_dep += clock32() - cd;
                    }
                }
                ok = issue(L, kb, b);
                if (trace && tw_buf[3]) {
                    trace_record(p, kRoleProducer, kKindIdleWait, b.expert, b.m_block, b.n_block, wave, kb, tw_buf[2], tw_buf[3]);
                    tw_buf[3] = 0;
                }
            }
            if (trace && tw_buf[1]) trace_record(p, kRoleProducer, kKindIdleWait, b.expert, b.m_block, b.n_block, wave, b.valid_m, tw_buf[0], tw_buf[1]);
            if (ptid == 0) progress(p, 2, (uint32_t)it);
            if (trace) trace_write(p, tslot, kRoleProducer, b.phase == kPhaseL1 ? kKindL1Load : kKindL2Load, b.expert, b.m_block,
                                   b.n_block, wave, b.valid_m, tb, globaltimer());
            if (!tk && !ok) return;  // by ticket the other warps learn it at the next ticket
        }
        // the end of the block list, in the next stage (its producer warp's turn)
        if (block_descriptors<BM>() && mine()) {
            if (it >= S && !mbar_wait(p, empty + s, round_par ^ 1u, kRoleProducer)) return;
            __syncwarp();
            if ((ptid & 31) == 0) {
                desc_of(full)[s] = 0u;  // phase kPhaseNone
                mbar_arrive(full + s);
            }
        }
        if (block_descriptors<BM>()) advance();
        if ((p.fault_inject & 32) && ptid == 0) {
            progress(p, 8, (clock32() - c_start) >> 6);
            progress(p, 9, cyc_wait_empty >> 6);
            progress(p, 10, cyc_wait_dep >> 6);
        }
    }
};

// Blocks by ticket (two CTAs per SM): after an error no consumer warp can walk the rest of the
// list itself. The warps that stopped follow the producer's log of the blocks it took, from the
// first one they did not run (block j), arriving (not waiting) at each L1 epilogue's named
// barriers, so that the warps still in their loop, which run those blocks, pass them (no hang).
// The log is read for at most one timeout: the producer, whose waits fail fast after an error,
// logs every block it will take within microseconds of it, and its end. Not inlined, and its
// test is on the parameter: other forms changed the register allocation of the consumers' K
// loop. (The eight warps agreeing at every block through a named barrier instead cost 2.7% at
// 64 tokens: benchmarks/NOTES_kernel.md, session 38.)
__device__ __noinline__ void follow_block_log(const Params& p, const uint64_t* full, int j) {
    const uint8_t* base = reinterpret_cast<const uint8_t*>(full);
    const volatile uint32_t* len = reinterpret_cast<const volatile uint32_t*>(base + kBlockLogLenOffset);
    const volatile uint8_t* log = reinterpret_cast<const volatile uint8_t*>(base + kBlockLogOffset);
    const uint64_t t0 = globaltimer();
    for (;; ++j) {
        while (*len <= (uint32_t)j && (int64_t)(globaltimer() - t0) < p.timeout_ns) {}
        if (*len <= (uint32_t)j) return;
        __threadfence_block();
        const int phase = log[j & 15];
        if (phase == kPhaseNone) return;
        if (phase == kPhaseL1)
            for (int k = 0; k < kL1EpilogueBarriers; ++k) named_bar_arrive(kBarConsumer, kConsumerThreads);
    }
}

// ------------------------------------------------------------------ consumer (warps 8-15)
// Two warpgroups, each on its own through the K loop (no barrier between them: one promotes
// while the other's WGMMAs run). Per K block the matrix path (mma_sm90.cuh decodes the weights
// into registers and reads the tokens' FP32 scales from the stage).
// Fragment of warpgroup g: weight rows n = 64 g + 16 wi + lane/4 (+8), tokens m = 8 j +
// 2 (lane % 4) (+1). In L1 the producer interleaves gate/up every 8 weight rows, so each
// thread holds the gate (r = 0, 1) and the up (r = 2, 3) of the same intermediate column
// n_block * 64 + 32 g + 8 wi + lane/4, and warpgroup g owns exactly one 32-wide UE8M0
// group of the L1 output (n_block * 2 + g).
template <int BM, bool PROF, bool WIDE, bool TR>
__device__ void consumer_role(const Params& p, uint8_t* stages, uint64_t* full, uint64_t* empty, float* red,
                              const uint8_t* fold_tab) {
    using Tile = Sm90Tile<BM>;
    constexpr int NJ = Tile::NJ;
    const int ctid = threadIdx.x - kDispatchThreads - kProducerThreads;
    const int cw = ctid >> 5, lane = ctid & 31;
    const int S = (int)p.num_stages;
    const int H = (int)p.hidden, I = (int)p.inter;
    const int wslot = 16 + 8 + cw;  // debug progress slot of this consumer warp
    if (lane == 0) progress(p, wslot, 0x01000000);
    // All consumer warps leave together or not at all: a warp that saw the counts complete
    // must not wait at an epilogue barrier for one that gave up (an error raised meanwhile).
    Scheduler<BM, WIDE> sched(p);  // walked where the blocks do not come from descriptors
    if (!named_bar_and(kBarConsumer, kConsumerThreads, sched.fetch_counts(p, kRoleConsumer))) {
        if (lane == 0) progress(p, wslot, 0x0E000000);
        return;
    }
    Tile tile;
    tile.init(ctid);
    const int g = tile.wg, wi = tile.wi;
    // The consumer's records are written by the last consumer thread (warp 15: warpgroup 1's last
    // warp, on SM sub-partition 3). Written by ctid 0 (warp 8, on sub-partition 0 with the producer
    // warp that issues and records, ptid 0), they cost 4.5-5.9% of kernel time at 64 tokens; by
    // ctid 224, 1.8-2.7% (kernel v7.3, benchmarks/NOTES_kernel.md).
    constexpr int kTraceCtid = kConsumerThreads - 32;
    const bool trace = trace_on<TR>(p) && ctid == kTraceCtid;
    const float clampv = (float)p.clamp;
    const bool do_clamp = p.clamp < 3.0e38;
    const float clamp_bf = __bfloat162float(__float2bfloat16_rn(clampv));
    const bool mma_on = !(p.fault_inject & 2);  // timing experiments only (bit 2: no MMA)
    int it = 0;
    // the stage of K block `it` and its full barrier's parity, it % S and (it / S) & 1 kept
    // incrementally (a division per K block costs the consumers ~20 dependent instructions)
    int s = 0;
    uint32_t parity = 0;
    bool dead = false;
    // profile (PROF: the instance launched with fault_inject bit 32; thread ctid 0): SM cycles
    // waiting for full stages, in decode + barrier, in the MMA, in the epilogues. A separate
    // instance because the clock reads cost the K loop ~10 instructions per K block and, at
    // block_m 128, local-memory traffic (kernel v6.6, benchmarks/NOTES_kernel.md); pclock() is
    // 0 and the sums fold away when PROF is false.
    const auto pclock = []() -> long long { if constexpr (PROF) return clock64(); else return 0; };
    long long cyc_full = 0, cyc_decode = 0, cyc_mma = 0, cyc_epi = 0;
    const long long c_start = pclock();
    // PROF: the epilogues' parts (SM cycles of thread ctid 0 from the previous mark; L1: the
    // loads issued and the walk, SwiGLU + amax, barrier 1, exponents + barrier 2, quantization +
    // barrier 3, stores + proxy fence + barrier 4 + release; L2: the row metadata, the stores).
    // A macro, not a lambda: a closure in scope moved other instances' registers (session 52).
    long long cyc_ep[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    long long ep_t = 0;
#define MEGAMOE_EP_MARK(i) \
    if constexpr (PROF) { const long long n_ = clock64(); cyc_ep[i] += n_ - ep_t; ep_t = n_; }
    // The blocks come from the producer's descriptors where block_descriptors (block_m 16; after an
    // error the rest of the list is walked below). Elsewhere the consumers walk the scheduler, at
    // block_m >= 32 (walk_in_epilogue) inside the epilogue of the current block, right after its
    // first global loads are issued (the top-k weights at L1, the combine rows' slot and token at
    // L2: the row index is formed after the walk, which then overlaps the loads' round trip). The
    // trace's wave number is computed for the record where the walk moved and at the block's
    // start elsewhere (the SASS each form was measured with).
    constexpr bool from_desc = block_descriptors<BM>();
    constexpr bool ahead = !from_desc && walk_in_epilogue<BM>();
    int taken = 0;  // blocks taken from the descriptors
    // The recording thread's records, two a block (MMA, epilogue), fill the CTA's record buffer
    // from its top down: slots cap - 2, cap - 1 for its first block, and so on. It counts them
    // itself, no atomic, and stores the count once, in the second row of trace_count, after its
    // last block (the other roles reserve from the bottom with trace_reserve;
    // megamoe.kernel.trace.record_ranges). A global atomic per block, its returned slot held
    // through the K loop, cost the traced kernel the L1-cache gain of 5 stages at block_m 128
    // (probe TR-C, benchmarks/NOTES_kernel.md, session 53). Where the untraced launches share the
    // traced instance (block_m 32, untraced_instance), the block's two slots come from that atomic,
    // as in kernel v9.12.
    constexpr bool top_down = untraced_instance<BM>();
    uint32_t nrec = 0;
    Block b;
    if constexpr (!from_desc) b = sched.next();
    for (;;) {
        if constexpr (from_desc) {
            // the next block: the descriptor of stage s (its first K block's), once that stage is
            // full (the K loop's first wait then finds the phase complete)
            if (!dead && !mbar_wait(p, full + s, parity, kRoleConsumer)) dead = true;
            dead = __any_sync(0xffffffffu, dead);
            if (dead) break;
            b = read_desc(p, full, s);
            ++taken;
        }
        if (b.phase == kPhaseNone) break;
        const int wave_here = ahead ? 0 : b.expert / (int)p.experts_per_wave;
        const uint64_t tb = trace_clock<TR>();
        const uint32_t tslot = !top_down && trace ? trace_reserve(p, 2) : 0;
        if (ctid == 0) progress(p, 4, (uint32_t)((b.phase << 28) | (b.expert << 16) | (b.m_block << 8) | b.n_block));
        tile.zero();
        // this thread's two weight rows' scales 2^(s_max - 133) (the fold, fp4.cuh), applied
        // in the epilogue; loaded now, used after the K loop
        const float* rs = b.phase == kPhaseL1 ? p.w1_row_scale + (size_t)b.expert * 2 * I
                                              : p.w2_row_scale + (size_t)b.expert * H;
        const float rs0 = __ldg(rs + b.n_block * 128 + tile.row_of(0)), rs8 = __ldg(rs + b.n_block * 128 + tile.row_of(2));
        // The L1 GEMM at block_m >= kL1Fold128BlockM (its pool folded per 128-K group) chains a K
        // block's four k32 steps and promotes once (mma_sm90.cuh); the other GEMMs promote per
        // 64-K group. One loop for both (a second copy left ptxas short of registers at block_m
        // 128: it spilled two stage addresses into the L2 loop). At block_m 128 the phase test
        // is redone per K block (opaque_u32) and an elected lane (elect.sync) releases the
        // stage: with the phase and lane-0 predicates held through the loop, ptxas kept them in a
        // register that it spilled once the v7.9 dispatch was in the same function (a local
        // load per K block). Below 128 lane 0 releases: elect.sync measured 1-3% slower there.
        // (A lane test from %tid.x put an S2R's latency in front of every release: +3..+10%.
        // Kernel v7.9, benchmarks/NOTES_kernel.md.)
        constexpr bool one = BM >= kL1Fold128BlockM;
        static_assert(Tile::WGMMA_N_STEP == (BM == 128 ? 32 : BM), "the K loop's WGMMA N variants below");
        // Kernel v9.12: at block_m 128 one copy of the K loop per WGMMA N (NA active n8 tiles: N = 32
        // / 64 / 96 / 128, the block's valid rows rounded up to 32), picked once per block (a switch
        // inside the loop, candidate TN, cost the full blocks 4-5% per K block). The loop body is
        // written twice: as a lambda at block_m 128 only, and as v9.11's plain loop below it (the
        // lambda's by-reference closure in scope changed every instance's SASS, and block_m 32
        // read 1.050 of v9.11's kernel time at 1024 tokens on the H200: candidate TN2, session 52).
        if constexpr (BM == 128) {
            const auto k_loop = [&](auto na) {
                for (int kb = 0; kb < b.num_k_blocks; ++kb) {
                    // After an error every wait fails fast; keep walking the block list so that all
                    // consumer warps still meet at the named barriers (no hang).
                    long long c0 = pclock();
                    if (!dead && !mbar_wait(p, full + s, parity, kRoleConsumer)) dead = true;
                    long long c1 = pclock();
                    cyc_full += c1 - c0;
                    // Lanes leave the spin wait at different times: the vote reconverges them before
                    // the .aligned ops
                    dead = __any_sync(0xffffffffu, dead);
                    const Stage st = get_stage<BM>(stages, s);
                    // Each thread reads its two weight rows' packed chunk and scale bytes and decodes them
                    // into WGMMA registers (mma_sm90.cuh), and its tokens' FP32 scales of the two 64-K
                    // groups straight from the stage (st.fsx [2][BM], bulk-copied by the producer: no
                    // table to build, no warpgroup barrier, no byte extraction).
                    const int n0 = tile.row_of(0);
                    const uint32_t* w0 = reinterpret_cast<const uint32_t*>(st.bpk + n0 * 64 + (lane & 3) * 16);
                    const uint32_t* w8 = w0 + 8 * 16;  // row n0 + 8
                    const uint32_t o0 = *reinterpret_cast<const uint32_t*>(st.sfb + n0 * 4);  // fold-table offsets
                    const uint32_t o8 = *reinterpret_cast<const uint32_t*>(st.sfb + (n0 + 8) * 4);
                    // (The token tile was written by TMA, the async proxy WGMMA reads it through: no
                    // proxy fence; the full barrier's completion makes it visible.)
                    c0 = pclock();
                    cyc_decode += c0 - c1;
                    if (!dead && mma_on)
                        tile.template mma_k_block<decltype(na)::value>(w0, w8, o0, o8, fold_tab, st.a, st.fsx,
                                                                       one && opaque_u32(b.phase) == kPhaseL1);
                    __syncwarp();
                    if (BM == 128 ? cute::elect_one_sync() : lane == 0) mbar_arrive(empty + s);  // one lane
                    cyc_mma += pclock() - c0;
                    ++it;
                    if (++s == S) { s = 0; parity ^= 1u; }
                }
            };
            switch ((b.valid_m + 31) >> 5) {  // n32 token steps with a valid row
            case 1: k_loop(std::integral_constant<int, 4>{}); break;
            case 2: k_loop(std::integral_constant<int, 8>{}); break;
            case 3: k_loop(std::integral_constant<int, 12>{}); break;
            default: k_loop(std::integral_constant<int, NJ>{}); break;
            }
        } else {  // below 128: v9.11's loop itself, SASS unchanged
            for (int kb = 0; kb < b.num_k_blocks; ++kb) {
                // After an error every wait fails fast; keep walking the block list so that all
                // consumer warps still meet at the named barriers (no hang).
                long long c0 = pclock();
                if (!dead && !mbar_wait(p, full + s, parity, kRoleConsumer)) dead = true;
                long long c1 = pclock();
                cyc_full += c1 - c0;
                // Lanes leave the spin wait at different times: the vote reconverges them before
                // the .aligned ops
                dead = __any_sync(0xffffffffu, dead);
                const Stage st = get_stage<BM>(stages, s);
                // Each thread reads its two weight rows' packed chunk and scale bytes and decodes them
                // into WGMMA registers (mma_sm90.cuh), and its tokens' FP32 scales of the two 64-K
                // groups straight from the stage (st.fsx [2][BM], bulk-copied by the producer: no
                // table to build, no warpgroup barrier, no byte extraction).
                const int n0 = tile.row_of(0);
                const uint32_t* w0 = reinterpret_cast<const uint32_t*>(st.bpk + n0 * 64 + (lane & 3) * 16);
                const uint32_t* w8 = w0 + 8 * 16;  // row n0 + 8
                const uint32_t o0 = *reinterpret_cast<const uint32_t*>(st.sfb + n0 * 4);  // fold-table offsets
                const uint32_t o8 = *reinterpret_cast<const uint32_t*>(st.sfb + (n0 + 8) * 4);
                // (The token tile was written by TMA, the async proxy WGMMA reads it through: no
                // proxy fence; the full barrier's completion makes it visible.)
                c0 = pclock();
                cyc_decode += c0 - c1;
                if (!dead && mma_on) tile.mma_k_block(w0, w8, o0, o8, fold_tab, st.a, st.fsx, one && opaque_u32(b.phase) == kPhaseL1);
                __syncwarp();
                if (BM == 128 ? cute::elect_one_sync() : lane == 0) mbar_arrive(empty + s);  // one lane
                cyc_mma += pclock() - c0;
                ++it;
                if (++s == S) { s = 0; parity ^= 1u; }
            }
        }
        if (ctid == 0) progress(p, 5, (uint32_t)it);
        if (lane == 0) progress(p, wslot, 0x03000000 | (dead ? 0x800000 : 0) | (uint32_t)it);
        const uint64_t tm = trace_clock<TR>();
        const long long ce = pclock();
        if constexpr (PROF) ep_t = ce;
        const size_t prow0 = (size_t)b.pool_block * BM;
        Block nb;  // the next block, walked to in either epilogue (ahead)
        // After an error (this warp's waits failed, or any role raised one) the pool rows may
        // never have been pulled: compute nothing into memory, above all no write-back through
        // a stale source rank (EP). The named barriers below are still met.
        const bool store = !dead && !aborted(p);
        // ctid, re-read here: lane-derived addresses of the epilogues computed once at the start
        // would hold registers through the K loop (ptxas then recomputed the K loop's own stage
        // offsets in it: 4-9 more instructions per K block)
        const int et = (int)tid_here() - kDispatchThreads - kProducerThreads;
        #pragma unroll
        for (int j = 0; j < NJ; ++j) {  // the row scales: rows row_of(0) (r = 0, 1) and row_of(2) (r = 2, 3)
            tile.acc[j][0] *= rs0; tile.acc[j][1] *= rs0;
            tile.acc[j][2] *= rs8; tile.acc[j][3] *= rs8;
        }
        if (b.phase == kPhaseL1) {
            // Tokens past the block's valid rows: their pool rows and FP32 scales were never
            // written by this call (stale memory, NaN or 2^100 as likely as a token), so their
            // accumulators are zeroed before the SwiGLU. Otherwise one such value sends its warp
            // down the division's slow path: in v8.1's traces a partial block's L1 epilogue took
            // 1.3-1.7x a full one's (benchmarks/NOTES_kernel.md, kernel v8.2). The L2 pool's rows
            // past valid_m are then zeros, their scale bytes those of a zero group.
            #pragma unroll
            for (int j = 0; j < NJ; ++j)
                #pragma unroll
                for (int r = 0; r < 2; ++r)
                    if (tile.tok_of(j, r) >= b.valid_m) tile.acc[j][r] = tile.acc[j][2 + r] = 0.0f;
            // SwiGLU (BF16-rounded gate/up, optional clamp) x top-k weight, per-32 amax. The
            // top-k weights are loaded up front: one round trip, not one per token. (Loading
            // them during the K loop, after its first full-stage wait, was slower: +4..+12% at
            // 64-1024 tokens, benchmarks/NOTES_kernel.md.)
            float wt[NJ][2];
            #pragma unroll
            for (int j = 0; j < NJ; ++j)
                #pragma unroll
                for (int r = 0; r < 2; ++r) wt[j][r] = __ldcg(p.pool_weight + prow0 + tile.tok_of(j, r));
            if constexpr (ahead) nb = sched.next();
            MEGAMOE_EP_MARK(0)
            // Every value first (into the gate slot), then the amax: no branch or shuffle between
            // the values, their dependency chains interleave. The division's fast path serves a
            // warp whose gates all allow it (swiglu_fast_ok: zero or a finite gate away from the
            // range limits); otherwise the IEEE division with its slow path. (Until
            // v7.8 each value ran its chain -- BF16 rounds, expf, the division behind its own
            // slow-path branch, three shuffles -- after the previous one's.)
            bool fast = true;
            #pragma unroll
            for (int j = 0; j < NJ; ++j)
                #pragma unroll
                for (int r = 0; r < 2; ++r) fast = fast && swiglu_fast_ok(tile.acc[j][r], do_clamp, clamp_bf);
            if (__all_sync(0xffffffffu, fast)) {
                #pragma unroll
                for (int j = 0; j < NJ; ++j)
                    #pragma unroll
                    for (int r = 0; r < 2; ++r)
                        tile.acc[j][r] = swiglu_weighted_fast(tile.acc[j][r], tile.acc[j][2 + r], wt[j][r], do_clamp, clamp_bf);
            } else {
                #pragma unroll
                for (int j = 0; j < NJ; ++j)
                    #pragma unroll
                    for (int r = 0; r < 2; ++r)
                        tile.acc[j][r] = swiglu_weighted(tile.acc[j][r], tile.acc[j][2 + r], wt[j][r], do_clamp, clamp_bf);
            }
            #pragma unroll
            for (int j = 0; j < NJ; ++j)
                #pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const int m = tile.tok_of(j, r);
                    float a = fabsf(tile.acc[j][r]);
                    a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 4));
                    a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 8));
                    a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 16));
                    if (lane < 4) red[(g * 4 + wi) * BM + m] = a;
                }
            if (lane == 0) progress(p, wslot, 0x04000000 | (uint32_t)it);
            MEGAMOE_EP_MARK(1)
            // both warpgroups' amax: the block's 64 columns are one 64-K group of the L2 GEMM
            // (warpgroup g makes its 32-group g), folded as the pull folds x (roles_shared.cuh)
            named_bar_sync(kBarConsumer, kConsumerThreads);
            MEGAMOE_EP_MARK(2)
            if (lane == 0) progress(p, wslot, 0x05000000 | (uint32_t)it);
            // Once per token (thread ctid < BM, token ctid): both 32-groups' amax over their
            // warpgroup's four warps, their UE8M0 exponents and the fold (s_max over the groups
            // with a nonzero value), written into rows 0-3 of the token's own column of red (no
            // other thread reads that column): 2^-l of each group, each group's fold factor, and
            // both scale bytes (one 16-bit store: the two groups are adjacent bytes). Until v7.3
            // each of the 64 threads holding a token did this per value (8 shared loads, 8 FMNMX,
            // two exponents): ~120 instructions per value in all (ncu, benchmarks/NOTES_kernel.md).
            if (ctid < BM) {
                const int m = ctid;
                float a0 = 0.0f, a1 = 0.0f;
                #pragma unroll
                for (int w = 0; w < 4; ++w) {
                    a0 = fmaxf(a0, red[w * BM + m]);
                    a1 = fmaxf(a1, red[(4 + w) * BM + m]);
                }
                float inv0, inv1;
                const int l0 = ue8m0_exponent(a0, inv0), l1 = ue8m0_exponent(a1, inv1);
                // s_max over the groups with a nonzero value (amax > 0); zeros stay as they are
                const int lm0 = a1 > 0.0f ? (a0 > 0.0f ? max(l0, l1) : l1) : l0;
                const int lm1 = a0 > 0.0f ? (a1 > 0.0f ? max(l1, l0) : l0) : l1;
                red[m] = inv0;
                red[BM + m] = inv1;
                // the fold's 2^-d per group as FP16 bits (1 for d = 0: an exact no-op)
                reinterpret_cast<uint32_t*>(red)[2 * BM + m] = pow2_neg_h((a0 > 0.0f && lm0 > l0) ? lm0 - l0 : 0);
                reinterpret_cast<uint32_t*>(red)[3 * BM + m] = pow2_neg_h((a1 > 0.0f && lm1 > l1) ? lm1 - l1 : 0);
                if (store) {  // 32-groups 2 n_block and 2 n_block + 1 of the intermediate dim
                    *reinterpret_cast<uint16_t*>(p.l2_pool_sf + ((size_t)(b.n_block >> 1) * p.pool_rows + prow0 + m) * 4 +
                                                 ((2 * b.n_block) & 3)) = (uint16_t)((lm0 + 127) | ((lm1 + 127) << 8));
                    // the 64-K group's scale (its first byte) as FP32 for the L2 consumers
                    p.l2_pool_fsx[(size_t)(b.n_block >> 1) * 2 * p.pool_rows + prow0 * 2 + (b.n_block & 1) * BM + m] =
                        ue8m0_to_float((uint32_t)(lm0 + 127) & 0xFFu);
                }
            }
            named_bar_sync(kBarConsumer, kConsumerThreads);
            MEGAMOE_EP_MARK(3)
            // the per-32 quantization with this group's scale, then the fold, two tokens at a time
            // (tok_of(j, 0) and tok_of(j, 1): one E4M3x2 conversion, one FP16x2 rescale, d = 0
            // scaling by 1 exactly), into the block's [BM][64]-byte tile in shared memory (red's
            // rows 4..19, free once the amax are read; 16-byte chunk c of row m at chunk
            // c ^ ((m >> 1) & 3): the warp's four rows of a store sit on different banks). Then
            // coalesced 16-byte stores of whole rows. (Until v7.7 each thread stored its 2 NJ
            // bytes one by one, strided by I: ~35 instructions per value with the fold's branch
            // and a 64-bit address each; the L1 epilogue ran ~4300 instructions per thread at
            // block_m 128, benchmarks/NOTES_kernel.md.)
            const float* inv_g = red + g * BM;
            const uint32_t* m_g = reinterpret_cast<const uint32_t*>(red) + (2 + g) * BM;
            uint8_t* tile_s = reinterpret_cast<uint8_t*>(red + 4 * BM);
            const int c2 = (et & 3) * 2;
            const int tcol = (et >> 5) * 8 + (et & 31) / 4;  // this thread's column of the tile: g * 32 + wi * 8 + lane / 4
            #pragma unroll
            for (int j = 0; j < NJ; ++j) {
                const float2 inv2 = *reinterpret_cast<const float2*>(inv_g + 8 * j + c2);
                const uint2 m2 = *reinterpret_cast<const uint2*>(m_g + 8 * j + c2);
                const uint32_t q = e4m3x2_scale(e4m3x2_of(tile.acc[j][0] * inv2.x, tile.acc[j][1] * inv2.y),
                                                __halves2half2(__ushort_as_half((unsigned short)m2.x),
                                                               __ushort_as_half((unsigned short)m2.y)));
                const int m = 8 * j + c2;  // even: rows m and m + 1 share the swizzle
                const int off = ((tcol >> 4) ^ ((m >> 1) & 3)) * 16 + (tcol & 15);
                tile_s[m * 64 + off] = (uint8_t)q;
                tile_s[(m + 1) * 64 + off] = (uint8_t)(q >> 8);
            }
            named_bar_sync(kBarConsumer, kConsumerThreads);
            MEGAMOE_EP_MARK(4)
            if (store) {
                uint8_t* out = p.l2_pool + prow0 * (size_t)I + b.n_block * 64;
                #pragma unroll
                for (int i = et; i < BM * 4; i += kConsumerThreads) {
                    const int m = i >> 2, c = i & 3;
                    *reinterpret_cast<uint4*>(out + (size_t)m * I + c * 16) =
                        *reinterpret_cast<const uint4*>(tile_s + m * 64 + ((c ^ ((m >> 1) & 3)) * 16));
                }
            }
            fence_proxy_async_global();  // the rows are read by other CTAs' TMA loads
            // every consumer thread's rows happen before thread 0's release through the barrier
            // (bar.sync synchronizes, and a release is cumulative: the PTX memory model; the
            // pulls release their rows the same way). Until v7.7 a __threadfence() (fence.sc.gpu
            // with an L1 invalidation) came first.
            named_bar_sync(kBarConsumer, kConsumerThreads);
            if (ctid == 0) {
                if constexpr (relay_release<BM>()) release_mask_bit(p, relay_of(full), b.pool_block, b.n_block);
                else red_release_or_u64(p.mask + b.pool_block, 1ull << b.n_block);
            }
            if (lane == 0) progress(p, wslot, 0x06000000 | (uint32_t)it);
            MEGAMOE_EP_MARK(5)
        } else {
            // Row metadata once per token, not per fragment element: lane l computes the address
            // of the combine rows of tokens l, l + 32, .. (row = slot * combine_rows + token; EP:
            // in the source rank's combine buffer over NVLink; 0 = not stored), each element takes
            // its token's from that lane by a shuffle. (Until v7.7 the lane held the row and the
            // rank, and every element shuffled both and built its address, peer table included:
            // ~50 instructions per element at block_m 128, benchmarks/NOTES_kernel.md.)
            constexpr int NT = (BM + 31) / 32;
            // The loads do not wait for `store` (its error-word load is in flight with them: one
            // round trip, not two); a row is used only if `store`.
            unsigned long long row_l[NT];
            int crow_l[NT], src_l[NT], tok_l[NT];
            #pragma unroll
            for (int u = 0; u < NT; ++u) {
                const int m = u * 32 + (et & 31);
                const bool ok = m < b.valid_m;
                if constexpr (ahead) {  // the raw slot and token: no use of either before the walk
                    crow_l[u] = ok ? __ldcg(p.pool_slot + prow0 + m) : -1;
                    tok_l[u] = ok ? __ldcg(p.pool_token + prow0 + m) : 0;
                } else {
                    crow_l[u] = ok ? __ldcg(p.pool_slot + prow0 + m) * (int)p.combine_rows + __ldcg(p.pool_token + prow0 + m) : -1;
                }
                src_l[u] = (p.num_ranks > 1 && ok) ? __ldcg(p.pool_rank + prow0 + m) : 0;
            }
            if constexpr (ahead) {
                nb = sched.next();
                #pragma unroll
                for (int u = 0; u < NT; ++u) crow_l[u] = crow_l[u] >= 0 ? crow_l[u] * (int)p.combine_rows + tok_l[u] : -1;
            }
            #pragma unroll
            for (int u = 0; u < NT; ++u) {
                row_l[u] = 0;
                if (store && crow_l[u] >= 0) {
                    __nv_bfloat16* cb = p.num_ranks > 1
                        ? reinterpret_cast<__nv_bfloat16*>(peer_ptr(p, src_l[u], p.off_combine))
                        : reinterpret_cast<__nv_bfloat16*>(p.combine_buf);
                    row_l[u] = reinterpret_cast<unsigned long long>(cb + (size_t)crow_l[u] * H);
                }
            }
            MEGAMOE_EP_MARK(6)
            // Full 32-byte sectors: lanes q = lane / 4 and q ^ 1 (same tokens) swap one value, so
            // that each holds two adjacent columns of its token (even q: q, q + 1; odd q: q + 7,
            // q + 8) and the warp's 8 lanes per token store its 16 columns as one sector with
            // 4-byte stores (the fragment's own layout, columns q and q + 8, wrote 2-byte halves
            // of sectors: kernel v7.2, benchmarks/NOTES_kernel.md).
            const int q = (et & 31) >> 2;
            const bool odd = q & 1;
            const int col = b.n_block * 128 + (et >> 5) * 16 + (odd ? q + 7 : q);  // g * 64 + wi * 16 + ..
            #pragma unroll
            for (int j = 0; j < NJ; ++j)
                #pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const int from = (j % 4) * 8 + (et & 3) * 2 + r;  // the lane holding tok_of(j, r)'s row
                    const unsigned long long row = __shfl_sync(0xffffffffu, row_l[j / 4], from);
                    const float a = tile.acc[j][r], c8 = tile.acc[j][2 + r];  // columns q and q + 8
                    const float recv = __shfl_xor_sync(0xffffffffu, odd ? a : c8, 4);
                    if (row != 0)
                        reinterpret_cast<__nv_bfloat162*>(reinterpret_cast<__nv_bfloat16*>(row) + col)[0] =
                            __floats2bfloat162_rn(odd ? recv : a, odd ? c8 : recv);
                }
            MEGAMOE_EP_MARK(7)
        }
        cyc_epi += pclock() - ce;
        if (trace) {
            const uint64_t te = globaltimer();
            const bool l1 = b.phase == kPhaseL1;
            const int wave = ahead ? b.expert / (int)p.experts_per_wave : wave_here;
            uint32_t slot = tslot;
            if constexpr (top_down) {
                nrec += 2u;
                slot = (uint32_t)p.trace_cap - nrec;  // past the capacity: wraps, not written
            }
            trace_write(p, slot, kRoleConsumer, l1 ? kKindL1Mma : kKindL2Mma, b.expert, b.m_block, b.n_block, wave, b.valid_m, tb, tm);
            trace_write(p, slot + 1u, kRoleConsumer, l1 ? kKindL1Epilogue : kKindL2Epilogue, b.expert, b.m_block, b.n_block, wave, b.valid_m, tm, te);
        }
        if constexpr (!from_desc) b = ahead ? nb : sched.next();
    }
    if (top_down && trace) p.trace_count[gridDim.x + blockIdx.x] = nrec;  // the top records' count
    if (from_desc && dead && p.ctas_per_sm == 2) {
        follow_block_log(p, full, taken);
    } else if (from_desc && dead) {
        // After an error the producer may have stopped writing descriptors: walk the rest of the
        // block list (every warp the same list: the scheduler is deterministic) and meet each
        // L1 epilogue's named barriers, as the warps still in the loop above do (no hang). The
        // counts were complete at the start (fetch_counts above), so the fetch returns at once.
        Scheduler<BM, WIDE> rest(p);
        if (rest.fetch_counts(p, kRoleConsumer)) {
            for (int i = 0; i < taken; ++i) (void)rest.next();
            for (Block r = rest.next(); r.phase != kPhaseNone; r = rest.next())
                if (r.phase == kPhaseL1)
                    for (int k = 0; k < kL1EpilogueBarriers; ++k) named_bar_sync(kBarConsumer, kConsumerThreads);
        }
    }
    if (PROF && ctid == 0) {
        progress(p, 11, (uint32_t)((pclock() - c_start) >> 6));
        progress(p, 12, (uint32_t)(cyc_full >> 6));
        progress(p, 13, (uint32_t)(cyc_decode >> 6));
        progress(p, 14, (uint32_t)(cyc_mma >> 6));
        progress(p, 15, (uint32_t)(cyc_epi >> 6));
    }
    if constexpr (PROF) {  // (inside the run-time test above, the loop changed the other instances' SASS)
        if (ctid == 0)
            for (int i = 0; i < 8; ++i) progress(p, 16 + i, (uint32_t)(cyc_ep[i] >> 6));
    }
#undef MEGAMOE_EP_MARK
}

// ------------------------------------------------------------------ the kernel
template <int BM, bool PROF, bool WIDE, int CTAS, bool TR>
__global__ void __launch_bounds__(kThreads, 1) __maxnreg__((kRegsEven / CTAS)) megamoe_sm90_kernel(const __grid_constant__ Sm90Args args) {
    static_assert(CTAS == 1 || (CTAS == 2 && BM == 16), "two CTAs per SM only at block_m 16");
    // The wide instances count locally (dispatch_pull's LOCAL: kernel v8.9 at one CTA, v9.7 at two,
    // where the dispatch warps have had 48 registers since v9.6: 0.978-0.990 of v9.6's count-barrier
    // time at 4-16 tokens on the H200, benchmarks/NOTES_kernel.md, session 42). The combine of a
    // token's slots at once (v8.8) stays a one-CTA feature. The wide walk itself (the scheduler's
    // WIDE) runs at two CTAs since v9.5.
    constexpr bool kWideOne = WIDE && CTAS == 1;
    using Regs = RegSplit<CTAS>;
    const Params& p = args.p;
    extern __shared__ __align__(1024) uint8_t smem[];
    const int S = (int)p.num_stages, E = (int)p.num_experts;
    uint64_t* full = reinterpret_cast<uint64_t*>(smem);
    uint64_t* empty = full + S;
    int* hist = reinterpret_cast<int*>(smem + kHistOffset);
    int* cta_base = hist + E;
    int* off_blk = cta_base + E;
    int* scan = off_blk + E;
    float* red = reinterpret_cast<float*>(smem + kHistOffset + align128((size_t)E * 12 + 64));
    uint8_t* stages = smem + fixed_bytes(BM, E);
    uint8_t* fold_tab = smem + kFoldTableOffset;  // after the 2 x 16 barriers, inside the first 1024 B
    const int warp = threadIdx.x >> 5;
    if (threadIdx.x < kFoldTableBytes / 4)
        reinterpret_cast<uint32_t*>(fold_tab)[threadIdx.x] = __ldg(reinterpret_cast<const uint32_t*>(p.fold_table) + threadIdx.x);
    if (threadIdx.x == 0) {
        for (int s = 0; s < S; ++s) {
            mbar_init(full + s, 1);  // the producer lane's arrive.expect_tx; the TMA bytes complete it
            mbar_init(empty + s, kConsumerWarps);
        }
        if constexpr (relay_release<BM>()) {
            Relay* r = relay_of(full);
            for (int i = 0; i < kRelaySlots; ++i) {
                mbar_init(&r->full[i], 1);
                mbar_init(&r->empty[i], 1);
            }
            r->on = 0u;
            r->sent = 0u;
        }
        *reinterpret_cast<uint32_t*>(smem + kBlockLogLenOffset) = 0u;  // the producer's block log is empty
    }
    __syncthreads();
    // Register split (setmaxnreg, per warpgroup): dispatch and producer give registers to the
    // two consumer warpgroups (accumulator + WGMMA partial: BM floats per thread); everyone
    // returns to the even split for the combine. 128 x (64 + 64) + 256 x 192 = 65536.
    if (warp < 4) {
        setmaxnreg_dec<Regs::dispatch>();
        if (p.num_ranks > 1) dispatch_role_ep<TR>(p, BM, hist, cta_base, off_blk, scan);
        else dispatch_pull<BM, IdentitySfRow, true, WIDE, (counts_from_shared<WIDE, CTAS>() ? kCountsBarThreads : 0), TR>(p, hist, cta_base, off_blk, scan, IdentitySfRow{p.pool_rows}, (int)p.hidden);  // whole rows, folded
        __syncwarp();
        if (threadIdx.x == 0) {
            progress(p, 0, 0xD0);
            if constexpr (relay_release<BM>()) relay_serve(p, relay_of(full));
        }
    } else if (warp < 8) {
        setmaxnreg_dec<Regs::producer>();
        if (warp < 4 + Producer<BM>::NW) {
            Producer<BM, WIDE, CTAS, TR> prod(p, args.pool_map, stages, full, empty);
            prod.run();
        }
        __syncwarp();
        if (threadIdx.x == kDispatchThreads) progress(p, 3, 0xD0);
    } else {
        setmaxnreg_inc<Regs::consumer>();
        consumer_role<BM, PROF, WIDE, TR>(p, stages, full, empty, red, fold_tab);
        // the relay's end, on every path out of the consumer role (if its slot never frees,
        // the dispatch lane's own wait has failed and returned)
        if constexpr (relay_release<BM>())
            if (threadIdx.x == kDispatchThreads + kProducerThreads) relay_send(p, relay_of(full), kRelayDone);
        __syncwarp();
        if (threadIdx.x == kDispatchThreads + kProducerThreads) progress(p, 6, 0xD0);
        setmaxnreg_dec<Regs::even>();
    }
    // Dispatch and producer take their registers back only after the consumers returned
    // theirs: a setmaxnreg.inc that cannot be served spins (USETMAXREG.TRY_ALLOC), and the
    // finished dispatch warps spinning there for the whole kernel executed ~40% of all warp
    // instructions (ncu on the H200, T = 4096, benchmarks/NOTES_kernel.md).
    __syncthreads();
    if (warp < 8) setmaxnreg_inc<Regs::even>();

    // Grid sync (EP: NVLink barrier 2), then combine and clean up (roles_shared.cuh).
    // (the one-CTA wide instance, 1-2 tokens on V4-Flash: every slot of a token loaded at once, kernel v8.8)
    if constexpr (kWideOne) combine_and_clean<BM, kCombineSlotsWide, TR>(p, kThreads);
    else combine_and_clean<BM, combine_slots<BM>(), TR>(p, kThreads);
}

}  // namespace megamoe

// ------------------------------------------------------------------ host API (C ABI, ctypes)
using megamoe::Params;

// Per-device launch state, set once: the host work of a call is on the critical path of
// every launch (EP ranks wait for the slowest one's launch).
constexpr int kMaxDevices = 64;
struct DeviceInfo { int sms = 0, max_smem = 0, sm_smem = 0, reserved_smem = 0; };
static DeviceInfo g_dev[kMaxDevices];

// TMA descriptors of the two pools (megamoe::Sm90Args), encoded once per (device, pool, address,
// shape, block_m): the workspace of a kernel object keeps its address across calls.
static PFN_cuTensorMapEncodeTiled_v12000 g_encode_tiled = nullptr;
struct PoolMapKey { const void* base = nullptr; int64_t rows = 0, cols = 0, bm = 0; };
static PoolMapKey g_map_key[kMaxDevices][2];
static CUtensorMap g_map[kMaxDevices][2];

// Returns 0, -7 (no encoder from the driver) or -8 (the driver refused the descriptor).
static int pool_map(int dev, int which, const void* base, int64_t rows, int64_t cols, int64_t bm, CUtensorMap* out) {
    PoolMapKey& k = g_map_key[dev][which];
    if (k.base != base || k.rows != rows || k.cols != cols || k.bm != bm) {
        if (g_encode_tiled == nullptr) {
            void* fn = nullptr;
            cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
            if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
                q != cudaDriverEntryPointSuccess || fn == nullptr)
                return -7;
            g_encode_tiled = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
        }
        const cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows};  // bytes (E4M3) per row, rows
        const cuuint64_t strides[1] = {(cuuint64_t)cols};                 // row pitch in bytes
        const cuuint32_t box[2] = {128, (cuuint32_t)bm};                  // one K block x block_m rows
        const cuuint32_t elem[2] = {1, 1};
        if (g_encode_tiled(&g_map[dev][which], CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(base), dims, strides,
                           box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                           CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
            k = PoolMapKey{};
            return -8;
        }
        k = PoolMapKey{base, rows, cols, bm};
    }
    *out = g_map[dev][which];
    return 0;
}

template <int BM, bool PROF, bool WIDE, int CTAS, bool TR>
static int launch_instance(const Params* p, cudaStream_t stream, size_t smem, int dev) {
    auto kern = megamoe::megamoe_sm90_kernel<BM, PROF, WIDE, CTAS, TR>;
    static size_t configured[kMaxDevices] = {};  // dynamic smem already set and checked, per device
    if (configured[dev] < smem) {
        cudaError_t err = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (err != cudaSuccess) return (int)err;
        int blocks = 0;
        err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kern, megamoe::kThreads, smem);
        if (err != cudaSuccess) return (int)err;
        if (blocks < CTAS) return -3;
        configured[dev] = smem;
    }
    megamoe::Sm90Args a;
    a.p = *p;
    int rc = pool_map(dev, 0, p->l1_pool, p->pool_rows, p->hidden, BM, &a.pool_map[0]);
    if (rc == 0) rc = pool_map(dev, 1, p->l2_pool, p->pool_rows, p->inter, BM, &a.pool_map[1]);
    if (rc != 0) return rc;
    void* args[] = {&a};
    const cudaError_t err = cudaLaunchKernel((const void*)kern, dim3((unsigned)p->num_sms), dim3(megamoe::kThreads), args, smem, stream);
    return (int)err;
}

// Each (block_m, wide, CTAs per SM) has three instances: untraced (no trace code at all, kernel
// v9.13), traced (a launch with a trace capacity) and profile (fault_inject bit 32: consumer_role's
// PROF cycle counts; it traces too when asked); two at block_m 32, whose untraced launches run the
// traced instance (untraced_instance).
template <int BM, bool WIDE = false, int CTAS = 1>
static int launch_bm(const Params* p, cudaStream_t stream, size_t smem, int dev) {
    if (p->fault_inject & 32) return launch_instance<BM, true, WIDE, CTAS, true>(p, stream, smem, dev);
    if constexpr (megamoe::untraced_instance<BM>())
        if (p->trace_cap == 0) return launch_instance<BM, false, WIDE, CTAS, false>(p, stream, smem, dev);
    return launch_instance<BM, false, WIDE, CTAS, true>(p, stream, smem, dev);
}
template <int BM, bool WIDE = false, int CTAS = 1>
static cudaError_t preload_bm() {
    cudaFuncAttributes a;
    cudaError_t e = cudaSuccess;
    if constexpr (megamoe::untraced_instance<BM>())
        e = cudaFuncGetAttributes(&a, (const void*)megamoe::megamoe_sm90_kernel<BM, false, WIDE, CTAS, false>);
    if (e == cudaSuccess) e = cudaFuncGetAttributes(&a, (const void*)megamoe::megamoe_sm90_kernel<BM, false, WIDE, CTAS, true>);
    if (e == cudaSuccess) e = cudaFuncGetAttributes(&a, (const void*)megamoe::megamoe_sm90_kernel<BM, true, WIDE, CTAS, true>);
    return e;
}

namespace {
// A compile-time choice of the kernel at a run-time block_m, for the C exports below: f gets the
// block_m as a std::integral_constant (bm() is usable as a template argument); -1 for a block_m
// with no instance.
template <typename F>
int at_block_m(int block_m, F f) {
    switch (block_m) {
        case 16: return f(std::integral_constant<int, 16>{});
        case 32: return f(std::integral_constant<int, 32>{});
        case 64: return f(std::integral_constant<int, 64>{});
        case 128: return f(std::integral_constant<int, 128>{});
        default: return -1;
    }
}
}  // namespace

extern "C" {

int megamoe_sm90_abi_size() { return (int)sizeof(Params); }

long long megamoe_sm90_smem_bytes(int block_m, int stages, int num_experts) {
    return (long long)megamoe::smem_bytes(block_m, stages, num_experts);
}

// The L1 GEMM's activation fold width at this block_m (128 from kL1Fold128BlockM, else 64;
// mirrored by megamoe.design_sm90.L1_X_FOLD_K); -1 for an unsupported block_m.
int megamoe_sm90_l1_x_fold_k(int block_m) {
    return at_block_m(block_m, [](auto bm) { return bm() >= megamoe::kL1Fold128BlockM ? 128 : 64; });
}

// The combine's slot loads in flight per thread at this block_m (combine_slots, kernel v8.0;
// mirrored by megamoe.design_sm90.COMBINE_SLOTS); -1 for an unsupported block_m.
int megamoe_sm90_combine_slots(int block_m) {
    return at_block_m(block_m, [](auto bm) { return megamoe::combine_slots<bm()>(); });
}

// The combine's slot loads in flight per thread in the wide instance (kCombineSlotsWide, kernel
// v8.8; mirrored by megamoe.design_sm90.COMBINE_SLOTS_WIDE): a token's slots and their top-k
// indices loaded at once. Measured on the H200: 0.982x v8.7's kernel time at 1 token, 0.987 at 4
// and 12 (benchmarks/NOTES_kernel.md, session 33).
int megamoe_sm90_combine_slots_wide(void) { return megamoe::kCombineSlotsWide; }

// Whether the L1 epilogue's mask release is relayed to a dispatch lane at this block_m
// (relay_release, kernel v8.1; mirrored by megamoe.design_sm90.RELAY_RELEASE): 1 or 0; -1 for
// an unsupported block_m.
int megamoe_sm90_relay_release(int block_m) {
    return at_block_m(block_m, [](auto bm) { return megamoe::relay_release<bm()>() ? 1 : 0; });
}

// Stages of the ring's first fill a CTA keeps in flight at this block_m and CTA count (kernel
// v9.8, first_fill_per_sm; mirrored by megamoe.design_sm90.first_fill_stages): 0 = the whole
// ring at once; -1 for an unsupported block_m or CTA count.
int megamoe_sm90_first_fill(int block_m, int ctas_per_sm) {
    if (ctas_per_sm < 1 || ctas_per_sm > 2) return -1;
    return at_block_m(block_m, [&](auto bm) { return megamoe::first_fill_per_sm<bm()>() / ctas_per_sm; });
}

// Whether the consumers walk to their next block inside the epilogue at this block_m
// (walk_in_epilogue, kernel v9.0; mirrored by megamoe.design_sm90.WALK_IN_EPILOGUE): 1 or 0; -1
// for an unsupported block_m.
int megamoe_sm90_walk_in_epilogue(int block_m) {
    return at_block_m(block_m, [](auto bm) { return megamoe::walk_in_epilogue<bm()>() ? 1 : 0; });
}

// Whether the consumers take their blocks from the producer's block descriptors at this block_m
// (block_descriptors, kernel v9.1; mirrored by megamoe.design_sm90.BLOCK_DESCRIPTORS): 1 or 0; -1
// for an unsupported block_m.
int megamoe_sm90_block_descriptors(int block_m) {
    return at_block_m(block_m, [](auto bm) { return megamoe::block_descriptors<bm()>() ? 1 : 0; });
}

// Whether untraced launches run an instance without trace code at this block_m (untraced_instance,
// kernel v9.13; mirrored by megamoe.design_sm90.UNTRACED_INSTANCE): 1 or 0; -1 for an unsupported
// block_m.
int megamoe_sm90_untraced_instance(int block_m) {
    return at_block_m(block_m, [](auto bm) { return megamoe::untraced_instance<bm()>() ? 1 : 0; });
}

// Whether the CTAs take their blocks by ticket at ctas_per_sm CTAs per SM (the Producer's
// TICKETS, kernel v9.3; mirrored by megamoe.design_sm90.block_tickets): 1 at two, 0 at one; -1
// otherwise.
int megamoe_sm90_block_tickets(int ctas_per_sm) {
    return ctas_per_sm == 2 ? 1 : ctas_per_sm == 1 ? 0 : -1;
}

// Whether a launch runs the wide-walk instance (Scheduler's WIDE, kernel v8.7; mirrored by
// megamoe.design_sm90.wide_walk): block_m 16 with waves of more than 32 experts, 1 or 0; -1 for
// an unsupported block_m. Measured on the H200: 0.981x v8.6's kernel time at 1 token, 0.997 at 4;
// the same code in every instance cost ~0.5% at 16-256 tokens (benchmarks/NOTES_kernel.md).
int megamoe_sm90_wide_walk(int block_m, int experts_per_wave) {
    return at_block_m(block_m, [&](auto bm) { return bm() == 16 && experts_per_wave > 32 ? 1 : 0; });
}

// Whether a launch's EP1 dispatch counts every item in every CTA, with no count barrier
// (dispatch_pull's LOCAL, kernel v8.9; mirrored by megamoe.design_sm90.local_count): the wide
// instances at one rank, one CTA per SM or two (kernel v9.7; until then only one), 1 or 0; -1 for
// an unsupported block_m. (EP > 1 exchanges its counts over NVLink: dispatch_role_ep.)
int megamoe_sm90_local_count(int block_m, int experts_per_wave, int num_ranks) {
    const int wide = megamoe_sm90_wide_walk(block_m, experts_per_wave);
    return wide < 0 ? -1 : wide == 1 && num_ranks == 1 ? 1 : 0;
}

// k32 WGMMAs a consumer warpgroup keeps in flight per K block at this block_m
// (Sm90Tile::WGMMAS_IN_FLIGHT; mirrored by megamoe.design_sm90.WGMMAS_IN_FLIGHT); -1 for an
// unsupported block_m.
int megamoe_sm90_wgmmas_in_flight(int block_m) {
    return at_block_m(block_m, [](auto bm) { return megamoe::Sm90Tile<bm()>::WGMMAS_IN_FLIGHT; });
}

// The WGMMA N step at this block_m (Sm90Tile::WGMMA_N_STEP: a block's WGMMAs cover its valid rows
// rounded up to it; mirrored by megamoe.design_sm90.WGMMA_N_STEP); -1 for an unsupported block_m.
int megamoe_sm90_wgmma_n_step(int block_m) {
    return at_block_m(block_m, [](auto bm) { return megamoe::Sm90Tile<bm()>::WGMMA_N_STEP; });
}

// Producer warps that issue K blocks at this block_m (Producer::NW; mirrored by
// megamoe.design_sm90.PRODUCER_ISSUE_WARPS); -1 for an unsupported block_m.
int megamoe_sm90_producer_warps(int block_m) {
    return at_block_m(block_m, [](auto bm) { return megamoe::Producer<bm()>::NW; });
}

// Registers per thread of the dispatch, producer and consumer warpgroups (setmaxnreg; mirrored
// by megamoe.design_sm90.REGS_* and PAIR_REGS) at ctas_per_sm CTAs per SM (1, or 2: the CTAS = 2
// instance's split): which = 0, 1, 2; -1 otherwise.
int megamoe_sm90_role_registers_at(int which, int ctas_per_sm) {
    if (ctas_per_sm == 2) switch (which) {
        case 0: return (int)megamoe::kRegsPairDispatch;
        case 1: return (int)megamoe::kRegsPairProducer;
        case 2: return (int)megamoe::kRegsPairConsumer;
        default: return -1;
    }
    if (ctas_per_sm != 1) return -1;
    switch (which) {
        case 0: return (int)megamoe::kRegsDispatch;
        case 1: return (int)megamoe::kRegsProducer;
        case 2: return (int)megamoe::kRegsConsumer;
        default: return -1;
    }
}
int megamoe_sm90_role_registers(int which) { return megamoe_sm90_role_registers_at(which, 1); }

// Returns 0 or a cudaError_t; -1 bad block_m, -2 too many CTAs, -3 does not fit ctas_per_sm CTAs/SM,
// -4 shared memory over the device limit, -5 shape not supported, -6 bad EP parameters,
// -7 / -8 TMA descriptor encoding (pool_map), -9 no weight fold tables, -10 no FP32 token-scale
// pools, -11 two CTAs per SM where no instance runs them (block_m other than 16, or EP > 1).
int megamoe_sm90_launch(const Params* p_in, void* stream) {
    // Callers that zero the EP fields (an older mirror of Params) get the EP=1 meaning.
    Params q = *p_in;
    if (q.num_ranks < 1) q.num_ranks = 1;
    if (q.num_ranks == 1 && q.combine_rows == 0) q.combine_rows = q.num_tokens;
    if (q.ctas_per_sm < 1) q.ctas_per_sm = 1;
    const Params* p = &q;
    int dev = 0, sms = 0, max_smem = 0;
    if (p->device >= 0 && p->num_ranks > 1) {
        const cudaError_t e = cudaSetDevice((int)p->device);
        if (e != cudaSuccess) return (int)e;
    }
    cudaGetDevice(&dev);
    if (dev < 0 || dev >= kMaxDevices) return -2;
    if (g_dev[dev].sms == 0) {
        cudaDeviceGetAttribute(&g_dev[dev].max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
        cudaDeviceGetAttribute(&g_dev[dev].sms, cudaDevAttrMultiProcessorCount, dev);
        cudaDeviceGetAttribute(&g_dev[dev].sm_smem, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev);
        cudaDeviceGetAttribute(&g_dev[dev].reserved_smem, cudaDevAttrReservedSharedMemoryPerBlock, dev);
    }
    sms = g_dev[dev].sms;
    max_smem = g_dev[dev].max_smem;
    if (p->num_sms < 1 || p->num_sms > p->ctas_per_sm * sms) return -2;
    // two CTAs per SM: the CTAS = 2 instances only (block_m 16, one rank; with or without the wide walk)
    const bool wide16 = p->block_m == 16 && megamoe_sm90_wide_walk(16, (int)p->experts_per_wave) == 1;
    if (p->ctas_per_sm > 2 || (p->ctas_per_sm == 2 && (p->block_m != 16 || p->num_ranks != 1))) return -11;
    // at least one stage per producer warp (megamoe.design_sm90.min_stages: the warps' parity
    // waits on the empty barriers alias with fewer, and the ring is overwritten in use)
    const int min_stages = megamoe_sm90_producer_warps((int)p->block_m);
    if (p->hidden % 128 || p->inter % 128 || 2 * p->inter / 128 > 64 || p->num_experts > 512 ||
        p->num_experts < 1 || p->num_stages < min_stages || p->num_stages > megamoe::kMaxStages ||
        p->experts_per_wave < 1 || p->pool_rows % p->block_m)
        return -5;
    if (p->fold_table == nullptr || p->w1_row_scale == nullptr || p->w2_row_scale == nullptr) return -9;
    if (p->l1_pool_fsx == nullptr || p->l2_pool_fsx == nullptr) return -10;
    if (p->num_ranks < 1 || p->num_experts % p->num_ranks || p->num_experts / p->num_ranks > 256 ||
        p->rank < 0 || p->rank >= p->num_ranks || p->combine_rows < p->num_tokens ||
        (p->num_ranks > 1 && (p->peer_base == nullptr || p->epoch_counter == nullptr ||
                              p->send_count == nullptr ||
                              p->cta_hist == nullptr || p->pool_rank == nullptr)))
        return -6;
    const size_t smem = megamoe::smem_bytes((int)p->block_m, (int)p->num_stages, (int)p->num_experts);
    if (smem > (size_t)max_smem) return -4;
    if (p->ctas_per_sm == 2 && 2 * (smem + (size_t)g_dev[dev].reserved_smem) > (size_t)g_dev[dev].sm_smem) return -4;
    cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
    switch (p->block_m) {
        case 16:
            if (p->ctas_per_sm == 2 && wide16) return launch_bm<16, true, 2>(p, s, smem, dev);  // kernel v9.5
            if (p->ctas_per_sm == 2) return launch_bm<16, false, 2>(p, s, smem, dev);
            if (wide16) return launch_bm<16, true>(p, s, smem, dev);  // waves over several 32-expert chunks
            return launch_bm<16>(p, s, smem, dev);
        case 32: return launch_bm<32>(p, s, smem, dev);
        case 64: return launch_bm<64>(p, s, smem, dev);
        case 128: return launch_bm<128>(p, s, smem, dev);
        default: return -1;
    }
}

const char* megamoe_sm90_error_string(int code) {
    switch (code) {
        case -1: return "block_m must be 16, 32, 64 or 128";
        case -2: return "num_sms (CTAs) must be between 1 and the device's SM count times ctas_per_sm";
        case -3: return "kernel does not fit ctas_per_sm CTAs per SM";
        case -4: return "shared memory for these stages exceeds the device limit (per CTA, or per SM for two CTAs)";
        case -11: return "ctas_per_sm must be 1, or 2 at block_m 16 with one rank";
        case -5: return "unsupported shape (hidden, inter multiples of 128; 2*inter/128 <= 64; E <= 512; producer warps (4 at block_m 16-64, 2 at 128) <= stages <= 16)";
        case -7: return "cuTensorMapEncodeTiled not available from the CUDA driver (TMA descriptors need driver 12.0+)";
        case -8: return "the driver refused a TMA descriptor (pool address not 16-byte aligned, or hidden/inter/pool_rows out of range)";
        case -9: return "the weight fold is not set (fold_table, w1_row_scale, w2_row_scale: megamoe.kernel.runtime.sm90_weights)";
        case -10: return "the pools' FP32 token scales are not set (l1_pool_fsx, l2_pool_fsx: MegaMoEKernel's workspace)";
        case -6: return "bad expert-parallel parameters (R divides E, E/R <= 256, rank < R, combine_rows >= T, EP buffers and the call counter set)";
        default: return cudaGetErrorString((cudaError_t)code);
    }
}

// Load every template instance now (CUDA's lazy module loading would otherwise load one at its
// first launch, which can synchronize the device: fatal when R ranks share one GPU and the
// first rank's kernel waits for the second's). Returns 0 or a cudaError_t.
int megamoe_sm90_preload(void) {
    cudaError_t e = preload_bm<16>();
    if (e == cudaSuccess) e = preload_bm<32>();
    if (e == cudaSuccess) e = preload_bm<64>();
    if (e == cudaSuccess) e = preload_bm<128>();
    if (e == cudaSuccess) e = preload_bm<16, true>();
    if (e == cudaSuccess) e = preload_bm<16, false, 2>();
    if (e == cudaSuccess) e = preload_bm<16, true, 2>();
    return (int)e;
}

// CUDA IPC fallback for the EP symmetric buffer (when torch's symmetric memory is unavailable).
int megamoe_ipc_malloc(void** ptr, unsigned long long bytes, int device) {
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess) e = cudaMalloc(ptr, (size_t)bytes);
    if (e == cudaSuccess) e = cudaMemset(*ptr, 0, (size_t)bytes);
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    return (int)e;
}
int megamoe_ipc_handle(void* ptr, void* handle_out /* 64 bytes */) {
    cudaIpcMemHandle_t h;
    const cudaError_t e = cudaIpcGetMemHandle(&h, ptr);
    if (e == cudaSuccess) memcpy(handle_out, &h, sizeof(h));
    return (int)e;
}
int megamoe_ipc_open(const void* handle /* 64 bytes */, void** ptr, int device) {
    cudaError_t e = cudaSetDevice(device);
    cudaIpcMemHandle_t h;
    memcpy(&h, handle, sizeof(h));
    if (e == cudaSuccess) e = cudaIpcOpenMemHandle(ptr, h, cudaIpcMemLazyEnablePeerAccess);
    return (int)e;
}

}  // extern "C"
