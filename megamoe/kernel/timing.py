"""CUDA-event timing shared by the CLI, the benchmarks and ``megamoe calibrate``."""

from __future__ import annotations

import math


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


def cuda_steady_us(fn, calls: int, rounds: int = 1, warmup: int = 1, before_each=None) -> list[float]:
    """Steady-state GPU time per call, in microseconds: one CUDA event pair around ``calls``
    back-to-back calls, divided by ``calls``, for each of ``rounds`` rounds.

    :func:`cuda_times_us` times one call from an idle GPU, so the host's work before the launch
    (Python, argument checks, the launch itself) is inside its event pair: for the SM90 kernel
    68 us at 1 token and ~100 us at 64 tokens on the H200 (benchmarks/NOTES_kernel.md,
    fifteenth session). Back to back, the host enqueues the next call while the GPU runs this
    one, so what is left is the GPU's time plus the gap between launches (or the host's time
    per call, where the host cannot keep ahead).

    Each round starts with one untimed lead-in call, and the window opens when the lead-in
    ends on the GPU. Without it (until the forty-first session) every round's window held the
    first call's host latency too (an idle GPU waiting for the host), which added 1/``calls`` of
    it to every call (benchmarks/NOTES_kernel.md, forty-first session).

    ``before_each`` is called before every round, after the device is synchronized and outside
    the events (e.g. ``torch.distributed.barrier`` so that all ranks start together).

    Raises:
        ValueError: ``calls`` or ``rounds`` below 1.
    """
    import torch

    if calls < 1 or rounds < 1:
        raise ValueError(f"calls and rounds: expected >= 1, got {calls} and {rounds}")
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        if before_each is not None:
            before_each()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        fn()  # the lead-in: the window opens when it ends on the GPU, with the host already ahead
        a.record()
        for _ in range(calls):
            fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e3 / calls)
    return out


