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

template <int BLOCK_M>
struct Scheduler {
    int num_experts, experts_per_wave, num_sms, num_l1_n, num_l2_n, num_l1_k, num_l2_k;
    int next_phase = kPhaseL1;
    int expert = 0, num_tokens = 0, pool_block_offset = 0;
    int block_idx;
    uint32_t counts[kMaxExpertsPerLane];  // lane l holds expert i*32+l

    __device__ __forceinline__ Scheduler(const Params& p) {
        num_experts = (int)(p.num_ranks > 1 ? p.num_experts / p.num_ranks : p.num_experts);  // local experts (EP1: all)
        experts_per_wave = (int)p.experts_per_wave; num_sms = (int)p.num_sms;
        num_l1_n = (int)(2 * p.inter / 128); num_l2_n = (int)(p.hidden / 128);
        num_l1_k = (int)(p.hidden / 128); num_l2_k = (int)(p.inter / 128);
        block_idx = blockIdx.x;
    }

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

    __device__ __forceinline__ int get_num_tokens(int e) const {
        uint32_t v = 0;
        #pragma unroll
        for (int i = 0; i < kMaxExpertsPerLane; ++i)
            v = (e == i * 32 + (int)lane_id()) ? counts[i] : v;
        return (int)__shfl_sync(0xffffffffu, v, e & 31);
    }
    __device__ __forceinline__ int get_pool_block_offset(int e) const {
        uint32_t n = 0;
        #pragma unroll
        for (int i = 0; i < kMaxExpertsPerLane; ++i)
            if (i * 32 + (int)lane_id() < e) n += (counts[i] + BLOCK_M - 1) / BLOCK_M;
        return (int)__reduce_add_sync(0xffffffffu, n);
    }
    __device__ __forceinline__ int num_m_blocks() const { return (num_tokens + BLOCK_M - 1) / BLOCK_M; }
    __device__ __forceinline__ void set_expert(int e) {
        expert = e;
        num_tokens = e < num_experts ? get_num_tokens(e) : 0;
        pool_block_offset = get_pool_block_offset(e);
    }
    // First expert >= from with at least one token (num_experts if none). Whole warp.
    __device__ __forceinline__ int next_nonempty(int from) const {
        #pragma unroll
        for (int i = 0; i < kMaxExpertsPerLane; ++i) {
            const int e = i * 32 + (int)lane_id();
            const uint32_t m = __ballot_sync(0xffffffffu, e >= from && e < num_experts && counts[i] != 0u);
            if (m) return i * 32 + __ffs(m) - 1;
        }
        return num_experts;
    }
    // Next expert of this wave, stepping over empty ones at once (they have no blocks and no
    // pool blocks, so the block sequence is unchanged; stepping one at a time cost ~170 ns
    // per expert on the H200, 40 us per block walk at 1 token). Stops at the wave's end.
    __device__ __forceinline__ void advance_expert() {
        pool_block_offset += num_m_blocks();
        const int we = wave_end();
        expert = min(next_nonempty(expert + 1), we);
        num_tokens = expert < num_experts ? get_num_tokens(expert) : 0;
    }
    __device__ __forceinline__ int wave_end() const {
        const int end = (expert / experts_per_wave + 1) * experts_per_wave;
        return end < num_experts ? end : num_experts;
    }

    // Next block of this CTA; phase == kPhaseNone when done. One walk for both phases: skip
    // whole experts while the index is past their m x n blocks, then the block is (m, n) of
    // the current expert; a wave's L1 blocks are followed by its L2 blocks (the index starts
    // again at the wave's first expert), then the next wave's L1 blocks.
    __device__ __forceinline__ Block next() {
        while (expert < num_experts) {
            const bool l1 = next_phase == kPhaseL1;
            const int num_n = l1 ? num_l1_n : num_l2_n;
            const int we = wave_end();
            while (expert < we && block_idx >= num_m_blocks() * num_n) {
                block_idx -= num_m_blocks() * num_n;
                advance_expert();
            }
            if (expert < we) {
                Block b;
                const int m = block_idx / num_n;
                b.phase = l1 ? kPhaseL1 : kPhaseL2; b.expert = expert; b.m_block = m; b.n_block = block_idx - m * num_n;
                b.num_k_blocks = l1 ? num_l1_k : num_l2_k; b.pool_block = pool_block_offset + m;
                b.valid_m = min(num_tokens - m * BLOCK_M, BLOCK_M);
                block_idx += num_sms;
                return b;
            }
            if (l1) {
                next_phase = kPhaseL2;
                set_expert(((expert - 1) / experts_per_wave) * experts_per_wave);  // the wave's first expert
            } else {
                next_phase = kPhaseL1;
            }
        }
        Block none;
        none.phase = kPhaseNone; none.expert = 0; none.m_block = 0; none.n_block = 0;
        none.num_k_blocks = 0; none.pool_block = 0; none.valid_m = 0;
        return none;
    }
};

}  // namespace megamoe
