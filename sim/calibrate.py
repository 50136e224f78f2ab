"""``megamoe calibrate``: measure what the hardware model needs on this GPU, write a TOML.

Micro-benchmarks (torch on the GPU; each the median of repeated CUDA-event timings):

* HBM: ``copy_`` of a 2 GiB buffer (bytes read + written per second) -> ``hbm_efficiency``
  against the base file's datasheet ``hbm_gbs``;
* FP8 tensor rate: ``torch._scaled_mm`` e4m3 8192^3 with BF16 output -> ``mma_efficiency``;
* NVLink (two or more GPUs): peer copy of 1 GiB from GPU 0 to GPU 1 -> ``nvlink_efficiency``;
  the time of a 4 KiB peer copy -> ``nvlink_latency_ns`` (an upper bound: it includes the
  copy launch);
* device facts: SM count, opt-in shared memory per block, L2 size.

Figures the kernel itself reveals come from one of its traces (``--kernel-trace``): the
first grid sync's last arrival to first release -> ``grid_sync_ns``; the consumers' L1 K-loop rate on full
128-row blocks against the FP8 GEMM rate -> ``mma_sync_fraction``.  Everything else is kept
from the base file with its source.  Every measured figure's source names the device, the
date and the method.
"""

from __future__ import annotations

import datetime
import json
import statistics
import tomllib

from megamoe.errors import InputError

from .hardware import PRESET_DIR, parse_hardware


def _time_cuda(fn, repeat: int = 10, warmup: int = 2) -> float:
    """Median seconds of ``fn()`` over ``repeat`` runs, timed with CUDA events."""
    from megamoe.kernel.timing import cuda_times_us

    return statistics.median(cuda_times_us(fn, repeat, warmup)) / 1e6


