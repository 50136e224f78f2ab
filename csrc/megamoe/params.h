// megamoe: kernel parameters shared by the host launcher and the device code.
// Every field is 8 bytes so that the Python ctypes mirror (megamoe/kernel/_abi.py)
// has no padding questions. Plan numbers (block_m, stages, experts per wave, SMs)
// are inputs: the kernel never re-derives them.
#pragma once
#include <stdint.h>

namespace megamoe {

struct Params {
    // Shapes
    int64_t num_tokens;        // T
    int64_t hidden;            // H  (multiple of 128)
    int64_t inter;             // I  (multiple of 128, 2I/128 <= 64)
    int64_t num_experts;       // E  (<= 512)
    int64_t topk;              // K
    // Plan numbers (megamoe.plan / megamoe.design_sm90)
    int64_t block_m;           // 16, 32, 64 or 128 (template instance)
    int64_t num_stages;        // pipeline stages in shared memory
    int64_t experts_per_wave;  // scheduler wave width
    int64_t num_sms;           // persistent grid size: CTAs (ctas_per_sm per SM)
    int64_t pool_rows;         // pool capacity in rows (multiple of block_m)
    int64_t timeout_ns;        // every wait gives up after this long
    int64_t trace_cap;         // trace records per CTA (0 = tracing off)
    int64_t fault_inject;      // 0 = none; 1 = dispatch never bumps arrival counts (timeout test);
                               // SM90 timing experiments (wrong outputs): 2 no MMA, 8 no weight loads,
                               // 64 no token-tile loads, 128 no token-scale loads; 32 profile counters;
                               // 256 two CTAs per SM with the static deal instead of tickets (v9.2's
                               // order; right outputs)
    double clamp;              // SwiGLU activation clamp; +inf = none
    // Inputs
    const uint8_t* x;          // [T, H] E4M3
    const uint8_t* x_sf;       // [T, H/32] UE8M0
    const int32_t* topk_idx;   // [T, K], -1 = masked slot
    const float* topk_w;       // [T, K]
    // Weights: SM90 the tiles of megamoe.layouts.transform_weights_for_sm90 (w1 [E, 2I/128,
    // H/128, 128, 64], w1_sf [.., 128, 4]; w2, w2_sf the same over [E, H/128, I/128]); SM100 the
    // layout of megamoe.kernel.sm100. Checkpoint shapes: w1 [E, 2I, H/2] packed E2M1 (low
    // nibble = even k), w1_sf [E, 2I, H/32] UE8M0, w2 [E, H, I/2], w2_sf [E, H, I/32].
    const uint8_t* w1;
    const uint8_t* w1_sf;
    const uint8_t* w2;
    const uint8_t* w2_sf;
    // Workspace (zeroed once at allocation; the kernel leaves it clean)
    uint8_t* l1_pool;          // [pool_rows, H]
    uint8_t* l1_pool_sf;       // [H/128][pool_rows][4]  (k-block major)
    uint8_t* l2_pool;          // [pool_rows, I]
    uint8_t* l2_pool_sf;       // [I/128][pool_rows][4]
    int32_t* pool_token;       // [pool_rows]
    int32_t* pool_slot;        // [pool_rows]
    float* pool_weight;        // [pool_rows]
    unsigned long long* expert_count;  // [E]: (CTAs that reported << 32) | tokens, what the schedulers
                                       // poll; EP1 [2E + 2]: then the counts the CTAs add up [E], the
                                       // CTAs whose counts are in [1] (roles_shared.cuh dispatch_pull) and
                                       // the block ticket [1] (two CTAs per SM, kernel_sm90.cu Producer)
    uint32_t* arrival;         // [pool_rows / block_m] rows pulled per pool block
    unsigned long long* mask;  // [pool_rows / block_m] L1 N blocks finished per pool block
    uint32_t* grid_sync;       // [1]
    uint32_t* error;           // [8] first error: code, cta, role, expert, m, n, k, observed
    int32_t* item_pos;         // [T*K] scratch: rank of item among its CTA's items of the same expert
    uint16_t* combine_buf;     // [K, T, H] BF16
    uint16_t* y;               // [T, H] BF16
    // Trace
    unsigned long long* trace; // [num_sms, trace_cap, 6] (48-byte records)
    uint32_t* trace_count;     // [2, num_sms]: records from each CTA's bottom (trace_reserve), from its top (SM90 consumer)
    // Debug progress words (may be null): [num_sms][8], see PROGRESS in megamoe/kernel/runtime.py
    uint32_t* progress;
    // ---- expert parallelism (megamoe/kernel/ep.py). num_ranks == 1: none of this is read and the
    // kernel runs the EP=1 path unchanged. num_ranks > 1: rank r owns experts
    // [r*E/R, (r+1)*E/R); w1..w2_sf hold those local experts only; x, x_sf, topk_w and combine_buf
    // point into this rank's symmetric buffer, whose layout is identical on every rank, so a peer's
    // copy of a field is at peer_base[j] + off_<field>.
    int64_t combine_rows;      // T dimension of combine_buf [K, combine_rows, H] (EP1: T; EP: max tokens)
    int64_t device;            // CUDA device to launch on (-1: the current one)
    int64_t num_ranks;         // R (1 = single GPU)
    int64_t rank;              // this rank
    int64_t off_x, off_x_sf, off_topk_w, off_src_idx, off_recv_count, off_combine, off_flag;
    const unsigned long long* peer_base;  // [R] base address of every rank's symmetric buffer
    unsigned long long* send_count;       // [E] (CTAs that reported << 32) | items this rank sends to expert e
    int32_t* cta_hist;                    // [num_sms, E] items of each CTA per expert (ascending source order)
    int32_t* pool_rank;                   // [pool_rows] source rank of each pool row (token source metadata)
    int64_t* epoch_counter;               // [1] calls this rank completed (device memory): the call's number
                                          // (NVLink barrier targets) is *epoch_counter + 1, and CTA 0 adds one
                                          // after the last NVLink barrier, so a captured CUDA graph replays it
    // Symmetric buffer fields (byte offsets above):
    //   flag       u64 [R]              NVLink barrier arrivals of each rank's CTAs (monotonic)
    //   recv_count i32 [E/R, R]         items source rank s sends to local expert e
    //   x, x_sf, topk_w                 this rank's tokens [max_tokens, ...]
    //   src_idx    i32 [E/R, R, max_tokens]  source-index table: token*K+slot on rank s, ascending
    //   combine    bf16 [K, max_tokens, H]   L2 rows written by the expert owners
    // ---- SM90 weight fold (megamoe.layouts.fold_e2m1_scales_for_sm90; the SM100 kernel reads none
    // of it): w1_sf / w2_sf then hold fold-table offsets (8 d per 32-group) instead of UE8M0 bytes.
    const float* w1_row_scale;            // [E, 2I] 2^(s_max - 133) per L1 row (gate/up interleaved order)
    const float* w2_row_scale;            // [E, H]
    const uint8_t* fold_table;            // [20][8] E4M3 bytes of the E2M1 magnitudes x 2^(6 - d)
    // ---- SM90 token scales as FP32, one per 64-K group (the value of the group's first scale
    // byte above): [K/128][pool_rows / block_m][2][block_m], so that a pool block's two groups of a
    // K block are one contiguous 8 x block_m-byte slab the producer bulk-copies with the stage and
    // the consumers read as they promote (written by the pulls and the L1 epilogue beside the
    // bytes; the SM100 kernel reads none of it).
    float* l1_pool_fsx;                   // [H/128][pool_rows / block_m][2][block_m]
    float* l2_pool_fsx;                   // [I/128][pool_rows / block_m][2][block_m]
    // ---- EP1 dispatch (roles_shared.cuh dispatch_pull; the EP dispatch reads none of it)
    int32_t* item_order;                  // [T*K] scratch: each CTA's items sorted by expert (stable)
    // ---- CTAs per SM (SM90 kernel v9.2): 2 runs num_sms CTAs two to an SM (the block_m 16 instance
    // without the wide walk, EP1: megamoe.design_sm90.ctas_per_sm); 0 (an older mirror) means 1
    int64_t ctas_per_sm;
};

enum ErrorCode : uint32_t {
    kErrNone = 0,
    kErrTimeoutArrival = 1,    // L1 producer waited for a pool block's arrival count
    kErrTimeoutMask = 2,       // L2 producer waited for a pool block's L1 N-block bits
    kErrTimeoutCounts = 3,     // waited for every CTA's expert counts
    kErrTimeoutGridSync = 4,   // grid sync before combine
    kErrTimeoutPipeline = 5,   // shared-memory pipeline barrier (full/empty)
    kErrPoolOverflow = 6,      // pool capacity too small for the routed items
    kErrBadExpert = 7,         // topk_idx outside [-1, E)
    kErrTimeoutNvlBarrier = 8, // NVLink barrier (EP): expert = barrier (1 dispatch, 2 combine), m = rank, n = peer
    kErrSrcOverflow = 9,       // EP: more than max_tokens items from one rank to one expert, or a bad table entry
};

enum Role : uint32_t { kRoleDispatch = 0, kRoleProducer = 1, kRoleConsumer = 2 };
enum Kind : uint32_t {
    kKindCount = 0, kKindIndexExchange = 1, kKindGridSync = 2, kKindNvlBarrier = 3, kKindPull = 4,
    kKindL1Load = 5, kKindL1Mma = 6, kKindL1Epilogue = 7, kKindL2Load = 8, kKindL2Mma = 9,
    kKindL2Epilogue = 10, kKindCombine = 11, kKindIdleWait = 12,
};

}  // namespace megamoe
