"""``megamoe calibrate``: measure what the hardware model needs on this GPU, write a TOML.

Micro-benchmarks (torch on the GPU; each the median of repeated CUDA-event timings):

* HBM: ``copy_`` of a 2 GiB buffer (bytes read + written per second) -> ``hbm_efficiency``
  against the base file's datasheet ``hbm_gbs``;
* FP8 tensor rate: ``torch._scaled_mm`` e4m3 8192^3 with BF16 output -> ``mma_efficiency``;
* NVLink (two or more GPUs): peer copy of 1 GiB from GPU 0 to GPU 1 -> ``nvlink_efficiency``;
  the time of a 4 KiB peer copy -> ``nvlink_latency_ns`` (an upper bound: it includes the
  copy launch);
* device facts: SM count, opt-in shared memory per block, L2 size.

Figures the kernel itself reveals come from its traces (no GPU needed once they exist):

* :func:`from_kernel_trace` (one trace, ``--kernel-trace``): the first grid sync's last
  arrival to first release -> ``grid_sync_ns``; the consumers' time per K block (see
  :func:`sm90_k_block_ns`) less the base file's fixed per-K-block cost (E2M1 decode + stage
  hand-off), against the FP8 GEMM rate -> ``sm90_mma_fraction``.
* :func:`fit_sm90_traces` (several traces of this project's SM90 kernel, at least two
  ``block_m``, and optionally the per-role cycle profile of ``benchmarks/device/profile_stages.py``):
  every SM90 figure of the H200 model — the K-block time as a line in ``block_m`` (slope ->
  ``sm90_mma_fraction``; intercept -> ``e2m1_decode_thread_ns_per_elem`` from the profile's
  decode share plus ``stage_handoff_ns``), the L1 epilogue as a line in ``block_m``
  (``l1_epilogue_thread_ns_per_elem``, ``block_overhead_ns``), the L2 epilogue through the
  origin (``l2_epilogue_thread_ns_per_elem``), ``pull_latency_ns`` and ``grid_sync_ns``.
  ``sim/hardware/h200.toml`` holds its output (``tests/test_calibrate.py`` checks that).

The SM90 model has no term for the consumers' per-block scheduler step (the gap between one
block's epilogue and the next block's first MMA, 1.6-2.5 us on the H200); the fit spreads it
over the K blocks of an L1 + L2 block pair, so that the model's block period is the kernel's.

Everything else is kept from the base file with its source.  Every measured figure's source
names the device, the date and the method.
"""

from __future__ import annotations

import datetime
import json
import statistics
import tomllib

from megamoe.errors import InputError, require

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


def _median(x) -> float:
    import numpy as np

    return float(np.median(x)) if len(x) else float("nan")


def _grid_sync_ns(t) -> float | None:
    """The first grid sync of every SM: from the last arrival to the first release (the
    interval lengths themselves include waiting for slower SMs)."""
    import numpy as np

    gs = t.where(kind="grid_sync")
    if not len(gs):
        return None
    firsts = [np.argmin(np.where(gs["sm"] == s, gs["t_start_ns"], np.inf)) for s in np.unique(gs["sm"])]
    return float(max(0.0, gs["t_end_ns"][firsts].min() - gs["t_start_ns"][firsts].max()))


def _block_gaps_ns(t) -> list:
    """Consumer idle time between a block's epilogue end and the next block's first MMA, per
    rank and SM (the kernel's scheduler step and trace records; the SM90 model has no term
    for it)."""
    import numpy as np

    from megamoe.trace import KIND

    mma = (KIND["l1_mma"], KIND["l2_mma"])
    epi = (KIND["l1_epilogue"], KIND["l2_epilogue"])
    c = t.where(role="consumer")
    gaps = []
    for rank, sm in sorted(set(zip(c["rank"].tolist(), c["sm"].tolist()))):
        s = c.where(rank=rank, sm=sm)
        o = np.argsort(s["t_start_ns"], kind="stable")
        k, st, en = s["kind"][o], s["t_start_ns"][o], s["t_end_ns"][o]
        gaps += [float(st[i] - en[i - 1]) for i in range(1, len(o)) if k[i] in mma and k[i - 1] in epi]
    return gaps


def sm90_k_block_ns(t, with_gap: bool = True) -> float:
    """Consumer time per K block of one SM90 kernel trace: the median L1 and L2 K loops (and,
    with ``with_gap``, the median scheduler gap once per block of each phase) over the K
    blocks of one L1 + L2 block pair (``hidden / 128 + intermediate / 128``)."""
    from megamoe.design_sm90 import BLOCK_K
    from megamoe.trace import KIND

    meta = t.meta
    kb1, kb2 = int(meta["hidden"]) // BLOCK_K, int(meta["intermediate"]) // BLOCK_K
    d = t["t_end_ns"] - t["t_start_ns"]
    loops = sum(_median(d[t["kind"] == KIND[k]]) for k in ("l1_mma", "l2_mma"))
    gap = 2.0 * _median(_block_gaps_ns(t)) if with_gap else 0.0
    return (loops + gap) / (kb1 + kb2)