def cuda_graph_replay(fn, warmup: int = 2):
    """``fn`` (launches on the current CUDA stream, no host synchronization) captured as a CUDA
    graph; returns ``(replay, out)``: the graph's ``replay`` (no argument; the work with no host
    time per call, as a serving loop replays small batches) and what ``fn`` returned while it was
    captured (the tensors each replay writes). The ``warmup`` calls run first on a side stream,
    as ``torch.cuda.graph`` asks.

    Raises:
        RuntimeError: what capture raises for ``fn`` (an operation that synchronizes the host,
            e.g. a data-dependent output size)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph.replay, out


def kernel_durations_us(fn, calls: int, name_contains: str) -> list[float]:
    """The GPU durations (microseconds) of the kernels whose name contains ``name_contains``
    that ``calls`` calls of ``fn`` launch, from the CUDA activity records of ``torch.profiler``
    (CUPTI timestamps of each kernel's start and end on the GPU): no host time, no launch gap.
    Other kernels (e.g. a memset before the launch) are not counted.

    Raises:
        RuntimeError: no such kernel was recorded (a wrong name, or a torch without CUPTI).
    """
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    times = device_times_of(prof.events(), name_contains)
    if not times:
        raise RuntimeError(f"kernel_durations_us: no CUDA kernel named like {name_contains!r} was recorded")
    return times


def median_kernel_us(fn, calls: int = 5, name_contains: str = "megamoe_sm90_kernel") -> float:
    """The median of :func:`kernel_durations_us` over ``calls`` calls of ``fn``: one call's GPU
    time (us) for the A/B scripts and benchmarks, by default the SM90 mega-kernel's.

    Raises:
        RuntimeError: as :func:`kernel_durations_us`.
    """
    import statistics

    return statistics.median(kernel_durations_us(fn, calls, name_contains))


def device_times_of(events, name_contains: str) -> list[float]:
    """Device durations (us) of the CUDA events (``torch.profiler`` ``FunctionEvent``s: ``name``,
    ``device_type``, ``device_time_total``) whose name contains ``name_contains``, in recorded order."""
    out = []
    for e in events:
        if getattr(getattr(e, "device_type", None), "name", "") == "CUDA" and name_contains in e.name:
            out.append(float(e.device_time_total))
    return out


def alternating_rounds(fns: dict, rounds: int, measure, after_round=None) -> list[dict[str, float]]:
    """Paired timing of two (or more) variants in ABBA order: in each of ``rounds`` rounds,
    ``measure(fn)`` of every ``fns`` entry, in the dict's order in even rounds and reversed in
    odd ones, so that a drift between rounds cancels in the per-round ratios; then
    ``after_round()`` if given (e.g. a kernel's error check, or draining its trace buffer).
    Returns one ``{name: measure}`` dict per round.

    Raises:
        ValueError: ``rounds`` below 1.
    """
    if rounds < 1:
        raise ValueError(f"rounds: expected >= 1, got {rounds}")
    items = list(fns.items())
    out = []
    for r in range(rounds):
        out.append({name: measure(fn) for name, fn in (items if r % 2 == 0 else items[::-1])})
        if after_round is not None:
            after_round()
    return out


def crossover_ratios(rounds: list[dict[str, float]]) -> tuple[list[float], list[float]]:
    """Per round of a crossover A/B (two builds ``new`` / ``old`` run on two kernel objects
    ``0`` / ``1``, each with its own buffers, every build on every object): the ratio of the
    builds' times with the objects' own difference cancelled, ``sqrt(new@0 * new@1 / (old@0 *
    old@1))``, and the objects' ratio with the builds' difference cancelled, ``sqrt(new@0 *
    old@0 / (new@1 * old@1))``. Each round is a dict with the keys ``new@0``, ``old@1``,
    ``new@1``, ``old@0`` (times, any unit). Why: in one process the object that ran this
    tree's build was 2-4% slower than the other at 1024-4096 tokens whichever build it ran
    (H200, session 20, benchmarks/NOTES_kernel.md): a plain paired ratio carries that bias.

    Raises:
        ValueError: a round without one of the four keys, or a time that is not positive.
    """
    builds, objs = [], []
    for i, r in enumerate(rounds):
        try:
            t = {k: float(r[k]) for k in ("new@0", "new@1", "old@0", "old@1")}
        except KeyError as e:
            raise ValueError(f"rounds[{i}]: expected the keys new@0, new@1, old@0, old@1, got {sorted(r)}") from e
        if min(t.values()) <= 0:
            raise ValueError(f"rounds[{i}]: expected positive times, got {t}")
        builds.append(math.sqrt(t["new@0"] * t["new@1"] / (t["old@0"] * t["old@1"])))
        objs.append(math.sqrt(t["new@0"] * t["old@0"] / (t["new@1"] * t["old@1"])))
    return builds, objs


def require_sm90_gpu(ap) -> None:
    """For the device scripts, after their arguments are checked: an error of the argparse parser
    ``ap`` (one line, exit code 2, e.g. :class:`megamoe.errors.OneLineArgumentParser`) when torch
    does not import, or when no CUDA GPU of compute capability 9.0 or more is visible to it
    (:func:`megamoe.kernel.runtime.cuda_available`)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        ap.error("torch: expected it importable (pip install torch), got missing")
    from .runtime import cuda_available

    if not cuda_available():
        ap.error("device: expected a CUDA GPU of compute capability 9.0 (the SM90 kernel), got none")


def int_at_least(text: str, field: str, lo: int) -> int:
    """A benchmark script's integer argument ``text`` (the option named ``field``), at least ``lo``.

    Raises:
        InputError: ``field``: not an integer, or below ``lo``.
    """
    from ..errors import InputError
    try:
        v = int(text)
    except ValueError:
        v = None
    if v is None or v < lo:
        raise InputError(field, f"an integer >= {lo}", repr(text))
    return v


def token_counts(text: str, field: str = "tokens") -> list[int]:
    """A benchmark's ``--tokens`` text (or another option's, named ``field``), comma-separated
    token counts (``"64,1024"``), as ints.

    Raises:
        InputError: ``field``: an entry that is not an integer >= 1, or none at all.
    """
    from ..errors import InputError
    try:
        tokens = [int(t) for t in text.split(",")]
    except ValueError:
        tokens = []
    if not tokens or min(tokens) < 1:
        raise InputError(field, "comma-separated integers >= 1", repr(text))
    return tokens
