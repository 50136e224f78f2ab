"""Traces against simulation: align intervals and report where they differ.

``compare_traces(measured, simulated)`` aligns intervals by ``(rank, sm, role, kind, expert,
m_block, n_block)`` (blocks run once per SM, so the key is unique for block work; rank-level
intervals such as pulls are matched in order of start time; with ``by_block`` the block work is
matched without the SM: where the units take their blocks by ticket, ``RankPlan.block_tickets``,
which unit runs a block is decided at run time, in the kernel and in the model apart) and reports:

* ``makespan_error`` — signed fraction, simulated / measured - 1;
* per kind: matched count, median and p90 of the absolute duration error
  ``|d_sim / d_meas - 1|`` (``kind_errors``); ``median_kind_error`` = median over kinds of
  the per-kind medians;
* per kind, the same kinds: the error of the duration *distribution*, the median over the
  quantiles :data:`QUANTILES` of ``|q_sim / q_meas - 1|`` over every interval of that kind on
  each side (``kind_quantile_errors``; ``median_kind_quantile_error`` = median over kinds).
  Where the units take their blocks by ticket the kernel decides at run time which block runs
  on an SM's first CTA and which on its second (the two run at different speeds: kernel v9.4's
  traces, ``sim.calibrate.fit_sm90_pair_share``), so a block's duration on one side is paired
  with the other CTA's price about half the time; the model can be held to the distribution,
  not to that pairing;
* per role: busy fraction (:func:`sim.metrics.busy_fractions`: per unit the union of the role's
  work intervals, over units x makespan, each trace over its own units) in both traces and the
  difference (``busy_fraction_error``);
* overlap efficiency in both and the difference (``overlap_efficiency_error``);
* unmatched intervals on either side, and ``unmatched_block_work``: block work intervals
  (load / MMA / epilogue of one block on one SM) present on one side only;
* ``milestones``: where each side's call reaches its phases, in us from its first record
  (:data:`MILESTONES`: the last pull's end, the median unit's first L1 MMA, the last L1 MMA's end,
  the last L2 epilogue's end, the end), so that a makespan error can be placed in the start, the L1
  phase, the L2 phase or the tail;
* ``compare_file`` adds ``scenario`` (as the trace records it), ``hardware_simulated`` (the name of the
  hardware the simulation ran on, ``Hardware.name``: the trace's own, or ``compare --hardware``), ``launch_skew_us`` and
  ``trace``.

``compare_file(path)`` loads a kernel trace (NPZ with ``meta`` and ``topk_idx``, see
:mod:`megamoe.trace`), simulates the same scenario (shape, ranks, tokens, the trace's own
routing, plan numbers from ``meta``) and compares. With several ranks it also takes the
ranks' launch skew from the trace (:func:`launch_skew_from_trace`: host launch jitter, which
the model does not predict) and simulates with it; ``makespan_error_no_skew`` is the error
of the simulation without it.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from megamoe.errors import InputError, is_int, require
from megamoe.trace import KIND, KINDS, Trace

from .metrics import busy_fractions, overlap_efficiency

#: Quantiles (percent) of a kind's durations compared by ``kind_quantile_errors``.
QUANTILES = (10, 25, 50, 75, 90)
#: Phase milestones of ``milestones``: (name, kind, how) with how ``"last_end"`` the latest end of
#: any record of the kind (rank-level ones included: the model records a rank's pulls once per
#: round) or ``"median_first"`` the median over units (rank, SM >= 0) of each unit's first start.
MILESTONES = (("pulls_end", "pull", "last_end"), ("first_l1_mma", "l1_mma", "median_first"),
              ("l1_mma_end", "l1_mma", "last_end"), ("l2_epilogue_end", "l2_epilogue", "last_end"))
#: How ``megamoe compare`` names each milestone (and the trace's ``end``).
MILESTONE_LABELS = {"pulls_end": "last pull ends", "first_l1_mma": "first L1 MMA (median unit)",
                    "l1_mma_end": "last L1 MMA ends", "l2_epilogue_end": "last L2 epilogue ends", "end": "end"}


def milestones(t: Trace) -> dict:
    """The trace's :data:`MILESTONES` and its ``end``, us from its first record (None where the
    trace has no record of the kind)."""
    if len(t) == 0:
        return {name: None for name, _, _ in MILESTONES} | {"end": None}
    t0 = float(t["t_start_ns"].min())
    out = {}
    for name, kind, how in MILESTONES:
        k = t.where(kind=kind)
        if how == "median_first":
            k = k.select(k["sm"] >= 0)
        if len(k) == 0:
            out[name] = None
        elif how == "last_end":
            out[name] = (float(k["t_end_ns"].max()) - t0) / 1e3
        else:  # each unit's first start: a minimum per (rank, SM) group
            _, unit = np.unique(k.unit_keys(), return_inverse=True)
            first = np.full(int(unit.max()) + 1, np.inf)
            np.minimum.at(first, unit, k["t_start_ns"])
            out[name] = (float(np.median(first)) - t0) / 1e3
    out["end"] = t.makespan_ns / 1e3
    return out


def _keys(t: Trace, by_block: bool = False) -> dict:
    """key -> index; rank-level (non-block) intervals get an occurrence counter; ``by_block``:
    block work (``expert`` >= 0 on an SM) keyed without its SM (-2)."""
    out, seen = {}, {}
    order = np.lexsort((t["t_start_ns"], t["kind"], t["role"], t["sm"], t["rank"]))
    for i in order.tolist():
        sm = int(t["sm"][i])
        if by_block and sm >= 0 and int(t["expert"][i]) >= 0:
            sm = -2
        base = (int(t["rank"][i]), sm, int(t["role"][i]), int(t["kind"][i]),
                int(t["expert"][i]), int(t["m_block"][i]), int(t["n_block"][i]))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out[base + (n,)] = i
    return out


def recorded_units(trace: Trace, default: int) -> int:
    """The units a trace's ``sm`` column counts, as its meta records them, times ``plan.ctas_per_sm``
    (at two CTAs per SM the CTAs): a kernel trace's ``num_sms``; a simulator trace's SMs, its
    ``hardware_figures.num_sms`` less its ``reserved_sms``; else ``default``."""
    meta = trace.meta if isinstance(trace.meta, dict) else {}
    plan = meta.get("plan") if isinstance(meta.get("plan"), dict) else {}
    figs = meta.get("hardware_figures") if isinstance(meta.get("hardware_figures"), dict) else {}
    n, c = meta.get("num_sms"), plan.get("ctas_per_sm", 1)
    if n is None and is_int(figs.get("num_sms")) and is_int(meta.get("reserved_sms", 0)):
        n = figs["num_sms"] - meta.get("reserved_sms", 0)
    return int(n) * int(c) if is_int(n) and n >= 1 and is_int(c) and c in (1, 2) else default


def compare_traces(measured: Trace, simulated: Trace, num_sms: int, by_block: bool = False,
                   measured_sms: int | None = None) -> dict:
    """Errors of ``simulated`` against ``measured`` (see module docstring; ``by_block``: block
    work matched without its SM). ``num_sms``: the units of the simulated trace's ``sm`` column
    (``RankPlan.num_sms``); ``measured_sms``: the measured trace's (default ``num_sms``; a kernel
    trace's own, :func:`recorded_units`), so that its busy fractions do not move with the hardware
    it is simulated on."""
    km, ks = _keys(measured, by_block), _keys(simulated, by_block)
    common = sorted(set(km) & set(ks))
    dm = measured["t_end_ns"] - measured["t_start_ns"]
    ds = simulated["t_end_ns"] - simulated["t_start_ns"]
    per_kind: dict[int, list[float]] = {}
    for key in common:
        a, b = dm[km[key]], ds[ks[key]]
        if a > 0 and key[3] != KIND["idle_wait"]:
            per_kind.setdefault(key[3], []).append(abs(b / a - 1.0))
    kind_errors = {KINDS[k]: {"matched": len(v), "median": float(np.median(v)), "p90": float(np.percentile(v, 90))}
                   for k, v in sorted(per_kind.items())}
    quantile_errors = {}
    for k in per_kind:
        a, b = dm[measured["kind"] == k], ds[simulated["kind"] == k]
        a, b = a[a > 0], b[b > 0]
        if len(a) and len(b):
            quantile_errors[KINDS[k]] = float(np.median(np.abs(np.percentile(b, QUANTILES)
                                                               / np.percentile(a, QUANTILES) - 1.0)))
    mk_m, mk_s = measured.makespan_ns, simulated.makespan_ns
    bm = busy_fractions(measured, measured_sms or num_sms, mk_m)
    bs = busy_fractions(simulated, num_sms, mk_s)
    om, os_ = overlap_efficiency(measured), overlap_efficiency(simulated)
    return {
        "makespan_measured_us": mk_m / 1e3,
        "makespan_simulated_us": mk_s / 1e3,
        "makespan_error": mk_s / mk_m - 1.0 if mk_m > 0 else float("nan"),
        "median_kind_error": float(np.median([v["median"] for v in kind_errors.values()])) if kind_errors else float("nan"),
        "kind_errors": kind_errors,
        "median_kind_quantile_error": (float(np.median(list(quantile_errors.values()))) if quantile_errors
                                       else float("nan")),
        "kind_quantile_errors": quantile_errors,
        "busy_fraction_measured": bm,
        "busy_fraction_simulated": bs,
        "busy_fraction_error": {k: bs[k] - bm[k] for k in bm if k in bs},
        "overlap_efficiency_measured": om,
        "overlap_efficiency_simulated": os_,
        "overlap_efficiency_error": None if om is None or os_ is None else os_ - om,
        "matched_intervals": len(common),
        "unmatched_measured": len(km) - len(common),
        "unmatched_simulated": len(ks) - len(common),
        # block work (an SM's load / MMA / epilogue of one block) present on one side only: the
        # two disagree about which blocks ran where. Rank-level rows (the simulator's dispatch
        # steps, sm = -1, vs the kernel's per-CTA ones) and idle waits never align one to one.
        "unmatched_block_work": sum(1 for k in set(km) ^ set(ks) if k[1] != -1 and k[4] >= 0
                                    and k[3] != KIND["idle_wait"]),
        "milestones": {name: {"measured_us": a, "simulated_us": b}
                       for (name, a), b in zip(milestones(measured).items(), milestones(simulated).values())},
    }


def scenario_from_meta(trace: Trace, policies: list | None = None):
    """The :class:`Scenario` a trace file describes (its own routing, plan numbers and seed from meta:
    the seed draws the simulator's block jitter);
    ``policies`` (specs or objects, :mod:`megamoe.policies`) in place of the built-in policies the
    trace records by name (a policy of one's own is recorded only by its name).

    Raises:
        InputError: the trace has no ``meta`` or no ``topk_idx``, a meta number is not an
            integer, meta's ``shape`` names another shape than its numbers, its
            ``tokens_per_rank`` differ from the stored routing's, or the stored routing is not one ``[T, top_k]`` array of expert ids in
            ``[-1, num_experts)`` per rank.
    """
    from megamoe.routing import check_ids
    from megamoe.scenario import Scenario
    from megamoe.shapes import MoEShape, get_shape

    meta = trace.meta
    require(isinstance(meta, dict) and "num_experts" in meta, "trace.meta",
            "a scenario (num_experts, top_k, hidden, intermediate, num_ranks, ...)", "missing")
    require(trace.topk_idx is not None, "trace.topk_idx", "the routing the kernel ran", "missing")

    def num(key: str) -> int:
        v = meta.get(key)
        require(isinstance(v, int) and not isinstance(v, bool), f"trace.meta.{key}", "an integer",
                "missing" if v is None else v)
        return v

    dims = (num("num_experts"), num("top_k"), num("hidden"), num("intermediate"))
    name = meta.get("shape", "custom")
    require(isinstance(name, str), "trace.meta.shape", "a string", name)
    if name != "custom":  # a named shape must be the one meta's numbers describe
        try:
            named = get_shape(name)
        except InputError:
            raise InputError("trace.meta.shape", "a preset name, an E,k,H,I string or 'custom'", name) from None
        got = (named.num_experts, named.top_k, named.hidden, named.intermediate)
        require(got == dims, "trace.meta.shape", "a shape with meta's E,k,H,I = " + ",".join(map(str, dims)),
                f"{name} = {','.join(map(str, got))}")
    shape = MoEShape(name, *dims)
    R = num("num_ranks")
    require(len(trace.topk_idx) == R, "trace.topk_idx", f"{R} arrays topk_idx_0 .. topk_idx_{R - 1} (meta num_ranks)",
            f"{len(trace.topk_idx)} array{'s' * (len(trace.topk_idx) != 1)}")
    ids = [check_ids(np.asarray(t), f"trace.topk_idx_{r}", shape.num_experts, shape.top_k)
           for r, t in enumerate(trace.topk_idx)]
    counts = [len(t) for t in ids]
    toks = meta.get("tokens_per_rank", counts)
    require(toks == counts, "trace.meta.tokens_per_rank", f"the stored routing's token counts {counts}", toks)
    plan = meta.get("plan", {})
    require(isinstance(plan, dict), "trace.meta.plan", "an object (block_m, experts_per_wave, ...)",
            type(plan).__name__)
    # a kernel trace's plan numbers are what the kernel ran: they are the simulation's too; a
    # simulator trace's scenario makes its plan again (compare_file checks it against the record)
    sim_trace = trace.from_simulator
    fixed = {}
    for key in ("experts_per_wave", "block_m"):
        v = plan.get(key, meta.get(key))
        require(v is None or (is_int(v) and v >= 1),
                f"trace.meta.plan.{key}", "an integer >= 1", v)
        fixed[key] = meta.get(key) if sim_trace else v
    for key in ("hardware", "design", "l2_wait"):
        require(isinstance(meta.get(key, ""), str), f"trace.meta.{key}", "a string", meta.get(key))
    # CTAs per SM: the plan's where the trace records it; a simulator trace without it (before the
    # forty-sixth session) its scenario's input (None: the plan chose); SM90 kernel traces before
    # kernel v9.2 name none and ran one CTA per SM
    design = meta.get("design", "megamoe-sm90")
    if sim_trace:
        ctas = meta.get("ctas_per_sm")
    elif "ctas_per_sm" in plan:
        ctas = plan["ctas_per_sm"]
    else:
        ctas = 1 if design == "megamoe-sm90" else None
    require(ctas is None or (is_int(ctas) and ctas in (1, 2)), "trace.meta.plan.ctas_per_sm", "1 or 2", ctas)
    # the scenario's other inputs where the trace records them (simulate --trace-npz records every
    # one; the kernel's traces record theirs, the defaults): left out, a what-if trace would be
    # compared with the default call
    # (the seed draws the simulator's block jitter: the trace's routing is its own, below)
    extra = {k: meta[k] for k in ("reserved_sms", "num_stages", "pool_tokens", "k_split", "wgmma_n_step",
                                  "combine_relay", "seed")
             if meta.get(k) is not None}
    # the WGMMA N step an SM90 kernel trace ran (its plan records it from kernel v9.12 on; the
    # kernels before ran every block whole: a step of 128, capped at the block's block_m)
    if not sim_trace and design == "megamoe-sm90" and "wgmma_n_step" not in extra:
        step = plan.get("wgmma_n_step", 128)
        from megamoe.design_sm90 import WGMMA_N_STEPS, WGMMA_N_STEPS_SAID

        require(is_int(step) and step in WGMMA_N_STEPS, "trace.meta.plan.wgmma_n_step", WGMMA_N_STEPS_SAID, step)
        extra["wgmma_n_step"] = step
    pols = meta.get("policies") or {}
    require(isinstance(pols, dict), "trace.meta.policies", "an object (policy kind -> policy name)", pols)
    from megamoe.policies import BUILTINS, is_builtin, policies_from_specs

    if policies is None:
        for kind, name in pols.items():
            require(is_builtin(name), f"trace.meta.policies.{kind}",
                    f"a built-in policy ({', '.join(sorted(BUILTINS))}; a policy of your own cannot be re-created "
                    "from the name a trace records: give it, compare --policy FILE.py:Class)", name)
            try:
                made = policies_from_specs([name]).names()
            except InputError as e:
                raise InputError(f"trace.meta.policies.{kind}", e.expected, e.got) from None
            require(kind in made, f"trace.meta.policies.{kind}", f"a built-in {kind} policy ({name} is a built-in "
                    f"{', '.join(made)} policy: a policy of your own under its name? give it, compare --policy "
                    "FILE.py:Class)", name)
        policies = list(pols.values())
    kinds = policies_from_specs(list(policies)).names()
    for key, kind in (("block_m", "block_config"), ("experts_per_wave", "wave")):
        if kind in kinds:  # the policy decides it again (the plan's number is its choice)
            fixed[key] = None
    keys = {"max_tokens": "max_tokens_per_rank", "tokens": "tokens_per_rank", "ranks": "num_ranks",
            "block_m": "plan.block_m", "experts_per_wave": "plan.experts_per_wave"}
    try:
        return Scenario(shape=shape, num_ranks=R,
                        max_tokens_per_rank=num("max_tokens_per_rank") if meta.get("max_tokens_per_rank")
                        else max(1, max(len(t) for t in ids)),
                        hardware=meta.get("hardware", "h200"), design=design,
                        **fixed, **extra, ctas_per_sm=ctas, policies=list(policies),
                        l2_wait=meta.get("l2_wait", "k_block"),
                        topk_idx=ids)
    except InputError as e:  # name the trace's own key, not the Scenario field it went into
        if e.field.startswith("trace."):
            raise
        raise InputError(f"trace.meta.{keys.get(e.field, e.field)}", e.expected, e.got) from None


def launch_skew_from_trace(trace: Trace) -> list[float]:
    """Each rank's kernel start after the earliest rank's, microseconds, from an EP trace.

    Each rank's records are timed from its own first record (the GPUs' clocks are not
    compared), so the skew is read off the first NVLink barrier, which every rank leaves at
    the same moment: rank r leaves it at ``e_r`` on its own clock, so it started
    ``max(e) - e_r`` after the earliest rank. ``[0.0] * R`` without barrier records.
    """
    R = int(trace.meta.get("num_ranks", 1)) if isinstance(trace.meta, dict) else 1
    rank, kind = trace["rank"], trace["kind"]
    ends = []
    for r in range(R):
        sel = rank == r
        bar = sel & (kind == KIND["nvl_barrier"])
        if not bar.any():
            return [0.0] * R
        ends.append(float(trace["t_end_ns"][bar].min() - trace["t_start_ns"][sel].min()))
    return [(max(ends) - e) / 1e3 for e in ends]


def compare_file(path: str, hardware=None, policies: list | None = None) -> tuple[dict, Trace, object]:
    """Load a trace file, simulate its scenario (with ``policies`` in place of the ones it records:
    :func:`scenario_from_meta`), compare.  Returns (report, measured, SimResult).

    With several ranks the simulation starts each rank at the launch skew measured in the
    trace (``report["launch_skew_us"]``); ``report["makespan_error_no_skew"]`` is the makespan
    error of the same simulation with every rank launched at once."""
    from .engine import simulate
    from .hardware import load_hardware

    measured = Trace.load(path)
    base = scenario_from_meta(measured, policies)
    figs = measured.meta.get("hardware_figures")
    if hardware is not None:
        hw = hardware
    elif "hardware_figures" in measured.meta:  # a simulator trace: the figures it was made with (its file may
        # have moved or changed)
        from .hardware import parse_hardware

        require(isinstance(figs, dict), "trace.meta.hardware_figures", "an object (figure -> number)",
                type(figs).__name__)
        name = measured.meta.get("hardware_name", "recorded")
        try:
            hw = parse_hardware({"name": name if isinstance(name, str) and name.strip() else "recorded",
                                 "figures": figs, "sources": {k: "recorded in the trace's meta" for k in figs}},
                                f"{path} (meta.hardware_figures)")
        except InputError as e:
            # a figure missing: one the model gained after the trace was made, whose model no value re-makes
            older = (" (a trace of an older simulator, made before this figure existed, cannot be re-made: simulate "
                     "it again)") if e.got == "missing" else ""
            raise InputError(e.field.replace("hardware.figures", "trace.meta.hardware_figures", 1)
                             .replace("hardware.sources", "trace.meta.hardware_figures", 1),
                             e.expected + older, e.got) from None
    else:
        try:
            hw = load_hardware(base.hardware)
        except InputError as e:  # the preset or file the trace's meta names: say where it came from
            if e.field != "hardware":
                raise
            raise InputError("trace.meta.hardware", e.expected, e.got) from None
    require(measured.makespan_ns > 0, "trace", "records spanning some time (a makespan > 0 ns)",
            "a makespan of 0 ns")
    skew = launch_skew_from_trace(measured) if base.num_ranks > 1 else [0.0]
    sc = dataclasses.replace(base, launch_skew_us=skew) if any(skew) else base
    res = simulate(sc, hw)
    if measured.from_simulator:
        # a simulator trace is re-made exactly or not at all: the plan must come out as recorded
        # (a policy of one's own recorded under a built-in's name would make another call)
        plan = measured.meta.get("plan") or {}
        rp = res.plan.ranks[0]
        made = {"ctas_per_sm": rp.ctas_per_sm, "block_m": rp.config.block_m, "experts_per_wave": rp.experts_per_wave,
                "num_stages": rp.num_stages, "wgmma_n_step": rp.wgmma_n_step}
        for key, v in made.items():  # the CTAs per SM first: they decide the rest
            require(key not in plan or plan[key] == v, f"trace.meta.plan.{key}",
                    f"the value its scenario's plan takes again ({v}: the trace altered, or a policy of one's own "
                    "named like a built-in? give it: compare --policy FILE.py:Class)", plan.get(key))
    # the simulation runs on the hardware's SMs; the SM90 kernel at two CTAs per SM records its CTAs
    # (the plan's units: RankPlan.num_sms)
    plan_units = max(rp.num_sms for rp in res.plan.ranks)
    units = max(plan_units, hw.num_sms)
    off = measured["sm"] >= units
    if off.any():
        i = int(np.argmax(off))
        per = f", {units // hw.num_sms} CTAs per SM" if units > hw.num_sms else ""
        raise InputError("trace.sm", f"SM indices < {units} (hardware {hw.name} has {hw.num_sms} SMs{per})",
                         f"record {i}: {int(measured['sm'][i])}")
    report = compare_traces(measured, res.trace, plan_units, by_block=any(rp.block_tickets for rp in res.plan.ranks),
                            measured_sms=recorded_units(measured, plan_units))
    report["launch_skew_us"] = skew
    report["makespan_error_no_skew"] = (simulate(base, hw).trace.makespan_ns / measured.makespan_ns - 1.0
                                        if any(skew) else report["makespan_error"])
    report["scenario"] = sc.to_dict()  # as recorded: its hardware is the trace's
    report["hardware_simulated"] = hw.name  # what the simulation ran on (compare --hardware)
    report["trace"] = str(path)
    return report, measured, res


def overlay_lane(trace: Trace, rank: int, sm: int) -> list[tuple[str, float, float, bool]]:
    """The bars of one SM's lane in :func:`plot_overlay`: ``(kind, start us from the rank's first
    record, duration us, rank_wide)`` for every record of ``rank`` on ``sm`` and every rank-wide
    record (``sm = -1``: the simulator's count, pull, grid sync and combine records, kept for the
    whole rank where the kernel records them per CTA), idle waits left out. Each rank counts from
    its own first record, as a kernel trace's rank clocks do (the simulator starts a late rank at
    its launch offset, which would put its lanes late by the skew)."""
    s = trace.where(rank=rank)
    origin = float(s["t_start_ns"].min()) if len(s) else 0.0
    sel = ((s["sm"] == sm) | (s["sm"] == -1)) & (s["kind"] != KIND["idle_wait"])
    return [(KINDS[k], (t0 - origin) / 1e3, (t1 - t0) / 1e3, bool(u == -1))
            for k, t0, t1, u in zip(s["kind"][sel], s["t_start_ns"][sel], s["t_end_ns"][sel], s["sm"][sel])]


def plot_overlay(measured: Trace, simulated: Trace, path: str, rank: int = 0, sms: int = 6) -> None:
    """PNG: for SMs 0..sms-1 of ``rank``, the measured (top) and simulated (bottom) lanes
    (:func:`overlay_lane`; a rank-wide record is drawn hatched and thinner on every lane)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    from .plots import COLORS

    fig, ax = plt.subplots(figsize=(13, 0.55 * 2 * sms + 1.5))
    labels, used = [], set()
    for sm in range(sms):
        for name, t in (("measured", measured), ("simulated", simulated)):
            y = len(labels)
            for kind, t0, dur, wide in overlay_lane(t, rank, sm):
                h = 0.4 if wide else 0.7
                ax.broken_barh([(t0, dur)], (y - h / 2, h), facecolors=COLORS[kind], edgecolor="#555555" if wide else "none",
                               hatch="////" if wide else None, linewidth=0.3)
                used.add(kind)
            labels.append(f"SM{sm} {name}")
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels, fontsize=7)
    ax.invert_yaxis()
    handles = [Patch(color=COLORS[k], label=k) for k in sorted(used)]
    handles.append(Patch(facecolor="white", edgecolor="#555555", hatch="////", label="a record for the whole rank (sm = -1)"))
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.005, 1.0), frameon=False)
    ax.set_xlabel(f"time from rank {rank}'s first record in each trace (us)")
    ax.set_title(f"rank {rank}: measured vs simulated")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