def _fraction_of_rate(slope_ns_per_row: float, fp8_gemm_tflops: float, num_sms: int) -> float:
    """``sm90_mma_fraction`` from the K-block time's growth per block row (FLOP of one row of
    one K block: 2 x 128 weight rows x 128 K) against the GEMM rate spread over the SMs."""
    from megamoe.design_sm90 import BLOCK_K, BLOCK_N

    per_sm = fp8_gemm_tflops * 1e3 / num_sms  # FLOP per ns of one SM at the GEMM rate
    return float(min(1.0, 2.0 * BLOCK_N * BLOCK_K / slope_ns_per_row / per_sm))


def from_kernel_trace(path: str, fp8_gemm_tflops: float, base: str = "h200") -> dict:
    """Figures from one kernel trace (NPZ, :mod:`megamoe.trace`): ``grid_sync_ns`` and
    ``sm90_mma_fraction`` (see module docstring; the fixed per-K-block cost comes from the
    ``base`` preset)."""
    from megamoe.design_sm90 import BLOCK_K, BLOCK_N, CONSUMER_WARPS
    from megamoe.trace import Trace

    from .hardware import load_hardware

    t = Trace.load(path)
    out = {}
    gs = _grid_sync_ns(t)
    if gs is not None:
        out["grid_sync_ns"] = gs
    meta = t.meta or {}
    if len(t.where(kind="l1_mma")) and len(t.where(kind="l2_mma")) and fp8_gemm_tflops > 0 and "hidden" in meta:
        hw = load_hardware(base)
        bm = int(meta.get("plan", {}).get("block_m", 128))
        fixed = hw.e2m1_decode_thread_ns_per_elem * BLOCK_N * BLOCK_K / (32 * CONSUMER_WARPS) + hw.stage_handoff_ns
        mma = sm90_k_block_ns(t) - fixed
        if mma > 0:
            out["sm90_mma_fraction"] = _fraction_of_rate(mma / bm, fp8_gemm_tflops, int(meta.get("num_sms", 132)))
    return out


def _line(xs, ys) -> tuple[float, float]:
    """Least-squares intercept and slope of ys over xs."""
    import numpy as np

    slope, icpt = np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)
    return float(icpt), float(slope)


