"""CUDA-event timing shared by the CLI, the benchmarks and ``megamoe calibrate``."""

from __future__ import annotations


def cuda_times_us(fn, reps: int, warmup: int = 0, before_each=None) -> list[float]:
    """Time ``fn()`` ``reps`` times with CUDA events; returns each call's time in microseconds.

    Args:
        fn: the work to time (launches on the current CUDA stream).
        reps: timed calls.
        warmup: untimed calls first; the device is synchronized before timing starts.
        before_each: called before every timed call, outside the timed region (e.g.
            ``torch.distributed.barrier`` so that all ranks start together).
    """
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        if before_each is not None:
            before_each()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return times
