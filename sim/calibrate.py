"""``megamoe calibrate``: measure what the hardware model needs on this GPU, write a TOML.

Micro-benchmarks (torch on the GPU; each the median of repeated CUDA-event timings):

* HBM: ``copy_`` of a 2 GiB buffer (bytes read + written per second) -> ``hbm_efficiency``
  against the base file's datasheet ``hbm_gbs``;
* FP8 tensor rate: ``torch._scaled_mm`` e4m3 8192^3 with BF16 output -> ``mma_efficiency``;
* NVLink (two or more GPUs): peer copy of 1 GiB from GPU 0 to GPU 1 -> ``nvlink_efficiency``
  (``nvlink_latency_ns``, the excess of a remote load round trip over a local one, is not a
  copy time: it comes from EP kernel traces, :func:`fit_sm90_ep_traces`, and is kept from
  the base file here);
* device facts: SM count, opt-in shared memory per block, L2 size.

Figures the kernel itself reveals come from its traces (no GPU needed once they exist):

* :func:`from_kernel_trace` (one trace, ``--kernel-trace``): the last grid sync's (before the
  combine) last arrival to first release -> ``grid_sync_ns``; the consumers' time per K block (see
  :func:`sm90_k_block_ns`) less the base file's fixed per-K-block cost (E2M1 decode + stage
  hand-off), against the FP8 GEMM rate -> ``sm90_mma_fraction``.
* :func:`fit_sm90_traces` (several traces of this project's SM90 kernel, at least two
  ``block_m``, and optionally the per-role cycle profile of ``benchmarks/device/profile_stages.py``):
  every SM90 figure of the H200 model — the K-block time with two promotions (mean of the
  median L1 and L2 K loops per K block; the L2 one alone where the L1 K block is promoted
  once, kernel v7.6) as a line in ``block_m`` (slope -> ``sm90_mma_fraction``; intercept ->
  ``e2m1_decode_thread_ns_per_elem`` from the profile's decode share plus
  ``stage_handoff_ns``), the L2 K block less the L1 one where that is promoted once, per row
  (``sm90_promotion_ns_per_row``), the producer's time to issue one K block's loads with its stage
  free (``sm90_issue_kblock_ns``: the first L1 block of every CTA, where the ring is empty;
  traces whose producer the ring paces are left out), the consumers' gap between blocks: its
  fixed part where they walk inside the epilogue (``sched_ahead_ns``,
  :data:`megamoe.design_sm90.WALK_IN_EPILOGUE`) and the whole gap where they read the producer's
  block descriptors (``sched_desc_ns``, :data:`megamoe.design_sm90.BLOCK_DESCRIPTORS`), the
  L1 epilogue as a line in ``block_m`` (``l1_epilogue_thread_ns_per_elem``,
  ``block_overhead_ns``), the L2 epilogue as a line in block_m + valid rows
  (``l2_epilogue_fixed_ns``, ``l2_epilogue_thread_ns_per_elem``), ``pull_latency_ns`` from
  the pull time per round, ``combine_round_ns``, ``grid_sync_ns``, and the dispatch's start up to
  its count barrier as a line in the largest CTA's share of the ``T k`` items: the first pull's
  start (median over CTAs) less ``grid_sync_ns`` (``sm90_count_ns``, ``sm90_count_item_ns``).
* :func:`fit_sm90_ep_traces` (EP traces of the same kernel, two or more ranks): the NVLink
  round trip of a remote pull (``nvlink_latency_ns``: per trace, a CTA's pull time, which is
  its dispatch warp 0's items one after another, by least squares over that warp's local
  and remote items; the remote item's excess over a local one, median over the traces, over
  the remote pull's ``sim.engine.SM90_REMOTE_ROUND_TRIPS`` dependent round trips) and what an
  L2 epilogue takes with several ranks beyond the one-rank line (``l2_epilogue_ep_ns``,
  least squares in relative error; the rows' destination rank does not change it).
* :func:`fit_tma_probe` (the copy-engine probe, ``benchmarks/device/tma_probe.cu``): a weight
  tile's copy latency with every SM loading (``tma_latency_ns``) and the most one SM's engine
  streamed alone (``sm_load_gbs``).
* :func:`refit_h200` runs the probe's fit, then those fits on the committed EP1 traces and per-role profile, then
  on the committed EP2 traces, and writes the figures and their sources into
  ``sim/hardware/h200.toml`` (``python -m sim.calibrate``); ``tests/test_calibrate.py``
  checks that the file is its output.

Everything else is kept from the base file with its source.  Every measured figure's source
names the device, the date and the method.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import statistics
import tomllib
from pathlib import Path

from megamoe.errors import InputError, require, shown_text

from .hardware import PRESET_DIR, parse_hardware, preset_names, preset_path, resolve_base


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
    return out


def _median(x) -> float:
    import numpy as np

    return float(np.median(x)) if len(x) else float("nan")


def _grid_sync_ns(t) -> float | None:
    """The grid sync before the combine (every SM's last grid-sync record): from the last
    arrival to the first release (the interval lengths themselves include waiting for slower
    SMs). (Until kernel v7.9 the first one, the count barrier; its records now start after
    the dispatch's sort, which runs while the other CTAs publish, so a CTA can arrive there
    after the first release.)"""
    import numpy as np

    gs = t.where(kind="grid_sync")
    if not len(gs):
        return None
    lasts = [np.argmax(np.where(gs["sm"] == s, gs["t_start_ns"], -np.inf)) for s in np.unique(gs["sm"])]
    return float(max(0.0, gs["t_end_ns"][lasts].min() - gs["t_start_ns"][lasts].max()))


def _sm90_plan(t):
    """The plan of a kernel trace's own scenario (routing and plan numbers from its meta)."""
    from megamoe.design_sm90 import SMEM_LIMIT_SM90

    from .compare import scenario_from_meta

    return scenario_from_meta(t).plan(int(t.meta["num_sms"]), SMEM_LIMIT_SM90)


def _one_rank_trace(path: str, fitter: str, ctas: int, also: bool = True, what: str = ""):
    """A kernel trace and its rank's plan, for ``fitter``: refused by its name unless it is of one
    rank at ``ctas`` CTAs per SM and ``also`` holds of its plan (``what`` says what ``also`` asks)."""
    from megamoe.trace import Trace

    t = Trace.load(path)
    rp = _sm90_plan(t).ranks[0]
    ok = t.meta["num_ranks"] == 1 and rp.ctas_per_sm == ctas and (also(rp) if callable(also) else also)
    require(ok, fitter, f"one-rank traces at {'one CTA' if ctas == 1 else 'two CTAs'} per SM{what}",
            f"{path} ({t.meta['num_ranks']} ranks, {rp.ctas_per_sm} CTAs per SM, block_m {rp.config.block_m}, "
            f"local count {rp.local_count})")
    return t, rp


def _items_per_cta(t, num_ctas: int):
    """int64 ``[num_ctas]``: the valid items (``topk_idx >= 0``) of each CTA's even share of a
    one-rank trace's ``T k`` items (:func:`megamoe.design_sm90.cta_item_starts`)."""
    import numpy as np

    from megamoe.design_sm90 import cta_item_starts

    ids = np.asarray(t.topk_idx[0]).reshape(-1)
    i0 = cta_item_starts(len(ids), num_ctas)
    if len(ids) == 0:
        return np.zeros(num_ctas, np.int64)
    n = np.add.reduceat((ids >= 0).astype(np.int64), i0[:-1])
    n[np.diff(i0) == 0] = 0  # reduceat gives an empty range its start's item
    return n


def _unit_durations(recs) -> list:
    """Each unit's record durations (float ``ns``) in time order, one array per unit (rank, SM)
    in key order, for records of one kind (:meth:`megamoe.trace.Trace.unit_keys`)."""
    import numpy as np

    key = recs.unit_keys()
    o = np.lexsort((recs["t_start_ns"], key))
    key, d = key[o], (recs["t_end_ns"] - recs["t_start_ns"])[o].astype(float)
    return np.split(d, np.flatnonzero(np.diff(key)) + 1) if len(d) else []


def _block_gaps(t) -> list:
    """Consumer idle time between a block's epilogue end and the next block's MMA start (the
    kernel's scheduler call and trace records), with the scheduler steps between the two
    blocks (:func:`sim.engine.sm90_walk_steps`): ``[(gap ns, chunk scans, chunk skips)]`` over
    every rank and CTA of the trace."""
    import numpy as np

    from megamoe.trace import KIND

    from .engine import sm90_walk_steps

    plan = _sm90_plan(t)
    mma = {KIND["l1_mma"]: 1, KIND["l2_mma"]: 2}
    epi = (KIND["l1_epilogue"], KIND["l2_epilogue"])
    out = []
    for rp in plan.ranks:
        key, _ = sm90_walk_steps(rp)
        blk = rp.blocks()
        c = t.where(role="consumer", rank=rp.rank)
        for sm in np.unique(c["sm"]).tolist():
            steps = {tuple(b[:4]): k for b, k in zip(blk[sm::plan.num_sms].tolist(), key[sm::plan.num_sms].tolist())}
            s = c.where(sm=sm)
            o = np.argsort(s["t_start_ns"], kind="stable")
            kd, st, en = s["kind"][o].tolist(), s["t_start_ns"][o], s["t_end_ns"][o]
            ex, mb, nb = s["expert"][o].tolist(), s["m_block"][o].tolist(), s["n_block"][o].tolist()
            prev = None
            for i in range(len(o)):
                if kd[i] in mma:
                    k = steps.get((mma[kd[i]], ex[i], mb[i], nb[i]))
                    if prev is not None and k is not None and kd[i - 1] in epi:
                        out.append((float(st[i] - en[i - 1]), k[0] - prev[0], k[1] - prev[1]))
                    prev = k
    return out


def _mask_seen(t) -> list:
    """For every L2 producer wait on arrival-mask bits in the trace (an idle-wait record of an L2
    block; its ``tokens`` field is the K block waited for), how long after the later of the two
    L1 epilogues that set those bits (L1 n blocks 2 kb and 2 kb + 1 of the same pool block) the
    wait ended, ns.  Waits whose epilogues are not in the trace are left out."""
    out = []
    for r in sorted(set(t["rank"].tolist())):
        s = t.where(rank=r)
        e1 = s.where(kind="l1_epilogue")
        end = {k: e for k, e in zip(zip(e1["expert"].tolist(), e1["m_block"].tolist(), e1["n_block"].tolist()),
                                    e1["t_end_ns"].tolist())}
        l2 = s.where(kind="l2_load")
        l2_keys = set(zip(l2["sm"].tolist(), l2["expert"].tolist(), l2["m_block"].tolist(), l2["n_block"].tolist()))
        w = s.where(kind="idle_wait", role="producer")
        for sm, ex, mb, nb, kb, t_end in zip(w["sm"].tolist(), w["expert"].tolist(), w["m_block"].tolist(),
                                              w["n_block"].tolist(), w["tokens"].tolist(), w["t_end_ns"].tolist()):
            a, b = end.get((ex, mb, 2 * kb)), end.get((ex, mb, 2 * kb + 1))
            if (sm, ex, mb, nb) in l2_keys and a is not None and b is not None:
                out.append(float(t_end - max(a, b)))
    return out


def fit_sm90_pull(paths: list[str], fold_ns: float) -> dict:
    """``sm90_pull_base_ns`` and ``sm90_pull_warp_ns``: a pull round's time besides its fold rounds
    as a line in the dispatch warps pulling on the GPU, read off one-rank, one-CTA-per-SM traces
    (:data:`SM90_PULL_FIT_TRACES`). Per trace: each CTA with items pulls them in rounds of four (one
    item per dispatch warp), or alone with all four warps where it has one item at block_m 16
    (``design_sm90.ONE_ITEM_PULL_WARPS``, kernel v8.6); its pull record over its rounds, less the
    chunk rounds one warp folds one after another (``hidden / PULL_ROUND_BYTES``, a quarter of them
    where the four share a row) at ``fold_ns`` (``pull_fold_chunk_ns``), the median over the CTAs;
    against the warps pulling in the first round (each CTA's items up to four, four for a lone
    item). Least squares over the traces.

    Returns:
        ``{"sm90_pull_base_ns": (value, how), "sm90_pull_warp_ns": (value, how)}``.

    Raises:
        InputError: fewer than two traces, or fewer than two distinct warp counts, a trace of two
            ranks or of two CTAs per SM, or one without pull records.
    """
    import numpy as np

    from megamoe.design_sm90 import ONE_ITEM_PULL_WARPS, fold_rounds

    require(isinstance(paths, (list, tuple)) and len(paths) >= 2, "fit_sm90_pull", "a list of two or more traces",
            paths)
    pts = []
    for path in paths:
        t, rp = _one_rank_trace(path, "fit_sm90_pull", 1)
        T = int(t.meta["tokens_per_rank"][0])
        H = int(t.meta["hidden"])
        warps = ONE_ITEM_PULL_WARPS.get(rp.config.block_m, 1)
        n = _items_per_cta(t, rp.num_sms)
        pull = t.where(kind="pull")
        require(len(pull) > 0, "fit_sm90_pull", "pull records", f"{path} (none)")
        c = pull["sm"].astype(np.int64)
        has = n[c] > 0
        alone = (n[c] == 1) & (warps > 1)
        folds = np.where(alone, fold_rounds(H, warps), fold_rounds(H)) * fold_ns
        per = (pull["t_end_ns"] - pull["t_start_ns"])[has] / -(-n[c][has] // 4) - folds[has]
        lone = (n == 1) & (warps > 1)
        busy = int(np.minimum(n[~lone], 4).sum() + 4 * lone.sum())
        pts.append((T, busy, _median(per), int(has.sum())))
    x = np.array([p[1] for p in pts], float)
    require(len(set(x.tolist())) >= 2, "fit_sm90_pull", "traces of two or more warp counts", x.tolist())
    slope, base = np.polyfit(x, np.array([p[2] for p in pts]), 1)
    how = ("a pull round's time less its fold rounds (pull_fold_chunk_ns each, a quarter of a row's where a CTA's "
           "four dispatch warps share its one item) as a line in the dispatch warps pulling on the GPU, least "
           "squares over the traces' medians over their CTAs: " + ", ".join(
               f"T={tk} {b} warps {v / 1e3:.2f} us over {m} CTAs" for tk, b, v, m in pts)
           + f"; {base:.0f} ns + {slope:.2f} ns per warp")
    return {"sm90_pull_base_ns": (float(base), how), "sm90_pull_warp_ns": (float(slope), how)}


def fit_sm90_pull_pair(paths: list[str], fold_ns: float) -> dict:
    """``sm90_pull_pair_ns``: a CTA's lone pull at two CTAs per SM besides its fold rounds, read off
    one-rank traces of the two-CTA instances (:data:`SM90_PULL_PAIR_FIT_TRACES`): every CTA with one
    item (pulled by its four dispatch warps, ``design_sm90.ONE_ITEM_PULL_WARPS``), its pull record
    less a quarter of the row's fold rounds at ``fold_ns`` (``pull_fold_chunk_ns``); the median over
    those CTAs of all the traces.

    Returns:
        ``{"sm90_pull_pair_ns": (value, how)}``.

    Raises:
        InputError: no trace, a trace of two ranks or not at two CTAs per SM at a block_m whose lone
            item is pulled by several warps, or without pull records of one CTA each (a simulator's
            pull rounds are the rank's), or no CTA with one item in all.
    """
    import numpy as np

    from megamoe.design_sm90 import ONE_ITEM_PULL_WARPS, fold_rounds

    require(isinstance(paths, (list, tuple)) and len(paths) >= 1, "fit_sm90_pull_pair", "a list of traces", paths)
    per, pooled = [], []
    for path in paths:
        t, rp = _one_rank_trace(path, "fit_sm90_pull_pair", 2, lambda rp: ONE_ITEM_PULL_WARPS.get(rp.config.block_m, 1) > 1,
                                " whose lone items several warps pull")
        meta = t.meta
        warps = ONE_ITEM_PULL_WARPS[rp.config.block_m]
        T = int(meta["tokens_per_rank"][0])
        n = _items_per_cta(t, rp.num_sms)
        pull = t.where(kind="pull")
        require(len(pull) > 0 and (pull["sm"] >= 0).all(), "fit_sm90_pull_pair", "pull records of one CTA each (a "
                "kernel trace's)", f"{path} ({len(pull)} pull records, {int((pull['sm'] < 0).sum())} of no CTA)")
        lone = n[pull["sm"].astype(np.int64)] == 1
        folds = fold_rounds(int(meta["hidden"]), warps) * fold_ns
        v = ((pull["t_end_ns"] - pull["t_start_ns"])[lone] - folds).astype(float)
        per.append((T, len(v), float(np.median(v)) if len(v) else float("nan")))
        pooled.append(v)
    v = np.concatenate(pooled)
    require(len(v) > 0, "fit_sm90_pull_pair", "CTAs with one item", "none")
    m = float(np.median(v))
    how = ("each CTA with one item at two CTAs per SM: its pull record less a quarter of the row's fold rounds "
           f"({fold_ns:.0f} ns each), median over the CTAs: " + ", ".join(
               f"T={tk} {x / 1e3:.2f} us over {c} CTAs" for tk, c, x in per if c) + f"; pooled {m:.0f} ns")
    return {"sm90_pull_pair_ns": (m, how)}


def fit_sm90_combine_start(paths: list[str]) -> dict:
    """``sm90_combine_start_ns`` (one CTA per SM) and ``sm90_combine_start_pair_ns`` (two): from each
    CTA's release from the grid sync before the combine to its combine record's start (the combine
    round figures are read from that start on), the median over the CTAs of the traces of each
    instance (:data:`SM90_FIT_TRACES` and :data:`SM90_PAIR_FIT_TRACES` in :func:`refit_h200`).

    Returns:
        ``{"sm90_combine_start_ns": (value, how), "sm90_combine_start_pair_ns": (value, how)}``.

    Raises:
        InputError: no trace of one of the two instances, or one without a combine record after a
            grid sync.
    """
    import numpy as np

    from megamoe.trace import Trace

    by = {1: [], 2: []}
    for path in paths:
        t = Trace.load(path)
        ctas = int((t.meta.get("plan") or {}).get("ctas_per_sm", 1))
        g, c = t.where(kind="grid_sync"), t.where(kind="combine")
        release = {}
        for sm, st, en in zip(g["sm"].tolist(), g["t_start_ns"].tolist(), g["t_end_ns"].tolist()):
            if sm not in release or st > release[sm][0]:
                release[sm] = (st, en)  # the CTA's last grid sync
        gaps = [st - release[sm][1] for sm, st in zip(c["sm"].tolist(), c["t_start_ns"].tolist()) if sm in release]
        require(len(gaps) > 0, "fit_sm90_combine_start", "combine records after a grid sync", f"{path} (none)")
        by[ctas].append((int(t.meta["tokens_per_rank"][0]), gaps))
    out = {}
    for ctas, key in ((1, "sm90_combine_start_ns"), (2, "sm90_combine_start_pair_ns")):
        require(len(by[ctas]) > 0, "fit_sm90_combine_start", f"a trace at {ctas} CTA{'s' * (ctas > 1)} per SM", "none")
        pooled = [x for _, gs in by[ctas] for x in gs]
        v = float(np.median(pooled))
        how = (f"from each CTA's release from the grid sync before the combine to its combine record's start, at "
               f"{ctas} CTA{'s' * (ctas > 1)} per SM: median over the {len(pooled)} CTAs of "
               + ", ".join(f"T={tk} (median {float(np.median(gs)):.0f} ns)" for tk, gs in by[ctas]) + f": {v:.0f} ns")
        out[key] = (v, how)
    return out


def fit_sm90_count_pair(paths: list[str], hw) -> dict:
    """``sm90_count_pair_ns``: the count up to its barrier at two CTAs per SM beyond what the one-CTA
    line says, read off the two-CTA traces whose plans meet at the count barrier
    (:data:`SM90_COUNT_PAIR_FIT_TRACES`): per trace the median over its CTAs of the first pull's
    start less ``grid_sync_ns`` and ``sm90_count_ns + share x sm90_count_item_ns`` of ``hw`` (the
    share: the most items a CTA counts); the median over the traces.

    Returns:
        ``{"sm90_count_pair_ns": (value, how)}``.

    Raises:
        InputError: no trace, or a trace of one rank that is not at two CTAs per SM with a count
            barrier, or one without pull records.
    """
    import numpy as np

    from megamoe.design_sm90 import cta_item_starts

    require(isinstance(paths, (list, tuple)) and len(paths) >= 1, "fit_sm90_count_pair", "a list of traces", paths)
    per = []
    for path in paths:
        t, rp = _one_rank_trace(path, "fit_sm90_count_pair", 2, lambda rp: not rp.local_count,
                                " whose plan meets at the count barrier")
        meta = t.meta
        pull = t.where(kind="pull")
        require(len(pull) > 0, "fit_sm90_count_pair", "pull records", f"{path} (none)")
        T, K = int(meta["tokens_per_rank"][0]), int(meta["top_k"])
        share = int(np.diff(cta_item_starts(T * K, rp.num_sms)).max())
        line = hw.sm90_count_ns + share * hw.sm90_count_item_ns + hw.grid_sync_ns
        per.append((T, share, _median(pull["t_start_ns"]), line))
    v = _median([s - ln for _, _, s, ln in per])
    how = ("the first pull's start (median over the CTAs) at two CTAs per SM less the one-CTA count line at the "
           f"same share ({hw.sm90_count_ns:.0f} ns + {hw.sm90_count_item_ns:.2f} ns per item) and grid_sync_ns "
           f"({hw.grid_sync_ns:.0f} ns): " + ", ".join(f"T={tk} {s / 1e3:.2f} us at {sh} items, {(s - ln) / 1e3:+.2f} us"
                                                    for tk, sh, s, ln in per)
           + f"; median {v / 1e3:.2f} us")
    return {"sm90_count_pair_ns": (max(0.0, v), how)}


def fit_sm90_local_count(paths: list[str]) -> dict:
    """``sm90_local_count_ns``, the EP1 dispatch's time from the kernel's start to its first pull
    when every CTA counts all items itself (the wide instances: kernel v8.9 at one CTA per SM, v9.7
    at two; :func:`megamoe.design_sm90.local_count`), read off the traces whose plans count so
    (:data:`SM90_LOCAL_COUNT_FIT_TRACES`: 1 token at one CTA per SM, 3-16 at two): per trace the
    median over the CTAs of the pull records' start (the trace's clock starts at its first record,
    the count's start), as ``sm90_count_ns`` is read off the other traces (which add the count
    barrier); the figure is the median over the traces. One trace's start moves by ~1 us from call
    to call (the 1-token trace read 4.67 and 5.94 us in v9.6's and v9.7's recordings of the same
    one-CTA code, 4.51 us in v9.8's, whose first fill is paced), so the figure pools every trace
    the model prices with it.

    Returns:
        ``{"sm90_local_count_ns": (value, how)}``.

    Raises:
        InputError: ``paths`` is not a list (or tuple) of at least one trace, a trace's plan does
            not count locally, or it has no pull record.
    """
    from megamoe.trace import Trace

    require(isinstance(paths, (list, tuple)), "fit_sm90_local_count", "a list of trace paths",
            f"{type(paths).__name__} {paths!r}")
    require(len(paths) > 0, "fit_sm90_local_count", "at least one trace", "none")
    per = []
    for path in paths:
        t = Trace.load(path)
        meta = t.meta
        rp = _sm90_plan(t).ranks[0]  # the decision is the plan's (RankPlan.local_count)
        require(rp.local_count and meta["num_ranks"] == 1, "fit_sm90_local_count", "a one-rank trace whose plan "
                "counts locally (block_m 16, waves of more than 32 experts: design_sm90.local_count)",
                f"{path} (block_m {rp.config.block_m}, experts_per_wave {rp.experts_per_wave}, ranks {meta['num_ranks']})")
        pull = t.where(kind="pull")
        require(len(pull) > 0, "fit_sm90_local_count", "pull records", f"{path} (none)")
        per.append((int(meta["tokens_per_rank"][0]), rp.ctas_per_sm, len(pull), _median(pull["t_start_ns"])))
    v = _median([x[3] for x in per])
    how = ("median over the traces of each one's median first-pull start over its CTAs (no count barrier; "
           "the trace's clock starts at its first record, the count's start): "
           + ", ".join(f"T={tk} ({c} CTA{'s' * (c > 1)} per SM, {n} CTAs) {x / 1e3:.2f} us" for tk, c, n, x in per)
           + f"; {v / 1e3:.2f} us")
    return {"sm90_local_count_ns": (v, how)}


def _first_block_issue(t) -> tuple[float, float, int, list[float]]:
    """The producer's copy issues in the first L1 block of every CTA (the stage ring still
    empty): ``(median ns per K block from the block's first issue (the load record's start,
    or the end of its arrival wait) to its last (the record's end), median ns from the last
    issue to the consumers' K-loop end, blocks, each CTA's ns from that first issue to its
    consumers' first MMA record's start)``. (The last is the ring's first fill where the
    consumers' record starts at the first stage's arrival: block descriptors, block_m 16.)"""
    import numpy as np

    from megamoe.design_sm90 import BLOCK_K
    from megamoe.trace import KIND

    kb = int(t.meta["hidden"]) // BLOCK_K
    per, gap, fill = [], [], []
    for r in np.unique(t["rank"]).tolist():
        for sm in np.unique(t["sm"][(t["rank"] == r) & (t["sm"] >= 0)]).tolist():
            s = t.where(rank=r, sm=sm)
            mma = s.where(kind=KIND["l1_mma"])
            if not len(mma):
                continue
            i = int(np.argmin(mma["t_start_ns"]))
            key = {k: int(mma[k][i]) for k in ("expert", "m_block", "n_block")}
            ld = s.where(kind=KIND["l1_load"], **key)
            iw = s.where(kind=KIND["idle_wait"], role="producer", **key)
            if len(ld) != 1:
                continue
            t0 = max(float(ld["t_start_ns"][0]), float(iw["t_end_ns"].max()) if len(iw) else 0.0)
            per.append((float(ld["t_end_ns"][0]) - t0) / kb)
            gap.append(float(mma["t_end_ns"][i] - ld["t_end_ns"][0]))
            fill.append(float(mma["t_start_ns"][i]) - t0)
    return _median(per), _median(gap), len(per), fill


def _first_kloop_excess(t) -> list[float]:
    """Each CTA's first L1 MMA record less the median of its later ones, ns, over the CTAs with two or
    more L1 blocks (the ring's first fill: ``sm90_first_kloop_ns``)."""
    import numpy as np

    from megamoe.trace import KIND

    return [float(g[0] - np.median(g[1:])) for g in _unit_durations(t.where(kind=KIND["l1_mma"])) if len(g) >= 2]


def fit_block_jitter(paths: list[str]) -> dict:
    """``block_jitter``: the spread of a block's K-loop time from block to block, read off one-rank,
    one-CTA-per-SM traces whose L1 K loops stream their weights steadily
    (:data:`BLOCK_JITTER_FIT_TRACES`). Per CTA, its L1 MMA records of positive duration in time order
    but the first (the ring's first fill: ``sm90_first_kloop_ns``); the log of each record's duration
    over the one before it; pooled over the CTAs and traces, ``1.4826 x`` their median absolute
    deviation (a robust standard deviation) over ``sqrt(2)`` (two independent draws make one ratio).

    Returns:
        ``{"block_jitter": (value, how)}``.

    Raises:
        InputError: no trace, a trace of two ranks or of two CTAs per SM, or fewer than 100 ratios.
    """
    import numpy as np

    from megamoe.trace import KIND

    require(isinstance(paths, (list, tuple)) and len(paths) >= 1, "fit_block_jitter", "a list of traces", paths)
    per, pooled = [], []
    for path in paths:
        t, _ = _one_rank_trace(path, "fit_block_jitter", 1)
        meta = t.meta
        mma = t.where(kind=KIND["l1_mma"])
        mma = mma.select(mma["t_end_ns"] > mma["t_start_ns"])  # a record of no duration has no ratio
        ratios = np.concatenate([np.diff(np.log(g[1:])) for g in _unit_durations(mma) if len(g) >= 3] or [np.zeros(0)])
        per.append((int(meta["tokens_per_rank"][0]), len(ratios), _robust_sigma(ratios)))
        pooled.append(ratios)
    ratios = np.concatenate(pooled)
    require(len(ratios) >= 100, "fit_block_jitter", "100 or more pairs of consecutive L1 MMA records", len(ratios))
    v = _robust_sigma(ratios)
    how = ("each CTA's consecutive L1 MMA records after its first: 1.4826 x the median absolute deviation of the "
           "log duration ratios over sqrt(2), "
           + ", ".join(f"T={tk} {100 * sg:.2f}% ({n} ratios)" for tk, n, sg in per)
           + f"; pooled {100 * v:.2f}%")
    return {"block_jitter": (v, how)}


def _robust_sigma(x) -> float:
    """The standard deviation of one of two independent draws whose difference is ``x``, robustly:
    ``1.4826 x median(|x - median(x)|) / sqrt(2)`` (0 for no ``x``)."""
    import numpy as np

    x = np.asarray(x, float)
    if len(x) == 0:
        return 0.0
    return float(1.4826 * np.median(np.abs(x - np.median(x))) / np.sqrt(2.0))


def _first_walk_start(t) -> float:
    """Median over the CTAs of one trace of the time from the CTA's first pull record's start (its
    counts are ready) to its producer's first load record's start (after the count fetch and the
    first walk), ns; NaN where no CTA has both."""
    import numpy as np

    from megamoe.trace import KIND

    pull = t["kind"] == KIND["pull"]
    load = (t["kind"] == KIND["l1_load"]) | (t["kind"] == KIND["l2_load"])
    out = []
    for sm in np.unique(t["sm"][load]).tolist():
        p, q = pull & (t["sm"] == sm), load & (t["sm"] == sm)
        if p.any():
            out.append(float(t["t_start_ns"][q].min() - t["t_start_ns"][p].min()))
    return _median(out)


def _l1_promoted_once(t) -> bool:
    """Whether the trace's L1 K blocks are promoted once (x folded per 128-K group at its
    block_m: ``megamoe.design_sm90.L1_X_FOLD_K``, kernel v7.6; the model describes the current
    kernel, and traces of older builds are not held to it)."""
    from megamoe.design_sm90 import l1_promoted_once

    return l1_promoted_once(int(t.meta["plan"]["block_m"]))


def whole_blocks(t):
    """Which records of an SM90 kernel trace ran their WGMMAs over the whole block_m: all where
    the trace's plan records no WGMMA N step (kernels before v9.12) or one of block_m; else those
    whose valid rows (the ``tokens`` column) round up to block_m at that step
    (:func:`megamoe.design_sm90.wgmma_n`). Boolean array over the records."""
    import numpy as np

    bm = int(t.meta["plan"]["block_m"])
    step = int(t.meta["plan"].get("wgmma_n_step", bm))
    if step >= bm:
        return np.ones(len(t), dtype=bool)
    return (-(-t["tokens"] // step)) * step >= bm


def sm90_k_block_ns(t) -> float:
    """Consumer time per K block of one SM90 kernel trace with two promotions per K block, over
    the blocks whose WGMMAs cover the whole block_m (:func:`whole_blocks`: from kernel v9.12 a
    block_m 128 block runs at its valid rows rounded up to 32, which the model prices from this
    whole-block figure): the mean of the median L1 K loop per K block (``hidden / 128`` of them)
    and the median L2 K loop per K block (``intermediate / 128``), or the L2 one alone where the
    L1 K block is promoted once (:func:`_l1_promoted_once`); the scheduler gaps between blocks
    are not in it."""
    from megamoe.design_sm90 import BLOCK_K
    from megamoe.trace import KIND

    meta = t.meta
    kb1, kb2 = int(meta["hidden"]) // BLOCK_K, int(meta["intermediate"]) // BLOCK_K
    d = t["t_end_ns"] - t["t_start_ns"]
    whole = whole_blocks(t)
    k2 = _median(d[whole & (t["kind"] == KIND["l2_mma"])]) / kb2
    return k2 if _l1_promoted_once(t) else 0.5 * (_median(d[whole & (t["kind"] == KIND["l1_mma"])]) / kb1 + k2)


def fit_sm90_pair_share(pair_paths: list[str], one_paths: list[str], hw) -> dict:
    """``sm90_pair_share_first`` and ``sm90_pair_share`` from traces of the two-CTA instance
    (kernel v9.2 and up, two CTAs per SM) and one-CTA traces of the same token counts and
    routing (``one_paths``).

    * ``sm90_pair_share_first``, read off the traces: in each pair trace the CTAs whose mean L1 MMA
      record is shorter than the median CTA's are the SMs' first CTAs (benchmarks/NOTES_kernel.md,
      session 38: one CTA of each SM runs its L1 K loops at the same pace at every point of the
      call); their median L1 MMA record over the one-CTA trace's median L1 MMA record, the mean
      over the pairs.
    * ``sm90_pair_share`` (the second CTA's share while its partner is in a block), with the first
      share fixed at that value rounded to 4 digits: the share at which the model's makespan
      meets the traces' (the mean relative error over ``pair_paths`` zero, by bisection on
      [1, 4], to 0.001: the first CTA takes ``1 / sm90_pair_share_first`` of the SM, so the second
      gets less than half of it), with every other figure of ``hw``. The model simulates each trace's
      scenario as its plan says (the block tickets of ``RankPlan.block_tickets``). The second
      CTA's K loop also runs fast whenever its partner waits, and its L2 blocks wait for their
      wave's slowest L1 blocks; the share carries what the two-level model does not show.

    Returns:
        ``{"sm90_pair_share_first": (value, how), "sm90_pair_share": (value, how)}``.

    Raises:
        InputError: the lists differ in length or are empty, a pair's token counts differ, a
            trace's CTAs per SM are not two (``pair_paths``) or one (``one_paths``), a trace has no
            L1 MMA record, or no share in [1, 4] meets the traces.
    """
    import dataclasses

    import numpy as np

    from megamoe.trace import KIND, Trace

    from .compare import scenario_from_meta
    from .engine import simulate

    require(len(pair_paths) == len(one_paths) and pair_paths, "fit_sm90_pair_share",
            "as many one-CTA traces as two-CTA ones (at least one)", f"{len(pair_paths)} and {len(one_paths)}")
    pairs, pts, firsts = [], [], []
    for pp, op in zip(pair_paths, one_paths):
        tp, to = Trace.load(pp), Trace.load(op)
        T, T_one = int(tp.meta["tokens_per_rank"][0]), int(to.meta["tokens_per_rank"][0])
        require(T == T_one, "fit_sm90_pair_share", f"the same tokens in {pp} and {op}", f"{T} and {T_one}")
        ctas = (int(tp.meta["plan"].get("ctas_per_sm", 1)), int(to.meta["plan"].get("ctas_per_sm", 1)))
        require(ctas == (2, 1), "fit_sm90_pair_share", f"two CTAs per SM in {pp} and one in {op}", ctas)
        l1p, l1o = tp.where(kind=KIND["l1_mma"]), to.where(kind=KIND["l1_mma"])
        require(len(l1p) > 0 and len(l1o) > 0, "fit_sm90_pair_share", f"L1 MMA records in {pp} and {op}",
                f"{len(l1p)} and {len(l1o)}")
        dp = l1p["t_end_ns"] - l1p["t_start_ns"]
        cta, inv = np.unique(l1p["sm"], return_inverse=True)
        mean = np.bincount(inv, weights=dp) / np.bincount(inv)
        fast = mean < np.median(mean)
        one = _median(l1o["t_end_ns"] - l1o["t_start_ns"])
        a, b = _median(dp[fast[inv]]), _median(dp[~fast[inv]])
        firsts.append(a / one)
        pts.append(f"T={T}: {int(fast.sum())} of {len(cta)} CTAs, median L1 block {a / 1e3:.2f} us (the others "
                   f"{b / 1e3:.2f} us) over one CTA's {one / 1e3:.2f} us = {a / one:.3f}")
        pairs.append((scenario_from_meta(tp), tp.makespan_ns, T))
    first = statistics.fmean(firsts)
    hw = dataclasses.replace(hw, sm90_pair_share_first=float(f"{first:.4g}"))
    how_first = ("the SMs' first CTAs (those whose mean L1 MMA record is below the median CTA's) at two CTAs per SM: "
                 "their median L1 MMA record over the one-CTA trace's median at the same tokens, the mean over the "
                 "traces: " + "; ".join(pts))

    def err(share):
        h = dataclasses.replace(hw, sm90_pair_share=share)
        return statistics.fmean(simulate(sc, h).trace.makespan_ns / mk - 1.0 for sc, mk, _ in pairs)

    lo, hi = 1.0, 4.0
    e_lo, e_hi = err(lo), err(hi)
    require(e_lo < 0.0 < e_hi, "fit_sm90_pair_share", "a share in [1, 4] at which the model meets the traces",
            f"mean makespan errors {e_lo:+.3f} at 1 and {e_hi:+.3f} at 4")
    while hi - lo > 0.001:
        mid = 0.5 * (lo + hi)
        if err(mid) < 0.0:
            lo = mid
        else:
            hi = mid
    # the makespan steps with the share (blocks change hands), so of the bracket's two ends (as
    # written, 4 significant digits) the one nearer zero error
    v = min((float(f"{x:.4g}") for x in (lo, hi)), key=lambda x: abs(err(x)))
    h = dataclasses.replace(hw, sm90_pair_share=v)
    errs = ", ".join(f"T={T} {simulate(sc, h).trace.makespan_ns / mk - 1.0:+.1%}" for sc, mk, T in pairs)
    how = (f"with sm90_pair_share_first {hw.sm90_pair_share_first:g}, the share of a second CTA's consumer and "
           "producer time while its partner is in a block at which the model's makespan meets the traces' (mean "
           f"relative error zero, bisection to 0.001, the bracket's end nearer zero; then {errs}; the model takes the plan's block tickets)")
    return {"sm90_pair_share_first": (first, how_first), "sm90_pair_share": (v, how)}


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
            out["sm90_mma_fraction"] = _fraction_of_rate(mma / bm, fp8_gemm_tflops,
                                                         int(meta.get("num_sms", 132)))
    return out


def _line(xs, ys) -> tuple[float, float]:
    """Least-squares intercept and slope of ys over xs."""
    import numpy as np

    slope, icpt = np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)
    return float(icpt), float(slope)


def fit_sm90_traces(paths: list[str], profile: dict | None = None, fp8_gemm_tflops: float | None = None,
                    base: str = "h200", hw_overrides: dict | None = None) -> dict:
    """Fit the SM90 figures of the hardware model to kernel traces (see module docstring).

    Args:
        paths: kernel traces (NPZ) of this project's SM90 kernel with at least two block_m.
        profile: the per-role cycle profile (``kernel_profile_stages_h200.json``: per token
            count, the consumer's cycle fractions); its entries of 64 tokens or more give
            the decode share of the K block.  Without it the base decode figure is kept.
        fp8_gemm_tflops: the measured FP8 GEMM rate (default: the base preset's
            ``fp8_dense_tflops x mma_efficiency``).
        base: the preset whose other figures the fit uses (``sm_load_gbs`` for a pull chunk).
        hw_overrides: figures of ``base`` replaced first (``refit_h200`` passes the copy-engine
            probe's, :func:`fit_tma_probe`, so the fit uses the figures it writes beside them).

    Returns:
        figure name -> (value, how it was fitted: the numbers behind it).

    Raises:
        InputError: fewer than two distinct block_m among the traces.
    """
    import numpy as np

    from megamoe.design_sm90 import (
        BLOCK_DESCRIPTORS,
        BLOCK_K,
        BLOCK_N,
        CONSUMER_WARPS,
        FIRST_FILL_PER_SM,
        RELAY_RELEASE,
        THREADS,
        WALK_IN_EPILOGUE,
        block_m_for,
        combine_slots,
        cta_item_starts,
    )
    from megamoe.trace import KIND, Trace

    from .engine import DISPATCH_WARPS_PER_SM
    from .hardware import load_hardware

    hw = dataclasses.replace(load_hardware(base), **(hw_overrides or {}))
    rate = fp8_gemm_tflops or hw.fp8_dense_tflops * hw.mma_efficiency
    threads = 32 * CONSUMER_WARPS
    rows = []
    for p in paths:
        t = Trace.load(p)
        meta = t.meta
        d = t["t_end_ns"] - t["t_start_ns"]
        kb1, kb2 = int(meta["hidden"]) // BLOCK_K, int(meta["intermediate"]) // BLOCK_K
        whole = whole_blocks(t)  # the K loops of whole blocks (the line below is in block_m)
        med = {k: _median(d[(t["kind"] == KIND[k]) & whole]) for k in ("l1_mma", "l2_mma")}
        med["l1_epilogue"] = _median(d[t["kind"] == KIND["l1_epilogue"]])
        e2 = t.where(kind="l2_epilogue")
        num_sms, T, H = int(meta["num_sms"]), int(meta["tokens_per_rank"][0]), int(meta["hidden"])
        pull, comb = t.where(kind="pull"), t.where(kind="combine")
        # pull rounds of each CTA (EP1: an even split of the T K items, 4 dispatch warps)
        i0 = cta_item_starts(T * int(meta["top_k"]), num_sms)
        rounds = -(-np.diff(i0) // DISPATCH_WARPS_PER_SM)
        rows.append({"tokens": T, "bm": int(meta["plan"]["block_m"]), "k": sm90_k_block_ns(t),
                     "once": _l1_promoted_once(t),
                     "k1": med["l1_mma"] / kb1, "k2": med["l2_mma"] / kb2,
                     "gaps": _block_gaps(t), "mask_seen": _mask_seen(t), "epi1": med["l1_epilogue"],
                     "epi2": (d[t["kind"] == KIND["l2_epilogue"]], e2["tokens"].astype(float)),
                     "pull_round": _median((pull["t_end_ns"] - pull["t_start_ns"]) / np.maximum(rounds[pull["sm"]], 1)),
                     "pull_rounds": int(rounds.max()),
                     "combine": float(np.max(comb["t_end_ns"] - comb["t_start_ns"])) if len(comb) else float("nan"),
                     "combine_rounds": -(-T * H // 8 // (num_sms * THREADS)),
                     "combine_slots": combine_slots(int(meta["plan"]["block_m"]), int(meta["plan"]["experts_per_wave"]),
                                                    int(meta["plan"]["ctas_per_sm"])),
                     "grid_sync": _grid_sync_ns(t), "num_sms": num_sms, "kb": kb1 + kb2, "kb1": kb1,
                     "stages": int(meta["plan"]["num_stages"]), "issue": _first_block_issue(t),
                     "top_k": int(meta["top_k"]), "experts": int(meta["num_experts"]),
                     "pull_start": _median(pull["t_start_ns"]), "share": int(np.diff(i0).max()),
                     "fetch": _first_walk_start(t), "first_kloop": _first_kloop_excess(t)})
    bms = sorted({r["bm"] for r in rows})
    require(len(bms) >= 2, "fit_sm90_traces", "traces of at least two block_m", bms)
    num_sms = rows[0]["num_sms"]
    out = {}

    # K block: a line in block_m (WGMMA's N, the tokens: the promotion and the token scales
    # grow with them, the decode does not)
    a, b = _line([r["bm"] for r in rows], [r["k"] for r in rows])
    pts = "; ".join(f"{r['k']:.0f} ns at block_m {r['bm']} (T={r['tokens']}: median L1 K loop {r['k1']:.0f} ns, "
                    f"L2 {r['k2']:.0f} ns per K block{'; L1 promoted once, left out' if r['once'] else ''})"
                    for r in rows)
    how = (f"per-K-block consumer time with two promotions (mean of the median L1 and L2 K loops per K block; "
           f"where the L1 K block is promoted once, the L2 one) {a:.0f} ns + {b:.2f} ns "
           f"per block_m row ({pts}); the slope is "
           f"{2 * BLOCK_N * BLOCK_K / b * num_sms / 1e3:.0f} TFLOP/s over "
           f"{num_sms} SMs = this fraction of the {rate:.0f} TFLOP/s FP8 GEMM")
    out["sm90_mma_fraction"] = (_fraction_of_rate(b, rate, num_sms), how)
    once = [r for r in rows if r["once"]]
    if once:  # what one promotion costs: the L1 K block promoted once against the L2 one, per row
        promo = float(np.mean([(r["k2"] - r["k1"]) / r["bm"] for r in once]))
        out["sm90_promotion_ns_per_row"] = (max(promo, 0.0), "the L2 K block less the L1 one where the L1 K block is "
                                            "promoted once, per block_m row: " + ", ".join(
                                                f"T={r['tokens']} (block_m {r['bm']}) ({r['k2']:.0f} - {r['k1']:.0f}) "
                                                f"/ {r['bm']} = {(r['k2'] - r['k1']) / r['bm']:.3f} ns" for r in once))
    per_thread = BLOCK_N * BLOCK_K / threads  # E2M1 elements one consumer thread decodes per K block
    decode_ns = hw.e2m1_decode_thread_ns_per_elem * per_thread
    if profile:
        shares = []
        for e in profile.values():
            if e["T"] < 64:
                continue  # at 1 token the consumer mostly waits (the profile's full-stage share)
            bm = block_m_for(e["T"] * rows[0]["top_k"] / rows[0]["experts"])
            share = e["c_decode_bar_frac"] / (e["c_decode_bar_frac"] + e["c_mma_frac"] + e["c_wait_full_frac"])
            shares.append((e["T"], share, share * (a + b * bm)))
        if shares:
            decode_ns = float(np.mean([s[2] for s in shares]))
            decode_how = ("stage-preparation share of the K loop (c_decode_bar / (c_decode_bar + c_mma + "
                          "c_wait_full): from the full-stage wait to the MMA, the weight rows' fold-table offsets; "
                          "the token-scale table and its warpgroup barrier until kernel v7.4) x the K-block time "
                          "at that block_m: "
                          + ", ".join(f"T={T} {100 * s:.1f}% = {ns:.0f} ns" for T, s, ns in shares)
                          + f"; mean {decode_ns:.0f} ns over {per_thread:.0f} elements per thread")
            out["e2m1_decode_thread_ns_per_elem"] = (decode_ns / per_thread, decode_how)
    how = (f"the {a:.0f} ns intercept of the per-K-block time less the decode ({decode_ns:.0f} ns): the fixed "
           f"part of WGMMA wait + promotion, full-stage waits and the stage release")
    out["stage_handoff_ns"] = (a - decode_ns, how)

    # producer: the time to issue one K block's loads with its stage free, from the first L1
    # block of every CTA (the ring empty), in the traces where the issues run ahead of the
    # consumers (the last issue less than half a ring of K blocks before the K loop's end);
    # elsewhere the ring, not the issue, paces the producer
    def _ring(r):
        return min(r["stages"], r["kb1"]) * r["k1"]

    paced = [r for r in rows if r["issue"][1] < 0.5 * _ring(r)]
    each = ", ".join(f"T={r['tokens']} (block_m {r['bm']}) {r['issue'][0]:.0f} ns, the last issue "
                     f"{r['issue'][1] / 1e3:.2f} us before the K loop's end"
                     + ("" if r in paced else f" = {r['issue'][1] / r['k1']:.1f} of {r['stages']} stages of "
                        f"{r['k1']:.0f} ns: paced by the ring") for r in rows)
    what = ("the producer's time per K block from the first to the last copy issue of each CTA's first L1 block (the "
            "stage ring empty; from the load record's start or the end of its arrival wait to its end), median over "
            "CTAs: " + each)
    if paced:
        iss = float(np.median([r["issue"][0] for r in paced]))
        how = (what + f"; median over the traces not paced by the ring {iss:.0f} ns: the loads of one stage (token "
               "tile, scales, FP4 weights and their scales) take that long to issue, so with the ring empty the "
               "producer runs barely ahead of the consumers")
    else:
        # every first block was paced by the ring: the issue is faster than the consumers use
        # stages, and the smallest per-K-block time seen bounds it from above
        iss = float(min(r["issue"][0] for r in rows))
        how = (what + f"; every trace paced by the ring (the producer warps issue faster than the consumers free "
               f"stages), so the smallest, {iss:.0f} ns, is an upper bound on the issue time per K block")
    out["sm90_issue_kblock_ns"] = (iss, how)

    # the ring's first fill: from each CTA's first copy issue to its consumers' first MMA record,
    # read where that record starts at the first stage's arrival (block descriptors, block_m 16);
    # the median over every such CTA of the traces
    firsts = [r for r in rows if BLOCK_DESCRIPTORS.get(r["bm"], False)]
    if firsts:
        fills = [x for r in firsts for x in r["issue"][3]]
        v = _median(fills)
        how = ("from each CTA's first copy issue of the call (its first L1 block's load record's start, or the end of "
               "its arrival wait) to its consumers' first MMA record, which starts at the first stage's arrival where "
               "they read the producer's block descriptors (design_sm90.BLOCK_DESCRIPTORS): median over the "
               f"{len(fills)} CTAs of " + ", ".join(f"T={r['tokens']} (block_m {r['bm']}, median "
                                                     f"{_median(r['issue'][3]) / 1e3:.2f} us)" for r in firsts)
               + f": {v / 1e3:.2f} us, against one tma_latency_ns ({hw.tma_latency_ns:.0f} ns) for a later block's "
               "first stage")
        out["sm90_first_fill_ns"] = (v, how)

    # the first block's K loop where the kernel paces the ring's first fill by arrivals (v9.8,
    # FIRST_FILL_PER_SM): each CTA's first L1 MMA record less the median of its later ones, the
    # median over every such CTA of the traces at those block_m
    paced = [r for r in rows if FIRST_FILL_PER_SM.get(r["bm"], 0) and r["first_kloop"]]
    if paced:
        ex = [x for r in paced for x in r["first_kloop"]]
        v = max(0.0, _median(ex))
        how = ("each CTA's first L1 MMA record less the median of its later ones, where the kernel paces the ring's "
               "first fill by arrivals (design_sm90.FIRST_FILL_PER_SM, kernel v9.8): median over the "
               f"{len(ex)} CTAs of " + ", ".join(f"T={r['tokens']} (block_m {r['bm']}, median "
                                                   f"{_median(r['first_kloop']) / 1e3:.2f} us)" for r in paced)
               + f": {v / 1e3:.2f} us")
        out["sm90_first_kloop_ns"] = (v, how)

    # the schedulers' count fetch before the first walk: from each CTA's first pull record's start
    # (its counts are ready: after the count barrier, or its own count) to its producer's first load
    # record's start, less the first walk's fixed part (sched_block_ns; no chunk scan before a
    # wave's first block), the median over each trace's CTAs, then over the traces
    chains = [(r, r["fetch"]) for r in rows if r["fetch"] == r["fetch"]]
    if chains:
        v = _median([c for _, c in chains]) - hw.sched_block_ns
        how = ("from each CTA's first pull record's start (its counts ready) to its producer's first load record's "
               "start, median over the CTAs: " + ", ".join(f"T={r['tokens']} (block_m {r['bm']}) {c / 1e3:.2f} us"
                                                             for r, c in chains)
               + f"; the median over the traces less the first walk's fixed part (sched_block_ns, "
               f"{hw.sched_block_ns:.0f} ns): {v:.0f} ns")
        out["sm90_fetch_counts_ns"] = (v, how)

    # the consumers' gap between blocks (the gaps with chunk skips left out): where they read the
    # producer's block descriptors (BLOCK_DESCRIPTORS, kernel v9.1) all of it is sched_desc_ns, the
    # mean; where they walk inside the epilogue (WALK_IN_EPILOGUE, kernel v9.0) its fixed part is
    # sched_ahead_ns, the mean less sched_step_ns per chunk scan
    def mean_gap(rs, per_step):
        # the gaps less per_step per chunk scan, each trace weighted equally: (mean, gaps)
        gs = [np.asarray(r["gaps"], float).reshape(-1, 3) for r in rs]
        gs = [g[g[:, 2] == 0] for g in gs]
        w = np.concatenate([np.full(len(g), 1.0 / max(1, len(g))) for g in gs])
        x, y = np.concatenate([g[:, 1] for g in gs]), np.concatenate([g[:, 0] for g in gs])
        return float(np.sum(w * (y - per_step * x)) / np.sum(w)), len(y)

    def gap_pts(rs):
        return ", ".join(f"T={r['tokens']} (block_m {r['bm']}) {_median([g[0] for g in r['gaps']]):.0f} ns at a "
                         f"median {_median([g[1] for g in r['gaps']]):.0f} steps" for r in rs)

    # Since kernel v9.1 no block_m has its consumers walk between the blocks, so no trace shows
    # the walk alone: sched_block_ns, sched_step_ns and sched_skip_ns are the base preset's (fitted
    # to v9.0's block_m 16 traces; the walk's code is unchanged and the producer runs it).
    desc = [r for r in rows if BLOCK_DESCRIPTORS.get(r["bm"], False)]
    inside = [r for r in rows if WALK_IN_EPILOGUE.get(r["bm"], False)]
    if desc:
        v, n = mean_gap(desc, 0.0)
        how = (f"consumer gap between a block's epilogue end and the next block's MMA start where the consumers "
               f"read the producer's block descriptors (design_sm90.BLOCK_DESCRIPTORS, no walk): the mean over "
               f"{n} gaps, each trace weighted equally (median gap {gap_pts(desc)})")
        out["sched_desc_ns"] = (v, how)
    if inside:
        v, n = mean_gap(inside, hw.sched_step_ns)
        how = (f"consumer gap between a block's epilogue end and the next block's MMA start where the consumers "
               f"walk inside the epilogue (design_sm90.WALK_IN_EPILOGUE) = this + sched_step_ns "
               f"({hw.sched_step_ns:.0f} ns) per scheduler step: the mean over {n} gaps, each trace weighted equally "
               f"(median gap {gap_pts(inside)})")
        out["sched_ahead_ns"] = (v, how)

    # the arrival-mask bits seen by the L2 producers after the L1 epilogues' ends: the median over
    # the traces' waits, one figure where the release is relayed to a dispatch lane (kernel v8.1,
    # RELAY_RELEASE) and one where the epilogue releases itself; a class without a trace keeps
    # the base preset's figure
    for key, relayed in (("sm90_mask_seen_ns", False), ("sm90_mask_seen_relay_ns", True)):
        rs = [r for r in rows if RELAY_RELEASE.get(r["bm"], False) == relayed and r["mask_seen"]]
        if rs:
            lat = [x for r in rs for x in r["mask_seen"]]
            per = ", ".join(f"T={r['tokens']} (block_m {r['bm']}) {_median(r['mask_seen']):.0f} ns over "
                            f"{len(r['mask_seen'])}" for r in rs)
            how = (f"median over {len(lat)} L2 producer waits of the time from the later of the two L1 epilogue "
                   f"ends that set a K block's arrival-mask bits to the wait's end "
                   f"({'relayed to a dispatch lane' if relayed else 'released by the epilogue itself'}; {per})")
            out[key] = (_median(lat), how)

    # L1 epilogue: a line in block_m; the intercept is the fixed hand-off (amax reduction,
    # fence, 256-thread barrier, arrival-mask release)
    a1, b1 = _line([r["bm"] for r in rows], [r["epi1"] for r in rows])
    epi1 = ", ".join(f"{r['epi1'] / 1e3:.2f} us at T={r['tokens']} (block_m {r['bm']})" for r in rows)
    how = f"median L1 epilogue {epi1}: {b1:.1f} ns per block row over {threads} consumer threads"
    out["l1_epilogue_thread_ns_per_elem"] = (b1 * threads / BLOCK_N, how)
    how = (f"intercept in block_m of the median L1 epilogue ({epi1}): the fixed hand-off (top-k weight loads, "
           f"amax reduction, fence, 256-thread barrier, arrival-mask release)")
    out["block_overhead_ns"] = (a1, how)

    # L2 epilogue: fixed + per element of block_m rows and of the valid rows, least squares in
    # relative error over every interval, each trace weighted equally
    A, Y = [], []
    for r in rows:
        d, v = r["epi2"]
        wt = 1.0 / np.sqrt(max(1, len(d)))
        A.append(np.column_stack([np.ones_like(v), (r["bm"] + v) * BLOCK_N / threads]) / d[:, None] * wt)
        Y.append(np.full(len(d), wt))
    f0, f1 = np.linalg.lstsq(np.vstack(A), np.concatenate(Y), rcond=None)[0]
    epi2 = ", ".join(f"{_median(r['epi2'][0]) / 1e3:.2f} us at T={r['tokens']} (block_m {r['bm']}, median "
                     f"{_median(r['epi2'][1]):.0f} valid rows)" for r in rows)
    how = (f"L2 epilogue = {f0:.0f} ns + {f1:.1f} ns x (block_m + valid rows) x {BLOCK_N} / {threads} threads, "
           f"least squares in relative error over every L2 epilogue, each trace weighted equally (median {epi2})")
    out["l2_epilogue_fixed_ns"] = (float(f0), how)
    out["l2_epilogue_thread_ns_per_elem"] = (float(f1), how)

    # pulls: each CTA pulls its range of items in rounds of 4 (one per dispatch warp), each a
    # latency plus one 4 KiB chunk
    big = max(rows, key=lambda r: r["tokens"])
    chunk = 4096 / (hw.sm_load_gbs / DISPATCH_WARPS_PER_SM)
    how = (f"median over CTAs of the pull time per round at T={big['tokens']} ({big['pull_round']:.0f} ns; "
           f"{big['pull_rounds']} rounds of one item per dispatch warp), less one 4 KiB chunk ({chunk:.0f} ns)")
    out["pull_latency_ns"] = (big["pull_round"] - chunk, how)
    # combine: the slowest CTA's time over the rounds of the grid-stride loop, apart where the
    # kernel loads a token's slots several at a time (design_sm90.combine_slots; kernel v8.0) and
    # where it loads them one at a time (block_m 16: since kernel v9.5 the two-CTA instances at
    # 3-682 tokens, where the call's end after the last grid sync read 4.1-6.1 us on v9.8's traces
    # against the batched round's 2.6; session 43)
    multi = [r for r in rows if r["combine_rounds"] >= 2]
    for key, serial in (("combine_round_ns", False), ("combine_round_serial_ns", True)):
        fitted = [r for r in multi if (r["combine_slots"] == 1) == serial]
        require(len(fitted) >= 1, "fit_sm90_traces", "a trace with 2+ combine rounds in an instance that loads the "
                f"combine's slots {'one' if serial else 'several'} at a time (design_sm90.combine_slots)",
                [(r["tokens"], r["bm"]) for r in rows])
        cr = [r["combine"] / r["combine_rounds"] for r in fitted]
        slots = "/".join(str(n) for n in sorted({r["combine_slots"] for r in fitted}))
        how = ("slowest CTA's combine / grid-stride rounds (ceil(tokens x hidden / 8 / (SMs x 512))), "
               f"slots loaded {slots} at a time: "
               + ", ".join(f"T={r['tokens']} (block_m {r['bm']}) {r['combine'] / 1e3:.2f} us / {r['combine_rounds']}"
                           for r in fitted) + f"; median {np.median(cr):.0f} ns")
        out[key] = (float(np.median(cr)), how)
    gss = [r["grid_sync"] for r in rows if r["grid_sync"] is not None]
    if gss:
        out["grid_sync_ns"] = (float(np.median(gss)),
                               "last arrival to first release of the grid sync before the combine: "
                               + ", ".join(f"{g / 1e3:.2f} us" for g in gss) + ", median")
    # dispatch start (kernel v8.5+): count, publish, sort, count barrier, counts and pool-block
    # offsets, until the pull starts; the model adds the barrier's release (grid_sync_ns) itself
    gsn = out["grid_sync_ns"][0] if gss else hw.grid_sync_ns
    c0, c1 = _line([r["share"] for r in rows], [r["pull_start"] - gsn for r in rows])
    how = (f"first pull's start (median over CTAs) less grid_sync_ns ({gsn:.0f} ns) = {c0:.0f} ns + {c1:.1f} ns per "
           f"item of the largest CTA's share of the T k items, least squares over the traces: "
           + ", ".join(f"T={r['tokens']} {r['pull_start'] / 1e3:.2f} us at {r['share']} items" for r in rows))
    out["sm90_count_ns"] = (c0, how)
    out["sm90_count_item_ns"] = (max(c1, 0.0), how)
    return out


def _ep_pool_sources(rp):
    """The source rank of every pool position of one rank (experts in order, each in the
    plan's pull order)."""
    import numpy as np

    return np.concatenate([rp.pull_order(e)[:, 0] for e in range(len(rp.recv_counts))] or [np.zeros(0, np.int64)])


def fit_sm90_ep_traces(paths: list[str], l2_epilogue_fixed_ns: float, l2_epilogue_thread_ns_per_elem: float) -> dict:
    """Fit the expert-parallel figures of the hardware model to EP kernel traces of this
    project's SM90 kernel (several ranks; see module docstring).

    * ``nvlink_latency_ns``: CTA ``c`` pulls pool positions ``[N c / S, N (c + 1) / S)`` with
      its 4 dispatch warps, item ``j`` of the range by warp ``j % 4``, and its pull record ends
      when warp 0 leaves its loop (``csrc/megamoe/kernel_sm90.cu`` dispatch_role_ep), so the
      record is warp 0's items one after another.  Per trace, least squares of the record over
      warp 0's local and remote items (no intercept) gives the time of a local and of a
      remote item; a remote item pays :data:`sim.engine.SM90_REMOTE_ROUND_TRIPS` dependent
      NVLink round trips beyond a local one, so the round trip is the median over the traces
      of the difference over that count.
    * ``l2_epilogue_ep_ns``: what every L2 epilogue takes beyond the one-rank line
      ``l2_epilogue_fixed_ns + l2_epilogue_thread_ns_per_elem x (block_m + valid rows) x 128 /
      256 threads``, least squares in relative error over every L2 epilogue, each trace
      weighted equally.  The source also gives, per trace, the least-squares cost of one more
      row stored to another rank at the same valid rows (~0: the stores are posted).

    Args:
        paths: kernel traces (NPZ) with two or more ranks.
        l2_epilogue_fixed_ns, l2_epilogue_thread_ns_per_elem: the one-rank L2 epilogue line
            (:func:`fit_sm90_traces`, as the hardware file rounds them).

    Returns:
        figure name -> (value, how it was fitted: the numbers behind it).

    Raises:
        InputError: a trace of one rank, or without per-CTA pull records.
    """
    import numpy as np

    from megamoe.design_sm90 import BLOCK_N, CONSUMER_WARPS, cta_item_starts
    from megamoe.trace import KIND, Trace

    from .engine import DISPATCH_WARPS_PER_SM, SM90_REMOTE_ROUND_TRIPS

    threads = 32 * CONSUMER_WARPS
    rows = []
    for p in paths:
        t = Trace.load(p)
        meta = t.meta
        R = int(meta["num_ranks"])
        require(R > 1, "fit_sm90_ep_traces", "traces of two or more ranks", f"{p}: {R}")
        plan = _sm90_plan(t)
        S = plan.num_sms
        X, Y, E2, E2r = [], [], [], []
        for rp in plan.ranks:
            r, bm = rp.rank, rp.config.block_m
            src = _ep_pool_sources(rp)
            j0 = cta_item_starts(len(src), S)  # each CTA's first pool position
            pull = t.where(rank=r, kind=KIND["pull"])
            require(len(pull) > 0 and bool((pull["sm"] >= 0).all()), "fit_sm90_ep_traces", "one pull record per CTA",
                    f"{p}: rank {r}")
            for c, d in zip(pull["sm"].tolist(), (pull["t_end_ns"] - pull["t_start_ns"]).tolist()):
                w0 = src[j0[c]:j0[c + 1]:DISPATCH_WARPS_PER_SM]  # warp 0's items
                X.append((int((w0 == r).sum()), int((w0 != r).sum())))
                Y.append(d)
            # L2 epilogues: block_m, valid rows, rows to another rank, duration
            pos = np.concatenate([[0], np.cumsum(rp.tokens_per_expert)])
            e2 = t.where(rank=r, kind=KIND["l2_epilogue"])
            for e, m, v, d in zip(e2["expert"].tolist(), e2["m_block"].tolist(), e2["tokens"].tolist(),
                                  (e2["t_end_ns"] - e2["t_start_ns"]).tolist()):
                s = src[pos[e] + m * bm:min(pos[e + 1], pos[e] + (m + 1) * bm)]
                E2.append((bm, v, d))
                E2r.append(int((s != r).sum()))
        X, Y = np.asarray(X, float), np.asarray(Y, float)
        a_loc, a_rem = np.linalg.lstsq(X, Y, rcond=None)[0]
        e2 = np.asarray(E2, float)
        vr = np.asarray(E2r, float)
        per_remote = np.linalg.lstsq(np.column_stack([np.ones(len(e2)), e2[:, 1], vr]), e2[:, 2], rcond=None)[0][2]
        rows.append({"tokens": int(meta["tokens_per_rank"][0]), "ranks": R, "loc": float(a_loc),
                     "rem": float(a_rem), "e2": e2, "per_remote": float(per_remote)})
    out = {}

    # a remote pull: the local item plus SM90_REMOTE_ROUND_TRIPS NVLink round trips
    excess = [r["rem"] - r["loc"] for r in rows]
    rtt = float(np.median(excess)) / SM90_REMOTE_ROUND_TRIPS
    how = ("a CTA's pull record is its dispatch warp 0's items one after another; least squares of it over warp 0's "
           "local and remote items per trace: " + ", ".join(
               f"T={r['tokens']} {r['loc'] / 1e3:.2f} us local, {r['rem'] / 1e3:.2f} us remote" for r in rows)
           + f"; a remote item pays {SM90_REMOTE_ROUND_TRIPS} dependent NVLink round trips (the row in two batches, "
           f"the scales, the top-k weight) beyond a local one: median excess {np.median(excess) / 1e3:.2f} us / "
           f"{SM90_REMOTE_ROUND_TRIPS} (the excess of a remote load round trip over a local one)")
    out["nvlink_latency_ns"] = (rtt, how)

    # L2 epilogue with several ranks: a constant beyond the one-rank line
    A, Y = [], []
    meds = []
    for r in rows:
        bm, v, d = r["e2"].T
        line = l2_epilogue_fixed_ns + l2_epilogue_thread_ns_per_elem * (bm + v) * BLOCK_N / threads
        wt = 1.0 / np.sqrt(len(d))
        A.append(wt / d)
        Y.append((1.0 - line / d) * wt)
        meds.append(f"T={r['tokens']} {_median(d) / 1e3:.2f} us vs {_median(line) / 1e3:.2f} us")
    x = float(np.linalg.lstsq(np.concatenate(A)[:, None], np.concatenate(Y), rcond=None)[0][0])
    how = (f"L2 epilogue with {rows[0]['ranks']} ranks = the one-rank line ({l2_epilogue_fixed_ns:.0f} ns + "
           f"{l2_epilogue_thread_ns_per_elem:.1f} ns x (block_m + valid rows) x {BLOCK_N} / {threads} threads) + "
           f"{x:.0f} ns, least squares in relative error over every L2 epilogue, each trace weighted equally "
           f"(median measured vs line: {', '.join(meds)}); a row stored to another rank instead of this one adds "
           + ", ".join(f"{r['per_remote']:+.1f} ns at T={r['tokens']}" for r in rows)
           + " (least squares over valid and remote rows within each trace): the stores are posted, the cost is the "
           "symmetric-memory path every row takes")
    out["l2_epilogue_ep_ns"] = (x, how)
    return out


def base_preset(base: str) -> Path:
    """The preset file a calibration starts from (``calibrate --base``): the calibrated file is that
    preset with the measured figures replaced, so a path is refused.

    Raises:
        InputError: ``calibrate --base``, ``base`` no preset name.
    """
    path = preset_path(base)
    if path is None:
        raise InputError("calibrate --base", f"a preset ({', '.join(preset_names())})", shown_text(base))
    return path


def calibrated_toml(base: str, measured: dict, kernel: dict | None = None, date: str | None = None) -> str:
    """A hardware TOML: the base preset with measured figures replaced (sources say how).

    Raises:
        InputError: the result does not validate (e.g. a measured figure <= 0).
    """
    data = resolve_base(tomllib.loads(base_preset(base).read_text()))
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
    for key, value in (kernel or {}).items():
        put(key, round(value, 4), "from a megamoe kernel trace")
    lines = [f'# Calibrated from {base} by megamoe calibrate ({date}, {measured.get("device", "?")}).',
             f'name = {json.dumps(data["name"])}', *([f'arch = {json.dumps(data["arch"])}'] if "arch" in data else []),
             "", "[figures]"]
    lines += [f"{k} = {v!r}" for k, v in figs.items()]
    lines += ["", "[sources]"]
    lines += [f"{k} = {json.dumps(srcs[k])}" for k in figs]  # JSON strings are TOML basic strings
    text = "\n".join(lines) + "\n"
    parse_hardware(tomllib.loads(text))  # the file must load
    return text


#: The committed kernel traces and per-role profile the H200 model's SM90 figures are fitted
#: to (paths from the repository root): one CTA per SM at 64 and 512 tokens (block_m 16, the plan
#: with ``ctas_per_sm=1``, the instance EP > 1 runs) and 4096 (block_m 128); the other EP1 traces
#: (1, 3, 6, 8, 12, 16, 64, 256, 512, 1024 and 8192 tokens, two CTAs per SM at 3-512) are left out, as checks
#: of the fit.
SM90_FIT_TRACES = ("benchmarks/traces/kernel_flash_ep1_one_cta_t64.npz",
                   "benchmarks/traces/kernel_flash_ep1_one_cta_t512.npz",
                   "benchmarks/traces/kernel_flash_ep1_t4096.npz")
#: The two-CTA trace ``sm90_pair_share_first`` and ``sm90_pair_share`` are fitted to
#: (:func:`fit_sm90_pair_share`), each against the one-CTA trace of the same token count
#: (:data:`SM90_PAIR_ONE_CTA_TRACES`): 64 tokens (blocks by ticket in the wave-lag order:
#: RankPlan.block_tickets, RankPlan.wave_lag); the two-CTA traces at 3-16, 256 and 512 tokens
#: are left out, as checks.
SM90_PAIR_FIT_TRACES = ("benchmarks/traces/kernel_flash_ep1_t64.npz",)
SM90_PAIR_ONE_CTA_TRACES = ("benchmarks/traces/kernel_flash_ep1_one_cta_t64.npz",)
#: The committed EP2 traces (two H200s) the expert-parallel figures (``nvlink_latency_ns``,
#: ``l2_epilogue_ep_ns``) are fitted to; EP2 at 1 and 8192 tokens per rank are left out, as
#: checks of the fit.
SM90_EP_FIT_TRACES = tuple(f"benchmarks/traces/kernel_flash_ep2_t{t}.npz" for t in (64, 512, 2048))
SM90_EP_FIT_DEVICE = "two lent H200s (EP2, NV18)"
SM90_FIT_PROFILE = "benchmarks/results/kernel_profile_stages_h200.json"
SM90_FIT_DATE = "2026-12-05"
SM90_FIT_KERNEL = ("FP8 WGMMA v9.12, build 349f5e1e (TMA loads, E2M1 decoded into WGMMA registers through the weight "
                   "fold's table, four producer warps, the wide instance at 1-2 tokens, the consumers' walk inside "
                   "the epilogue at block_m >= 32, the producer's block descriptors at block_m 16, two CTAs per SM at "
                   "block_m 16 from 3 tokens taking the plan's blocks by ticket in the wave-lag order, with the "
                   "register split 48 / 48 / 80, the wide instances counting locally at one CTA per SM and at two, "
                   "the ring's first fill paced by arrivals at block_m 16, the one-item pull's top-k weight loaded with its row, "
                   "the one-CTA wide instance's producer taking the counts from its own CTA's local count, "
                   "block_m 128's WGMMAs at each block's valid rows rounded up to 32; every "
                   "version's change: docs/kernel-versions.md, "
                   "benchmarks/NOTES_kernel.md)")
SM90_PROFILE_KERNEL = "FP8 WGMMA v8.6 kernel (its profile instance)"
#: The committed trace ``sched_skip_ns`` was fitted to (:func:`fit_sm90_walk_skip`): 1 token, the
#: only traced size whose plan runs the one-CTA wide instance (block_m 16, one wave of 256
#: experts); the same kernel build as the other EP1 traces (all recorded on v9.11,
#: benchmarks/NOTES_kernel.md, session 44).
SM90_SKIP_FIT_TRACE = "benchmarks/traces/kernel_flash_ep1_t1.npz"
#: The committed traces ``sm90_local_count_ns`` is fitted to (:func:`fit_sm90_local_count`): every
#: EP1 trace whose plan counts locally, the one-CTA wide instance at 1 token and the two-CTA one
#: (kernel v9.7 on) at 3-16 tokens.
SM90_LOCAL_COUNT_FIT_TRACES = tuple(f"benchmarks/traces/kernel_flash_ep1_t{t}.npz" for t in (1, 3, 6, 8, 12, 16))
#: The committed two-CTA traces whose plans meet at the count barrier (64-512 tokens),
#: ``sm90_count_pair_ns`` is fitted to (:func:`fit_sm90_count_pair`).
SM90_COUNT_PAIR_FIT_TRACES = tuple(f"benchmarks/traces/kernel_flash_ep1_t{t}.npz" for t in (64, 256, 512))
#: The committed traces ``sm90_pull_base_ns`` and ``sm90_pull_warp_ns`` are fitted to
#: (:func:`fit_sm90_pull`): every one-CTA-per-SM EP1 trace whose pull runs before the GEMMs load
#: much (1 token, the one-CTA traces at 64 and 512, 1024 at block_m 32); at 4096 and 8192 tokens a
#: round reads 0.4 us above the line, the block_m 128 K loops loading beside it.
SM90_PULL_FIT_TRACES = tuple(f"benchmarks/traces/kernel_flash_ep1_{t}.npz"
                             for t in ("t1", "one_cta_t64", "one_cta_t512", "t1024"))
#: The committed traces ``block_jitter`` is fitted to (:func:`fit_block_jitter`): one CTA per SM
#: at block_m 16 and 32, whose L1 K loops stream their weights at a steady rate. At block_m 128
#: (4096, 8192 tokens) consecutive L1 K loops differ more (3.7-4.6%), with the HBM's phases, which
#: the model's HBM calendar prices itself; at two CTAs per SM the pair share moves them.
BLOCK_JITTER_FIT_TRACES = tuple(f"benchmarks/traces/kernel_flash_ep1_{t}.npz"
                                for t in ("one_cta_t64", "one_cta_t512", "t1024"))
#: The committed two-CTA traces whose CTAs with one item pull it alone (3-64 tokens):
#: ``sm90_pull_pair_ns`` is fitted to them (:func:`fit_sm90_pull_pair`).
SM90_PULL_PAIR_FIT_TRACES = tuple(f"benchmarks/traces/kernel_flash_ep1_t{t}.npz" for t in (3, 6, 8, 12, 16, 64))
SM90_SKIP_FIT_KERNEL = SM90_FIT_KERNEL
SM90_SKIP_FIT_DATE = SM90_FIT_DATE
#: The kernel and day of the EP2 traces: v6.4's (the two-GPU machine was not lent in the
#: sessions that re-recorded the EP1 traces on v6.5-v6.7 and v7-v7.2; those changed the consumers'
#: K loop and both epilogues (the weight fold, the activation fold, the L2 epilogue's stores), moved the profile clocks
#: to a separate instance and the producer's idle-wait records after its issues, and made the
#: EP pull fold each row; the EP index exchange and combine are v6.4's).
SM90_EP_FIT_KERNEL = ("FP8 WGMMA v6.4 (TMA loads, E2M1 decoded into WGMMA registers by shifts, four producer warps, "
                      "one-ballot scheduler, vectorized EP index prefix, build fbc2931d)")
SM90_EP_FIT_DATE = "2026-12-01"


def sm90_fit_sources(fit: dict, traces=SM90_FIT_TRACES, profile_path: str | None = SM90_FIT_PROFILE,
                     date: str = SM90_FIT_DATE, kernel: str = SM90_FIT_KERNEL,
                     profile_kernel: str = SM90_PROFILE_KERNEL, device: str = "the lent H200",
                     fitter: str = "fit_sm90_traces") -> dict:
    """figure -> (value rounded to 4 significant digits, source string naming the files, the
    device, the date, the kernel version and how it was fitted) for the output of
    :func:`fit_sm90_traces` (or of ``fitter``: :func:`fit_sm90_ep_traces` on the EP traces,
    ``profile_path=None``, ``device=SM90_EP_FIT_DEVICE``)."""
    import os

    stems = [os.path.basename(p) for p in traces]
    common = os.path.commonprefix(stems)
    tail = os.path.commonprefix([s[::-1] for s in stems])[::-1]
    mid = [s[len(common):len(s) - len(tail)] for s in stems]
    files = f"{os.path.dirname(traces[0])}/{common}{{{','.join(mid)}}}{tail}" if len(stems) > 1 else traces[0]
    where = f"{files} (this project's SM90 kernel, {kernel} version, measured on {device} {date})"
    out = {}
    for key, (value, how) in fit.items():
        if key == "e2m1_decode_thread_ns_per_elem" and profile_path:
            src = (f"fitted to {profile_path} (per-role cycle profile, {profile_kernel}, lent H200, {date}) and the "
                   f"K-loop times of {where} by sim.calibrate.{fitter}: {how}")
        elif key == "grid_sync_ns":
            src = f"measured in {where} by sim.calibrate.{fitter}: {how}"
        else:
            src = f"fitted to {where} by sim.calibrate.{fitter}: {how}"
        if key == "sm90_mma_fraction":
            src = src.replace("fit_sm90_traces: ", "fit_sm90_traces: the SM90 kernel's WGMMA m64nBMk32 + wait + "
                              "FP32 promotion rate as a fraction of the sustained FP8 GEMM rate (mma_efficiency): ", 1)
        out[key] = (float(f"{value:.4g}"), src)
    return out


#: The copy-engine probe (``benchmarks/device/tma_probe.cu``, run by ``tma_probe.py`` on the lent
#: H200) that ``tma_latency_ns`` and ``sm_load_gbs`` come from (:func:`fit_tma_probe`).
TMA_PROBE = "benchmarks/results/tma_probe_h200.json"
#: The stage size whose latency prices a block's first load: the weight tile of one K block
#: (128 rows x 128 K in E2M1, 8 KiB), the largest copy of a stage.
TMA_PROBE_LATENCY_BYTES = 8192


def fit_tma_probe(path: str, label: str | None = None) -> dict:
    """``tma_latency_ns`` and ``sm_load_gbs`` from the copy-engine probe's JSON.

    * ``tma_latency_ns``: the median time from issue to completion of one
      :data:`TMA_PROBE_LATENCY_BYTES` ``cp.async.bulk`` copy of fresh lines (HBM) while every SM
      has one such copy in flight: a block's first stage, when all SMs start blocks together.
    * ``sm_load_gbs``: the most one CTA moved alone, over the probe's one-CTA streaming rows
      (median of five runs each; L2 or HBM, one to eight issuing warps): one SM's engine limit.

    Args:
        path: the probe's JSON (``benchmarks/device/tma_probe.py OUT.json``).
        label: how the sources name the file (default ``path``; :func:`refit_h200` passes
            :data:`TMA_PROBE`, the path from the repository root, so the preset does not depend on
            where the checkout lies).

    Returns:
        figure name -> (value, source string naming the file, device, date and row).

    Raises:
        InputError: the file lacks the latency row or a one-CTA streaming row.
    """
    d = json.loads(Path(path).read_text(encoding="utf-8"))
    sms = d["sms"]
    lat = [r for r in d["latency"] if r["bytes"] == TMA_PROBE_LATENCY_BYTES and r["source"] == "hbm"
           and r["ctas"] == sms]
    require(len(lat) == 1, "fit_tma_probe", f"one latency row of {TMA_PROBE_LATENCY_BYTES} B from hbm on {sms} CTAs",
            len(lat))
    one = [r for r in d["stream"] if r["ctas"] == 1]
    require(len(one) >= 1, "fit_tma_probe", "one-CTA streaming rows", 0)
    best = max(one, key=lambda r: r["gbs_p50"])
    r = lat[0]
    where = f"measured by {d['source']} ({label or path}) on the lent {d['device']} {d['date']}"
    alone = [x for x in d["latency"] if x["bytes"] == r["bytes"] and x["ctas"] == 1]
    return {
        "tma_latency_ns": (float(f"{r['ns_p50']:.4g}"), (
            f"{where}: median issue-to-completion time of one {r['bytes']} B cp.async.bulk copy of fresh lines with "
            f"each of the {sms} SMs keeping one in flight ({r['samples']} copies; p10 {r['ns_p10']:.0f} ns, p90 "
            f"{r['ns_p90']:.0f} ns); "
            + ", ".join(f"one CTA alone from {x['source']}: {x['ns_p50']:.0f} ns" for x in alone))),
        "sm_load_gbs": (float(f"{best['gbs_p50']:.4g}"), (
            f"{where}: the most one CTA streamed alone, {best['warps']} issuing warp(s) x {best['stages_per_warp']} "
            f"copies of {best['bytes']} B in flight from {best['source']} (median of {best['runs']} runs); "
            "one issuing warp moved " + ", ".join(f"{x['gbs_p50']:.0f}" for x in one if x["warps"] == 1)
            + " GB/s (its issue loop, not the engine, the limit)")),
    }


def sm90_ep_fit_sources(fit: dict) -> dict:
    """:func:`sm90_fit_sources` for the output of :func:`fit_sm90_ep_traces` on
    :data:`SM90_EP_FIT_TRACES`."""
    return sm90_fit_sources(fit, traces=SM90_EP_FIT_TRACES, profile_path=None, device=SM90_EP_FIT_DEVICE,
                            fitter="fit_sm90_ep_traces", kernel=SM90_EP_FIT_KERNEL, date=SM90_EP_FIT_DATE)


def refit_h200(root: str | None = None, toml_path: str | None = None) -> dict:
    """Read ``tma_latency_ns`` and ``sm_load_gbs`` off the copy-engine probe (:data:`TMA_PROBE`,
    :func:`fit_tma_probe`), fit the SM90 figures to the committed traces and profile with them
    (:data:`SM90_FIT_TRACES`, :data:`SM90_FIT_PROFILE`), then the expert-parallel figures to the EP2 traces
    (:data:`SM90_EP_FIT_TRACES`, on the L2 epilogue line just fitted, rounded as written) and
    ``sm90_local_count_ns`` to :data:`SM90_LOCAL_COUNT_FIT_TRACES` (:func:`fit_sm90_local_count`) and
    ``sm90_pair_share_first`` and ``sm90_pair_share`` to :data:`SM90_PAIR_FIT_TRACES` against
    :data:`SM90_PAIR_ONE_CTA_TRACES` (:func:`fit_sm90_pair_share`), ``block_jitter`` to
    :data:`BLOCK_JITTER_FIT_TRACES` (:func:`fit_block_jitter`) and ``sm90_pull_pair_ns`` to
    :data:`SM90_PULL_PAIR_FIT_TRACES` (:func:`fit_sm90_pull_pair`), and
    write them with their sources into the H200 preset (or ``toml_path``), leaving every other
    line as it is.  Returns :func:`fit_tma_probe`, :func:`sm90_fit_sources` and
    :func:`sm90_ep_fit_sources` in one dict."""
    import re

    base = Path(root) if root else Path(__file__).resolve().parent.parent
    prof = json.loads((base / SM90_FIT_PROFILE).read_text())
    probe = fit_tma_probe(str(base / TMA_PROBE), label=TMA_PROBE)
    fit = dict(probe)
    fit.update(sm90_fit_sources(fit_sm90_traces([str(base / p) for p in SM90_FIT_TRACES], prof,
                                                hw_overrides={k: v for k, (v, _) in probe.items()})))
    ep = fit_sm90_ep_traces([str(base / p) for p in SM90_EP_FIT_TRACES], fit["l2_epilogue_fixed_ns"][0],
                            fit["l2_epilogue_thread_ns_per_elem"][0])
    fit.update(sm90_ep_fit_sources(ep))
    from .hardware import load_hardware

    def fitted(fitter, traces, *args) -> dict:
        """``fitter`` on the committed ``traces`` (and ``args``), with its sources: the kernel and day
        of those traces (:data:`SM90_SKIP_FIT_KERNEL`, :data:`SM90_SKIP_FIT_DATE`)."""
        return sm90_fit_sources(fitter([str(base / p) for p in traces], *args), traces=traces, profile_path=None,
                                date=SM90_SKIP_FIT_DATE, kernel=SM90_SKIP_FIT_KERNEL, fitter=fitter.__name__)

    fold = load_hardware("h200").pull_fold_chunk_ns
    fit.update(fitted(fit_sm90_pull, SM90_PULL_FIT_TRACES, fold))
    fit.update(fitted(fit_sm90_pull_pair, SM90_PULL_PAIR_FIT_TRACES, fold))
    fit.update(fitted(fit_sm90_local_count, SM90_LOCAL_COUNT_FIT_TRACES))
    fit.update(fitted(fit_sm90_combine_start, (*SM90_FIT_TRACES, *SM90_PAIR_FIT_TRACES)))
    fit.update(fitted(fit_block_jitter, BLOCK_JITTER_FIT_TRACES))
    counted = dataclasses.replace(load_hardware("h200"), **{k: v for k, (v, _) in fit.items()})
    fit.update(fitted(fit_sm90_count_pair, SM90_COUNT_PAIR_FIT_TRACES, counted))
    # the pair share is fitted on the model with every figure just fitted (the H200 preset's others)
    hw = dataclasses.replace(load_hardware("h200"), **{k: v for k, (v, _) in fit.items()})
    fit.update(sm90_fit_sources(fit_sm90_pair_share([str(base / p) for p in SM90_PAIR_FIT_TRACES],
                                                    [str(base / p) for p in SM90_PAIR_ONE_CTA_TRACES], hw),
                                traces=SM90_PAIR_FIT_TRACES, profile_path=None, date=SM90_FIT_DATE,
                                kernel=SM90_FIT_KERNEL + ", two CTAs per SM against the one-CTA trace of the same "
                                "token count",
                                fitter="fit_sm90_pair_share"))
    path = Path(toml_path) if toml_path else PRESET_DIR / "h200.toml"
    text = path.read_text()
    head, _, srcs = text.partition("[sources]")
    for key, (value, src) in fit.items():
        head, n = re.subn(rf"(?m)^{key} = .*$", f"{key} = {value!r}", head)
        require(n == 1, "refit_h200", f"one line for {key} in [figures]", n)
        srcs, n = re.subn(rf"(?m)^{key} = .*$", lambda _m: f"{key} = {json.dumps(src)}", srcs)
        require(n == 1, "refit_h200", f"one line for {key} in [sources]", n)
    text = head + "[sources]" + srcs
    parse_hardware(tomllib.loads(text))  # the file must load
    path.write_text(text)
    return fit


if __name__ == "__main__":
    for k, (v, _) in refit_h200().items():
        print(f"{k} = {v}")
