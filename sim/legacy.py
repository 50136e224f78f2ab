"""The non-overlapped 5-stage path on the same hardware model, for "speedup vs legacy".

DeepGEMM PR #316's "speedup vs legacy" compares with DeepEP dispatch + grouped FP8xFP4 GEMM
+ SwiGLU/requant kernel + grouped GEMM + DeepEP combine (shared/anchors/README.md).  Each
stage here is one kernel that starts after the previous one ends on every rank (the
all-to-alls synchronise ranks), so a stage costs its slowest rank:

1. dispatch: FP8 rows + scales + top-k weights to the expert owners over NVLink (per GPU
   egress / ingress), local rows over HBM, plus a notify barrier;
2. L1 grouped GEMM: ``max(FLOPs / tensor rate, bytes / HBM)`` with per-expert M padded to
   128 rows (contiguous grouped layout);
3. SwiGLU + requant: read BF16 ``[recv, 2I]``, write FP8 ``[recv, I]`` + scales;
4. L2 grouped GEMM (as 2);
5. combine: BF16 rows back over NVLink, then the top-k reduction over HBM, plus a barrier.
Every kernel adds ``legacy_launch_ns``; each all-to-all (dispatch, combine) adds
``legacy_a2a_latency_ns`` (fitted on B200 to PR #316's speedup column, see the TOML).
At one rank there is no all-to-all (no DeepEP): dispatch and combine are one local kernel each,
the permute of the rows into expert order (read and write over HBM) and the top-k reduction, with
neither the all-to-all latency nor the NVLink barrier (until the forty-fourth session the model
charged both at one rank too, 2 x 29 us on the H200 preset).
"""

from __future__ import annotations

import numpy as np

from megamoe.plan import Plan, ceil_div


def legacy_time_ns(plan: Plan, hw, topk_idx: list[np.ndarray]) -> dict:
    """Stage times (ns, slowest rank each) and ``total_ns`` of the unfused path: ``dispatch_ns``,
    ``l1_gemm_ns``, ``swiglu_ns``, ``l2_gemm_ns``, ``combine_ns`` (floats). ``topk_idx``: one
    ``[T_r, top_k]`` int array of expert ids per rank (-1 masked)."""
    R, H, I = plan.num_ranks, plan.hidden, plan.intermediate
    counts = np.stack([rp.recv_counts for rp in plan.ranks])  # [dst, e, src]
    row = H * (1 + 1 / 32) + 4
    sent = counts.sum(axis=1)  # [dst, src]
    remote = sent * (1 - np.eye(R, dtype=np.int64))
    egress = remote.sum(axis=0) * row  # by src
    ingress = remote.sum(axis=1) * row  # by dst
    local = np.diag(sent) * row
    nvl, hbm = hw.nvlink_bytes_per_ns, hw.hbm_bytes_per_ns
    launch = hw.legacy_launch_ns
    a2a = hw.legacy_a2a_latency_ns + hw.nvl_barrier_ns if R > 1 else 0.0  # one rank: no all-to-all
    dispatch = launch + a2a + max(
        float(np.max(np.maximum(egress, ingress))) / nvl, float(np.max(2 * local)) / hbm)
    tc_gpu = hw.tc_flops_per_ns_per_sm * plan.num_sms
    l1 = l2 = act = 0.0
    for rp in plan.ranks:
        n = rp.tokens_per_expert
        padded = float(sum(ceil_div(int(x), 128) * 128 for x in n))
        recv = float(n.sum())
        touched = int((n > 0).sum())
        l1 = max(l1, max(2 * padded * 2 * I * H / tc_gpu,
                         (touched * 2 * I * H / 2 + recv * H + recv * 2 * I * 2) / hbm))
        act = max(act, (recv * 2 * I * 2 + recv * I * (1 + 1 / 32)) / hbm)
        l2 = max(l2, max(2 * padded * I * H / tc_gpu,
                         (touched * H * I / 2 + recv * I + recv * H * 2) / hbm))
    back = remote.T * H * 2  # BF16 rows back to the source ranks
    comb_nvl = float(np.max(np.maximum(back.sum(axis=0), back.sum(axis=1)))) / nvl
    reduce = max((int((ids >= 0).sum()) + len(ids)) * H * 2 / hbm for ids in topk_idx)
    combine = launch + a2a + comb_nvl + reduce
    stages = {"dispatch_ns": dispatch, "l1_gemm_ns": l1 + launch, "swiglu_ns": act + launch,
              "l2_gemm_ns": l2 + launch, "combine_ns": combine}
    stages["total_ns"] = sum(stages.values())
    return stages
