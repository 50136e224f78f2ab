"""Where the EP call's host time goes (issue 6): cProfile of back-to-back calls on each rank.

    python -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/device/ep_host_profile.py OUT.txt

V4-Flash, 1 token per rank (the call's host work does not depend on it), 50 calls issued back
to back after one warm call, the inputs copied by the call (as ep_bench's per-call row). Also
the wall time per call without the profiler. Rank 0 writes the top functions by own time.
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, ".")
from megamoe.kernel.check import make_inputs, make_weights  # noqa: E402
from megamoe.kernel.ep import MegaMoEKernelEP  # noqa: E402
from megamoe.kernel.runtime import prepare_weights  # noqa: E402

E, K, H, I = 256, 6, 4096, 2048


def main() -> None:
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rank, R = dist.get_rank(), dist.get_world_size()
    w = make_weights(E // R, H, I, "cuda", seed=11 + rank)
    kern = MegaMoEKernelEP(E, K, H, I, 64, prepare_weights(*w))
    x, xs, idx, tw = make_inputs(1, E, K, H, "cuda", seed=3 + rank)
    kern(x, xs, idx, tw)
    kern.check()
    dist.barrier()
    t = time.perf_counter()
    for _ in range(50):
        kern(x, xs, idx, tw)
    host = (time.perf_counter() - t) / 50 * 1e6
    torch.cuda.synchronize()
    dist.barrier()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(50):
        kern(x, xs, idx, tw)
    prof.disable()
    torch.cuda.synchronize()
    kern.check()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
    text = f"rank {rank}: host time per call (no profiler, back to back) {host:.1f} us\n" + s.getvalue()
    texts = [None] * R
    dist.all_gather_object(texts, text)
    if rank == 0:
        with open(sys.argv[1] if len(sys.argv) > 1 else "ep_host_profile.txt", "w") as f:
            f.write("\n".join(texts))
        print(texts[0][:3000])
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
