"""Device run for issue 7 with expert parallelism: EP2 kernel traces in the shared schema.

    python -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/device/traces_ep2.py

V4-Flash, 2 ranks (one GPU each, NVLink), tokens per rank 1 / 64 / 512 / 2048 / 8192 (or argv[1]), uniform routing
from megamoe.routing (seed 0), each rank's launch numbers from the plan of design
megamoe-sm90 (design_from_plan). Both ranks launch right after a barrier; each rank's
records are timed from its own first record (%globaltimer is per GPU), so cross-rank skew of
the launches (microseconds) is not removed. Rank 0 writes $OUT/kernel_flash_ep2_t<T>.npz with
the scenario in ``meta`` and both ranks' top-k ids.
"""

from __future__ import annotations

import os
import statistics
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, ".")
from megamoe.kernel import design_from_plan  # noqa: E402
from megamoe.kernel.build import library_path
from megamoe.kernel.check import make_inputs, make_weights  # noqa: E402
from megamoe.kernel.ep import MegaMoEKernelEP, local_weights  # noqa: E402
from megamoe.kernel.timing import cuda_times_us  # noqa: E402
from megamoe.kernel.trace import to_schema  # noqa: E402
from megamoe.scenario import Scenario  # noqa: E402

OUT = os.environ.get("OUT", "/tmp/out")
E, K, H, I = 256, 6, 4096, 2048
TOKENS = [int(t) for t in (sys.argv[1] if len(sys.argv) > 1 else "1,64,512,2048,8192").split(",")]


def main() -> None:
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rank, R = dist.get_rank(), dist.get_world_size()
    os.makedirs(OUT, exist_ok=True)
    w = make_weights(E, H, I, "cuda", seed=0)
    ep = MegaMoEKernelEP(E, K, H, I, max(TOKENS), local_weights(*w, rank, R))
    for T in TOKENS:
        sc = Scenario(shape="deepseek-v4-flash", num_ranks=R, tokens_per_rank=T, max_tokens_per_rank=max(TOKENS),
                      design="megamoe-sm90", hardware="h200")
        plan = sc.plan(torch.cuda.get_device_properties(local).multi_processor_count, 232448)
        ids = sc.routing_ids()
        x, xs, _, tw = make_inputs(T, E, K, H, "cuda", seed=1 + rank)
        idx = torch.from_numpy(ids[rank]).to("cuda", torch.int32)
        d = design_from_plan(plan, rank)
        ep(x, xs, idx, tw, design=d)
        ep.check()
        ts = cuda_times_us(lambda: ep(x, xs, idx, tw, design=d), 5, before_each=dist.barrier)
        ep.check()
        dist.barrier()
        _, recs = ep(x, xs, idx, tw, design=d, trace=True)
        allrecs = [None] * R
        dist.all_gather_object(allrecs, recs)
        times = [None] * R
        dist.all_gather_object(times, statistics.median(ts))
        if rank == 0:
            tr = to_schema([r for rr in allrecs for r in rr])
            tr.meta = {**sc.to_dict(), "source": "kernel", "device": torch.cuda.get_device_name(0),
                       "kernel_build": library_path("sm_90a").parent.name,
                       "num_sms": plan.num_sms, "kernel_us_median_untraced_per_rank": times,
                       "plan_per_rank": [{"block_m": rp.config.block_m, "experts_per_wave": rp.experts_per_wave,
                                          "num_stages": rp.num_stages, "wgmma_n_step": rp.wgmma_n_step}
                                         for rp in plan.ranks],
                       "clock": "per rank: %globaltimer from that rank's first record; launches after a barrier"}
            tr.meta["plan"] = tr.meta["plan_per_rank"][0]  # what megamoe compare reads
            tr.topk_idx = list(ids)
            tr.save_npz(f"{OUT}/kernel_flash_ep2_t{T}.npz")
            print({"tokens_per_rank": T, "us_per_rank": times, "records": len(tr),
                   "makespan_us": tr.makespan_ns / 1e3}, flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
