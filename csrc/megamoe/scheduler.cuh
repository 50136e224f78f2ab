// megamoe: the block scheduler. Same rule as DeepGEMM's MegaMoEScheduler (PR #304):
// a block index that starts at blockIdx.x and advances by the number of SMs; per wave of
// `experts_per_wave` experts, first every L1 block (m-major over the 2I/BLOCK_N n blocks),
// then every L2 block (m-major over the H/BLOCK_N n blocks); the index carries over from
// one phase to the next. Every warp that needs the block sequence runs its own copy (it is
// deterministic). Architecture-neutral.
#pragma once
#include "common.cuh"

namespace megamoe {

constexpr int kMaxExpertsPerLane = 8;  // E <= 256

enum Phase : int { kPhaseNone = 0, kPhaseL1 = 1, kPhaseL2 = 2 };

struct Block {
    int phase, expert, m_block, n_block, num_k_blocks, pool_block, valid_m;
};

template <int BLOCK_M, bool WIDE = false>
struct Scheduler {
    // The plan numbers are read from the kernel parameters where they are used (constant
    // memory, no registers: the producer warps run this walk on 64 registers).
    const Params& prm;
    int num_experts;         // local experts (EP1: all); a division, so kept
    int phase = kPhaseL1;    // the phase being walked in the current wave
    int wave = 0;            // first expert of the current wave
    int wave_pool = 0;       // pool blocks of the experts before the current wave
    int chunk = 0;           // first expert of the 32-expert chunk the walk is in (a multiple of 32)
    int mb_before = 0;       // m blocks of the wave's experts in the chunks before `chunk`
    int block_idx;           // this CTA's next block, counted within (wave, phase)
    uint32_t counts[kMaxExpertsPerLane];  // lane l holds expert i*32+l

    __device__ __forceinline__ Scheduler(const Params& p) : prm(p) {
        num_experts = (int)(p.num_ranks > 1 ? p.num_experts / p.num_ranks : p.num_experts);
        block_idx = blockIdx.x;
    }
    __device__ __forceinline__ int num_l1_n() const { return (int)(2 * prm.inter / 128); }
    __device__ __forceinline__ int num_l2_n() const { return (int)(prm.hidden / 128); }

    // Wait until every CTA reported its counts (high 32 bits == grid size). Whole warp.
    __device__ __forceinline__ bool fetch_counts(const Params& p, uint32_t role) {
        bool ok = true;
        #pragma unroll
        for (int i = 0; i < kMaxExpertsPerLane; ++i) {
            const int e = i * 32 + (int)lane_id();
            unsigned long long v = 0;
            // EP: the counts come after the NVLink barrier, whose own timeout must fire first.
            if (e < num_experts && ok)
                ok = wait_published(p, p.expert_count + e, v, e, role, p.num_ranks > 1 ? 2 * p.timeout_ns : p.timeout_ns);
            counts[i] = (uint32_t)v;
        }
        return __all_sync(0xffffffffu, ok);
    }

    // The counts from this CTA's own shared memory: hist[e] for every expert, written by the CTA's
    // dispatch warps (dispatch_pull's LOCAL count), read after their arrival at kSharedBarCounts.
    __device__ __forceinline__ void fetch_counts_shared(const int* hist) {
        #pragma unroll
        for (int i = 0; i < kMaxExpertsPerLane; ++i) {
            const int e = i * 32 + (int)lane_id();
            counts[i] = e < num_experts ? (uint32_t)hist[e] : 0u;
        }
    }

    // The count of this lane's expert c * 32 + lane (register select: c is warp-uniform).
    __device__ __forceinline__ uint32_t lane_count(int c) const {
        uint32_t v = 0;
        #pragma unroll
        for (int i = 0; i < kMaxExpertsPerLane; ++i) v = i == c ? counts[i] : v;
        return v;
    }

    // The m blocks of the wave whose first expert is w0 (whole warp; the wave-lag cursor of the
    // two-CTA producer, kernel v9.4).
    __device__ __forceinline__ int wave_m_blocks(int w0) const {
        const int we = min(w0 + (int)prm.experts_per_wave, num_experts);
        int total = 0;
        for (int c0 = w0 & ~31; c0 < we; c0 += 32) {
            const int e = c0 + (int)lane_id();
            const int cnt = (e >= w0 && e < we) ? (int)lane_count(c0 >> 5) : 0;
            total += (int)__reduce_add_sync(0xffffffffu, (unsigned)((cnt + BLOCK_M - 1) / BLOCK_M));
        }
        return total;
    }