def fit_sm90_traces(paths: list[str], profile: dict | None = None, fp8_gemm_tflops: float | None = None,
                    base: str = "h200") -> dict:
    """Fit the SM90 figures of the hardware model to kernel traces (see module docstring).

    Args:
        paths: kernel traces (NPZ) of this project's SM90 kernel with at least two block_m.
        profile: the per-role cycle profile (``kernel_profile_stages_h200.json``: per token
            count, the consumer's cycle fractions); its entries of 64 tokens or more give
            the decode share of the K block.  Without it the base decode figure is kept.
        fp8_gemm_tflops: the measured FP8 GEMM rate (default: the base preset's
            ``fp8_dense_tflops x mma_efficiency``).

    Returns:
        figure name -> (value, how it was fitted: the numbers behind it).

    Raises:
        InputError: fewer than two distinct block_m among the traces.
    """
    import numpy as np

    from megamoe.design_sm90 import BLOCK_K, BLOCK_N, CONSUMER_WARPS, block_m_for
    from megamoe.trace import KIND, Trace

    from .engine import DISPATCH_WARPS_PER_SM
    from .hardware import load_hardware

    hw = load_hardware(base)
    rate = fp8_gemm_tflops or hw.fp8_dense_tflops * hw.mma_efficiency
    threads = 32 * CONSUMER_WARPS
    rows = []
    for p in paths:
        t = Trace.load(p)
        meta = t.meta
        d = t["t_end_ns"] - t["t_start_ns"]
        med = {k: _median(d[t["kind"] == KIND[k]]) for k in ("l1_epilogue", "l2_epilogue", "pull")}
        rows.append({"tokens": int(meta["tokens_per_rank"][0]), "bm": int(meta["plan"]["block_m"]),
                     "k": sm90_k_block_ns(t), "loop": sm90_k_block_ns(t, with_gap=False),
                     "gap": _median(_block_gaps_ns(t)), "epi1": med["l1_epilogue"], "epi2": med["l2_epilogue"],
                     "pull": med["pull"], "grid_sync": _grid_sync_ns(t), "num_sms": int(meta["num_sms"]),
                     "kb": (int(meta["hidden"]) + int(meta["intermediate"])) // BLOCK_K,
                     "top_k": int(meta["top_k"]), "experts": int(meta["num_experts"])})
    bms = sorted({r["bm"] for r in rows})
    require(len(bms) >= 2, "fit_sm90_traces", "traces of at least two block_m", bms)
    num_sms = rows[0]["num_sms"]
    out = {}
    names = ", ".join(f"T={r['tokens']}" for r in rows)

    # K block: a line in block_m (the MMA grows with the tokens, WGMMA's N; the decode does not)
    a, b = _line([r["bm"] for r in rows], [r["k"] for r in rows])
    pts = "; ".join(f"{r['k']:.0f} ns at block_m {r['bm']} (T={r['tokens']}; K loops {r['loop']:.0f} ns + "
                    f"scheduler gap {2 * r['gap'] / r['kb']:.0f} ns)" for r in rows)
    how = (f"per-K-block consumer time {a:.0f} ns + {b:.2f} ns per block row ({pts}); the slope is "
           f"{2 * BLOCK_N * BLOCK_K / b * num_sms / 1e3:.0f} TFLOP/s over {num_sms} SMs = this fraction of the "
           f"{rate:.0f} TFLOP/s FP8 GEMM")
    out["sm90_mma_fraction"] = (_fraction_of_rate(b, rate, num_sms), how)
    per_thread = BLOCK_N * BLOCK_K / threads  # E2M1 elements one consumer thread decodes per K block
    decode_ns = hw.e2m1_decode_thread_ns_per_elem * per_thread
    if profile:
        a0, b0 = _line([r["bm"] for r in rows], [r["loop"] for r in rows])
        shares = []
        for e in profile.values():
            if e["T"] < 64:
                continue  # at 1 token the consumer mostly waits (the profile's full-stage share)
            bm = block_m_for(e["T"] * rows[0]["top_k"] / rows[0]["experts"])
            share = e["c_decode_bar_frac"] / (e["c_decode_bar_frac"] + e["c_mma_frac"] + e["c_wait_full_frac"])
            shares.append((e["T"], share, share * (a0 + b0 * bm)))
        if shares:
            decode_ns = float(np.mean([s[2] for s in shares]))
            decode_how = ("decode + warpgroup barrier share of the K loop (c_decode_bar / (c_decode_bar + c_mma + "
                          "c_wait_full)) x the K-loop time per K block at that block_m: "
                          + ", ".join(f"T={T} {100 * s:.1f}% = {ns:.0f} ns" for T, s, ns in shares)
                          + f"; mean {decode_ns:.0f} ns over {per_thread:.0f} elements per thread")
            out["e2m1_decode_thread_ns_per_elem"] = (decode_ns / per_thread, decode_how)
    gaps = ", ".join(f"{r['gap'] / 1e3:.2f}" for r in rows)
    how = (f"the {a:.0f} ns intercept of the per-K-block time less the decode ({decode_ns:.0f} ns): the fixed "
           f"part of WGMMA wait + promotion, full-stage waits, and the per-block scheduler gap (median {gaps} us "
           f"at {names}) spread over the {rows[0]['kb']} K blocks of an L1 + L2 block pair")
    out["stage_handoff_ns"] = (a - decode_ns, how)
    # L1 epilogue: a line in block_m; the intercept is the fixed hand-off (amax reduction,
    # fence, 256-thread barrier, arrival-mask release)
    a1, b1 = _line([r["bm"] for r in rows], [r["epi1"] for r in rows])
    epi1 = ", ".join(f"{r['epi1'] / 1e3:.2f} us at T={r['tokens']} (block_m {r['bm']})" for r in rows)
    how = f"median L1 epilogue {epi1}: {b1:.1f} ns per block row over {threads} consumer threads"
    out["l1_epilogue_thread_ns_per_elem"] = (b1 * threads / BLOCK_N, how)
    how = (f"intercept in block_m of the median L1 epilogue ({epi1}): the fixed hand-off (top-k weight loads, "
           f"amax reduction, fence, 256-thread barrier, arrival-mask release)")
    out["block_overhead_ns"] = (a1, how)
    # L2 epilogue: through the origin, least squares in relative error
    c = np.array([r["bm"] * BLOCK_N / threads / r["epi2"] for r in rows])
    epi2 = ", ".join(f"{r['epi2'] / 1e3:.2f} us at T={r['tokens']} (block_m {r['bm']})" for r in rows)
    how = f"median L2 epilogue {epi2}, through the origin, least squares in relative error"
    out["l2_epilogue_thread_ns_per_elem"] = (float(c.sum() / (c * c).sum()), how)
    # pulls: rounds of num_sms x 4 concurrent warps, each a latency plus one 4 KiB chunk
    big = max(rows, key=lambda r: r["tokens"])
    rounds = -(-big["tokens"] * big["top_k"] // (big["num_sms"] * DISPATCH_WARPS_PER_SM))
    chunk = 4096 / (hw.sm_load_gbs / DISPATCH_WARPS_PER_SM)
    how = (f"median per-SM pull {big['pull'] / 1e3:.1f} us at T={big['tokens']} = {rounds} rounds of "
           f"{big['num_sms'] * DISPATCH_WARPS_PER_SM} concurrent pulls, less one 4 KiB chunk ({chunk:.0f} ns) per round")
    out["pull_latency_ns"] = (big["pull"] / rounds - chunk, how)
    gss = [r["grid_sync"] for r in rows if r["grid_sync"] is not None]
    if gss:
        out["grid_sync_ns"] = (float(np.median(gss)),
                               "last arrival to first release of the first grid sync: "
                               + ", ".join(f"{g / 1e3:.2f} us" for g in gss) + ", median")
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
