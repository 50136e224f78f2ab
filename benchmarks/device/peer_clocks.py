"""SM clock and power while this kernel and FlagGems' fused MoE run back to back, in phases.

``peer_ab.py`` found both implementations 5-8% slower at 8192 tokens right after a FlagGems
call than right after one of ours (H200, session 20, benchmarks/NOTES_kernel.md). This reads
what the GPU reports meanwhile: a thread samples the SM clock and the power draw through NVML
(``pynvml``, the ``nvidia-ml-py`` package) every 20 ms while the phases run for ``seconds`` each, in the order ours, FlagGems, ours, FlagGems
(EP1, V4-Flash shape, one token count). Per phase it reports the calls' mean time, the
median SM clock and power over the phase's samples, and those of its first and last 0.5 s;
writes them as JSON. Nothing here sets a clock or a power limit.

Usage: python benchmarks/device/peer_clocks.py OUT.json [tokens, default 8192] [seconds per
phase, default 3]. Needs a CUDA GPU of compute capability 9.0, ``pynvml`` and ``flag_gems``
importable.
"""
import json
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from megamoe.errors import OneLineArgumentParser
from megamoe.kernel import MegaMoEKernel, prepare_weights
from megamoe.kernel.timing import int_at_least


def main() -> int:
    ap = OneLineArgumentParser(description="SM clock and power per phase (see the module docstring)")
    ap.add_argument("out", type=Path, help="JSON file to write")
    ap.add_argument("tokens", nargs="?", default="8192", help="token count (default 8192)")
    ap.add_argument("seconds", nargs="?", default="3", help="seconds per phase (default 3)")
    a = ap.parse_args()
    with ap.input_errors():
        T = int_at_least(a.tokens, "tokens", 1)
    try:
        secs = float(a.seconds)
    except ValueError:
        secs = 0.0
    if not 0.5 <= secs <= 60:
        ap.error(f"seconds: expected a number in [0.5, 60], got {a.seconds!r}")
    from kernel_bench import (  # the FP8 peer's shape is the run's
        E,
        H,
        I,
        K,
        dequantized_bf16,
        flaggems_peer,
    )
    fg = flaggems_peer(ap, a.out)
    try:
        import pynvml
        pynvml.nvmlInit()
    except Exception as e:  # noqa: BLE001 - ImportError or an NVML error
        ap.error(f"pynvml: expected NVML through the nvidia-ml-py package, got {type(e).__name__}: {e}")
    import torch

    from megamoe.kernel.check import make_inputs, make_weights

    ours = MegaMoEKernel(E, K, H, I, T, prepare_weights(*make_weights(E, H, I, "cuda", seed=11)))
    x, xs, idx, tw = make_inputs(T, E, K, H, "cuda", seed=100 + T)
    xb = dequantized_bf16(x, xs)
    impls = {"ours": lambda: ours(x, xs, idx, tw), "flaggems": lambda: fg(xb, idx, tw)}
    for fn in impls.values():  # warm-up (FlagGems' Triton compile)
        fn()
    torch.cuda.synchronize()
    nv = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
    samples, stop = [], threading.Event()

    def sample():  # (time, SM MHz, W)
        while not stop.is_set():
            samples.append((time.time(), pynvml.nvmlDeviceGetClockInfo(nv, pynvml.NVML_CLOCK_SM),
                            pynvml.nvmlDeviceGetPowerUsage(nv) / 1e3))
            time.sleep(0.02)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    time.sleep(1.0)
    phases = []
    for name in ("ours", "flaggems", "ours", "flaggems"):
        fn, calls, t0, batches = impls[name], 0, time.time(), []  # batches: (end time, us per call)
        a_ev, b_ev = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a_ev.record()
        while time.time() - t0 < secs:
            tb = time.time()
            for _ in range(4):
                fn()
            calls += 4
            torch.cuda.synchronize()
            batches.append((time.time(), (time.time() - tb) * 1e6 / 4))
        b_ev.record()
        b_ev.synchronize()
        phases.append({"impl": name, "t0": t0, "t1": time.time(), "calls": calls, "batches": batches,
                       "us_per_call": a_ev.elapsed_time(b_ev) * 1e3 / calls})
    stop.set()
    th.join()
    res = {"device": torch.cuda.get_device_name(), "tokens": T, "seconds_per_phase": secs, "samples": len(samples),
           "phases": []}
    for p in phases:
        def med(lo, hi, col):
            v = [s[col] for s in samples if lo <= s[0] < hi]
            return statistics.median(v) if v else None
        row = {k: p[k] for k in ("impl", "calls", "us_per_call")}
        first = [us for t, us in p["batches"] if t < p["t0"] + 0.5]
        last = [us for t, us in p["batches"] if t >= p["t1"] - 0.5]
        row.update(us_per_call_first_half_s=statistics.median(first) if first else None,
                   us_per_call_last_half_s=statistics.median(last) if last else None)
        row.update(sm_mhz=med(p["t0"], p["t1"], 1), power_w=med(p["t0"], p["t1"], 2),
                   sm_mhz_first_half_s=med(p["t0"], p["t0"] + 0.5, 1), sm_mhz_last_half_s=med(p["t1"] - 0.5, p["t1"], 1),
                   power_w_first_half_s=med(p["t0"], p["t0"] + 0.5, 2), power_w_last_half_s=med(p["t1"] - 0.5, p["t1"], 2))
        res["phases"].append(row)
        print(json.dumps(row), flush=True)
    a.out.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