    // Put the walk at block idx of pass (w0, ph), the wave starting at pool block pool: the next
    // call of next() returns that block (when idx is below the pass's blocks).
    __device__ __forceinline__ void seek(int ph, int w0, int pool, int idx) {
        phase = ph;
        wave = w0;
        wave_pool = pool;
        chunk = w0 & ~31;
        mb_before = 0;
        block_idx = idx;
    }

    // Next block of this CTA; phase == kPhaseNone when done. Whole warp. In each (wave,
    // phase) the blocks are every expert's m x n blocks (m-major over the phase's n blocks),
    // experts in order; the block index skips num_sms blocks per call and carries over from
    // a wave's L1 blocks to its L2 blocks and on to the next wave's L1 blocks. The expert that
    // holds the index is found at once: each lane takes one expert of a 32-expert chunk of
    // the wave, a warp scan sums their m blocks, and a ballot finds the first expert whose
    // running block count passes the index (walking expert by expert cost ~1-2 us per block
    // at small token counts, a ballot and shuffles per expert; benchmarks/NOTES_kernel.md).
    // The index only grows within a pass, so a call resumes at the chunk of the previous
    // block: one chunk scan per call, plus one per chunk or pass it moves past
    // (sim.engine.sm90_walk_steps counts them).
    __device__ __forceinline__ Block next() {
        const int lane = (int)lane_id();
        const int epw = (int)prm.experts_per_wave;
        while (wave < num_experts) {
            const bool l1 = phase == kPhaseL1;
            const int num_n = l1 ? num_l1_n() : num_l2_n();
            const int we = min(wave + epw, num_experts);
            for (; chunk < we; chunk += 32) {
                const int c0 = chunk, e = c0 + lane;
                const int cnt = (e >= wave && e < we) ? (int)lane_count(c0 >> 5) : 0;
                const int mb = (cnt + BLOCK_M - 1) / BLOCK_M;
                // WIDE (the instance launched where a wave spans several chunks): a chunk
                // the index is past costs one reduction, not the scan
                if constexpr (WIDE) {
                    if (we - wave > 32) {
                        const int total = (int)__reduce_add_sync(0xffffffffu, (unsigned)mb);
                        if ((mb_before + total) * num_n <= block_idx) {
                            mb_before += total;
                            continue;
                        }
                    }
                }
                int inc = mb;  // inclusive scan of m blocks over the lanes
                #pragma unroll
                for (int d = 1; d < 32; d <<= 1) {
                    const int t = __shfl_up_sync(0xffffffffu, inc, d);
                    if (lane >= d) inc += t;
                }
                const unsigned hit = __ballot_sync(0xffffffffu, (mb_before + inc) * num_n > block_idx);
                if (hit) {
                    const int L = __ffs(hit) - 1;
                    const int first_mb = mb_before + __shfl_sync(0xffffffffu, inc - mb, L);  // m blocks before it
                    const int local = block_idx - first_mb * num_n;
                    const int m = local / num_n;
                    Block b;
                    b.phase = phase; b.expert = c0 + L; b.m_block = m; b.n_block = local - m * num_n;
                    b.num_k_blocks = (int)((l1 ? prm.hidden : prm.inter) / 128);
                    b.pool_block = wave_pool + first_mb + m;
                    b.valid_m = min(__shfl_sync(0xffffffffu, cnt, L) - m * BLOCK_M, BLOCK_M);
                    block_idx += (int)prm.num_sms;
                    return b;
                }
                mb_before += __shfl_sync(0xffffffffu, inc, 31);
            }
            // (wave, phase) done: mb_before is the wave's m blocks
            block_idx -= mb_before * num_n;
            if (l1) {
                phase = kPhaseL2;
            } else {
                phase = kPhaseL1;
                wave_pool += mb_before;
                wave = we;
            }
            chunk = wave & ~31;
            mb_before = 0;
        }
        Block none;
        none.phase = kPhaseNone; none.expert = 0; none.m_block = 0; none.n_block = 0;
        none.num_k_blocks = 0; none.pool_block = 0; none.valid_m = 0;
        return none;
    }
};

}  // namespace megamoe