def measure(gemm_n: int = 8192, copy_bytes: int = 2 << 30) -> dict:
    """Run the micro-benchmarks on the current CUDA device.

    Raises:
        InputError: no CUDA device visible to torch.
    """
    try:
        import torch
    except ImportError:
        raise InputError("calibrate", "torch with CUDA", "torch not installed") from None
    if not torch.cuda.is_available():
        raise InputError("calibrate", "a CUDA GPU visible to torch", "none")
    dev = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(dev)
    out = {"device": props.name, "num_sms": props.multi_processor_count,
           "l2_cache_bytes": int(getattr(props, "L2_cache_size", 0)),
           "smem_per_block_bytes": int(getattr(props, "shared_memory_per_block_optin", 0)),
           "num_gpus": torch.cuda.device_count()}
    src = torch.empty(copy_bytes // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    t = _time_cuda(lambda: dst.copy_(src))
    out["copy_gbs"] = 2 * src.numel() / t / 1e9
    del src, dst
    a = torch.randn(gemm_n, gemm_n, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(gemm_n, gemm_n, device="cuda").to(torch.float8_e4m3fn).t()
    one = torch.ones((), device="cuda")
    t = _time_cuda(lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
    out["fp8_gemm_tflops"] = 2 * gemm_n ** 3 / t / 1e12
    del a, b
    if out["num_gpus"] >= 2:
        x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda:0")
        y = torch.empty_like(x, device="cuda:1")
        t = _time_cuda(lambda: y.copy_(x, non_blocking=True))
        out["p2p_gbs"] = x.numel() / t / 1e9
        xs, ys = x[:4096], y[:4096]
        out["p2p_small_copy_ns"] = _time_cuda(lambda: ys.copy_(xs, non_blocking=True), repeat=50) * 1e9
    return out


def from_kernel_trace(path: str, fp8_gemm_tflops: float) -> dict:
    """Figures from a kernel trace (NPZ, :mod:`megamoe.trace`): ``grid_sync_ns`` and
    ``mma_sync_fraction`` (see module docstring)."""
    import numpy as np

    from megamoe.trace import Trace

    t = Trace.load(path)
    out = {}
    gs = t.where(kind="grid_sync")
    if len(gs):
        # the first grid sync of every SM: from the last arrival to the first release (the
        # interval lengths themselves include waiting for slower SMs)
        firsts = [np.argmin(np.where(gs["sm"] == s, gs["t_start_ns"], np.inf)) for s in np.unique(gs["sm"])]
        out["grid_sync_ns"] = float(max(0.0, gs["t_end_ns"][firsts].min() - gs["t_start_ns"][firsts].max()))
    meta = t.meta or {}
    mma = t.where(kind="l1_mma")
    full = mma.select(mma["tokens"] == int(meta.get("plan", {}).get("block_m", 128)))
    if len(full) and fp8_gemm_tflops > 0 and "hidden" in meta:
        bm = int(meta.get("plan", {}).get("block_m", 128))
        flops = 2.0 * bm * 128 * int(meta["hidden"])
        per_sm = flops / np.median(full["t_end_ns"] - full["t_start_ns"])  # FLOP/ns on one SM
        gpu = per_sm * int(meta.get("num_sms", 132)) / 1e3  # TFLOP/s if every SM did so
        out["mma_sync_fraction"] = float(min(1.0, gpu / fp8_gemm_tflops))
    return out


def calibrated_toml(base: str, measured: dict, kernel: dict | None = None, date: str | None = None) -> str:
    """A hardware TOML: the base preset with measured figures replaced (sources say how).

    Raises:
        InputError: the result does not validate (e.g. a measured figure <= 0).
    """
    path = PRESET_DIR / f"{base.lower()}.toml"
    if not path.exists():
        raise InputError("calibrate --base", "a preset (b200, h200, h20)", base)
    data = tomllib.loads(path.read_text())
    figs, srcs = dict(data["figures"]), dict(data["sources"])
    date = date or datetime.date.today().isoformat()
    where = f"measured by megamoe calibrate on {measured.get('device', 'the GPU')}, {date}"

    def put(key, value, how):
        figs[key] = value
        srcs[key] = f"{where}: {how}"

    for key in ("num_sms", "l2_cache_bytes", "smem_per_block_bytes"):
        if measured.get(key):
            put(key, int(measured[key]), "device properties")
    if "copy_gbs" in measured:
        put("hbm_efficiency", round(min(1.0, measured["copy_gbs"] / figs["hbm_gbs"]), 4),
            f"copy_ of 2 GiB at {measured['copy_gbs']:.0f} GB/s / {figs['hbm_gbs']:.0f} GB/s datasheet")
    if "fp8_gemm_tflops" in measured:
        put("mma_efficiency", round(min(1.0, measured["fp8_gemm_tflops"] / figs["fp8_dense_tflops"]), 4),
            f"torch._scaled_mm e4m3 8192^3 at {measured['fp8_gemm_tflops']:.0f} TFLOP/s / "
            f"{figs['fp8_dense_tflops']:.0f} dense peak")
    if "p2p_gbs" in measured:
        put("nvlink_efficiency", round(min(1.0, measured["p2p_gbs"] / figs["nvlink_gbs_per_direction"]), 4),
            f"peer copy of 1 GiB GPU0->GPU1 at {measured['p2p_gbs']:.0f} GB/s")
    if "p2p_small_copy_ns" in measured:
        put("nvlink_latency_ns", round(measured["p2p_small_copy_ns"], 1), "4 KiB peer copy (upper bound)")
    for key, value in (kernel or {}).items():
        put(key, round(value, 4), "from a megamoe kernel trace")
    lines = [f'# Calibrated from {base} by megamoe calibrate ({date}, {measured.get("device", "?")}).',
             f'name = {json.dumps(data["name"])}', "", "[figures]"]
    lines += [f"{k} = {v!r}" for k, v in figs.items()]
    lines += ["", "[sources]"]
    lines += [f"{k} = {json.dumps(srcs[k])}" for k in figs]  # JSON strings are TOML basic strings
    text = "\n".join(lines) + "\n"
    parse_hardware(tomllib.loads(text))  # the file must load
    return text
