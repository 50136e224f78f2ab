"""Summary metrics of a simulated call, with the published formulas.

The headline figures follow DeepGEMM ``tests/test_mega_moe.py`` (PR #316) exactly, as
written in ``shared/anchors/README.md``, per rank and then averaged over ranks:

* ``num_recv_tokens`` = routed (token, slot) pairs whose expert lives on the rank;
* TFLOPS = ``2 * num_recv_tokens * H * I * 3 / t``;
* HBM bytes = touched experts x (``2*I*H/2 + H*I/2``) + ``recv*H`` + ``2*recv*I`` + ``2*recv*H``;
* NVLink bytes = ``recv * H * 3``;
* GB/s are scaled by ``approx_factor = t / (t - t_red)``, ``t_red = T*H*2*(1+k) / 6.5e12`` s.

Beyond the published ones: ``t_reduction_us`` (the simulated combine tail), overlap
efficiency (``|comm ∩ compute| / min(|comm|, |compute|)`` per rank, with comm = pull rounds
∪ L2 epilogues (the NVLink write-back) and compute = MMA intervals on any SM), per-role busy
fraction (per unit the union of the role's work intervals, over units x t), and speedup vs the legacy 5-stage path.
"""

from __future__ import annotations

import numpy as np

from megamoe.trace import KIND, ROLE

REDUCTION_BYTES_PER_S = 6.5e12  # DeepGEMM tests/test_mega_moe.py t_reduction estimate


def _union(t0: np.ndarray, t1: np.ndarray) -> np.ndarray:
    """Merge intervals; returns ``[n, 2]`` disjoint sorted intervals."""
    if len(t0) == 0:
        return np.zeros((0, 2))
    o = np.argsort(t0, kind="stable")
    s, e = t0[o], t1[o]
    run_end = np.maximum.accumulate(e)
    new = np.concatenate([[True], s[1:] > run_end[:-1]])
    idx = np.nonzero(new)[0]
    starts = s[idx]
    ends = run_end[np.concatenate([idx[1:] - 1, [len(s) - 1]])]
    return np.stack([starts, ends], axis=1)


def _length(u: np.ndarray) -> float:
    return float((u[:, 1] - u[:, 0]).sum()) if len(u) else 0.0


def _intersection(a: np.ndarray, b: np.ndarray) -> float:
    """Total length of the intersection of two disjoint sorted interval sets."""
    i = j = 0
    tot = 0.0
    while i < len(a) and j < len(b):
        lo = max(a[i, 0], b[j, 0])
        hi = min(a[i, 1], b[j, 1])
        if hi > lo:
            tot += hi - lo
        if a[i, 1] < b[j, 1]:
            i += 1
        else:
            j += 1
    return tot


def published_metrics(num_recv: int, touched: int, num_tokens: int, t_s: float, hidden: int,
                      intermediate: int, top_k: int) -> dict:
    """The figures of DeepGEMM's test for one rank (``t_s`` seconds).

    When ``t_s <= t_red`` (a call with almost no work) the GB/s are left uncorrected
    (``approx_factor = 1``) instead of dividing by a non-positive time."""
    H, I = hidden, intermediate
    t_red = num_tokens * H * 2 * (1 + top_k) / REDUCTION_BYTES_PER_S
    # the test's correction only makes sense while the call outlasts its reduction estimate
    approx = t_s / (t_s - t_red) if t_s > t_red else 1.0
    hbm = touched * (2 * I * H / 2 + H * I / 2) + num_recv * H + 2 * num_recv * I + 2 * num_recv * H
    nvl = num_recv * H * 3
    return {
        "tflops": 2 * num_recv * H * I * 3 / t_s / 1e12 if t_s > 0 else 0.0,
        "hbm_gbs": hbm / t_s / 1e9 * approx if t_s > 0 else 0.0,
        "nvlink_gbs": nvl / t_s / 1e9 * approx if t_s > 0 else 0.0,
        "t_red_formula_us": t_red * 1e6,
        "hbm_bytes": hbm,
        "nvlink_bytes": nvl,
    }


def _by_rank(tr):
    """Yield ``(rank, index array)`` for every rank of a trace (one argsort, no copies)."""
    order = np.argsort(tr["rank"], kind="stable")
    ranks = tr["rank"][order]
    uniq, starts = np.unique(ranks, return_index=True)
    ends = list(starts[1:]) + [len(order)]
    for r, a, b in zip(uniq.tolist(), starts.tolist(), ends):
        yield r, order[a:b]


def overlap_efficiency(tr) -> float | None:
    """Mean over ranks of ``|comm ∩ compute| / min(|comm|, |compute|)``: comm = pull rounds
    and L2 epilogues (the NVLink write-back), compute = MMA intervals on any SM; ranks with
    no comm or no compute interval are left out.  ``None`` when no rank has both (an empty
    call: no token routed to an expert), where the ratio is 0 / 0."""
    kind, t0, t1 = tr["kind"], tr["t_start_ns"], tr["t_end_ns"]
    vals = []
    for _, idx in _by_rank(tr):
        k = kind[idx]
        comm = idx[(k == KIND["pull"]) | (k == KIND["l2_epilogue"])]
        comp = idx[(k == KIND["l1_mma"]) | (k == KIND["l2_mma"])]
        cu, pu = _union(t0[comm], t1[comm]), _union(t0[comp], t1[comp])
        lc, lp = _length(cu), _length(pu)
        if min(lc, lp) > 0:
            vals.append(_intersection(cu, pu) / min(lc, lp))
    return float(np.mean(vals)) if vals else None


def _union_length_by_unit(unit: np.ndarray, t0: np.ndarray, t1: np.ndarray) -> float:
    """The lengths of the unions of each unit's intervals, summed over the units (overlapping
    intervals of one unit, such as a load unit's copies in flight, count once): one :func:`_union`
    with the units' intervals laid end to end, each unit ``width`` after the one before, so that
    no two units' intervals meet."""
    if len(unit) == 0:
        return 0.0
    width = float(t1.max() - t0.min()) + 1.0
    shift = np.unique(unit, return_inverse=True)[1] * width
    return _length(_union(t0 + shift, t1 + shift))


def busy_fractions(tr, num_sms: int, span_ns) -> dict:
    """Role -> mean over ranks of the time a role has work on a unit, over units x span: per unit
    the length of the union of the role's work intervals (idle waits left out; intervals in flight
    together count once, so a fraction is at most 1), summed over the units. An interval with
    ``sm = -1`` (a record for the whole rank) counts on every unit. ``num_sms``: the units the
    trace's ``sm`` column counts (the SMs, or at two CTAs per SM the CTAs: ``RankPlan.num_sms``;
    a kernel trace's own: :func:`sim.compare.recorded_units`). ``span_ns``: one number or
    ``{rank: span}``. (Until the forty-eighth session the fraction summed the intervals'
    durations and was capped at 1, which hid overlapping loads: the default scenario's TMA roles
    summed to 1.09.)"""
    kind, role, sm = tr["kind"], tr["role"], tr["sm"]
    t0, t1 = tr["t_start_ns"], tr["t_end_ns"]
    out = {n: [] for n in ROLE}
    for r, idx in _by_rank(tr):
        span = float(span_ns[r] if isinstance(span_ns, dict) else span_ns)
        if span <= 0:
            continue
        work = idx[kind[idx] != KIND["idle_wait"]]
        for name, code in ROLE.items():
            sel = work[role[work] == code]
            if not len(sel):
                continue
            on, wide = sel[sm[sel] >= 0], sel[sm[sel] < 0]
            units, a, b = sm[on].astype(np.int64), t0[on], t1[on]
            if len(wide):  # a whole-rank record: on every unit
                units = np.concatenate([units, np.repeat(np.arange(num_sms, dtype=np.int64), len(wide))])
                a = np.concatenate([a, np.tile(t0[wide], num_sms)])
                b = np.concatenate([b, np.tile(t1[wide], num_sms)])
            busy = _union_length_by_unit(units, a, b)
            out[name].append(busy / (num_sms * span))
    return {k: float(np.mean(v)) for k, v in out.items() if v}


def balanced_time(tr, num_units: int, role: str = "consumer") -> dict:
    """A one-rank call's time had ``role``'s work been spread evenly over its units, each record
    costing what it cost in the trace: the role's first record's start (from the trace's first
    record), plus its work per unit (:func:`busy_fractions`' per-unit union of the role's work
    intervals, summed over the units, over ``num_units``), plus the trace's end after the role's
    last record. For the consumers of a kernel trace this is the time no other assignment of the
    same blocks, at the traced K-loop and epilogue costs, start and tail, could beat (each unit
    has to run its share of the work between the two). A bound under that assumption only: at two
    CTAs per SM a block's cost depends on what its partner runs, so another assignment changes the
    costs too. ``benchmarks/streaming_bound.py`` sets it against the time the weight-streaming
    target of issue 5 allows.

    Args:
        tr: a :class:`megamoe.trace.Trace` of one rank.
        num_units: the units its ``sm`` column counts (SMs, or CTAs at two per SM;
            :func:`sim.compare.recorded_units`).
        role: a name of :data:`megamoe.trace.ROLES`.

    Returns:
        ``{"start_ns", "work_ns", "tail_ns", "balanced_ns", "makespan_ns"}``, ns; ``balanced_ns`` is
        the sum of the first three.

    Raises:
        InputError: a trace of several ranks (``trace.rank``), ``num_units`` not a positive
            integer (``num_units``), an unknown role (``role``), no work record of ``role``
            (``trace``).
    """
    from megamoe.errors import InputError, is_int

    if not is_int(num_units) or num_units < 1:
        raise InputError("num_units", "a positive integer", num_units)
    if role not in ROLE:
        raise InputError("role", f"one of {', '.join(ROLE)}", role)
    ranks = np.unique(tr["rank"])
    if len(ranks) != 1:
        raise InputError("trace.rank", "the records of one rank", f"ranks {ranks.tolist()}")
    work = (tr["role"] == ROLE[role]) & (tr["kind"] != KIND["idle_wait"])
    if not work.any():
        raise InputError("trace", f"work records of the {role} role", "none")
    t0, t1 = tr["t_start_ns"], tr["t_end_ns"]
    first, end = float(t0.min()), float(t1.max())
    busy = busy_fractions(tr.select(work), num_units, 1.0)[role]  # summed union over units / num_units
    start, tail = float(t0[work].min()) - first, end - float(t1[work].max())
    return {"start_ns": start, "work_ns": busy, "tail_ns": tail, "balanced_ns": start + busy + tail,
            "makespan_ns": end - first}


def summarize(res) -> dict:
    """Summary dict of a :class:`sim.engine.SimResult` (keys documented in the module)."""
    from .legacy import legacy_time_ns

    plan, tr = res.plan, res.trace
    R = plan.num_ranks
    recv = plan.num_recv_tokens()
    per_rank = []
    # each rank's time runs from its own launch (launch_skew_us: later ranks start later)
    off = [1e3 * v for v in res.scenario.launch_offsets_us()]
    span = {r: float(res.rank_end_ns[r]) - off[r] for r in range(R)}
    for r in range(R):
        rp = plan.ranks[r]
        t_s = span[r] * 1e-9
        touched = int((rp.tokens_per_expert > 0).sum())
        m = published_metrics(int(recv[r]), touched, rp.num_tokens, t_s, plan.hidden,
                              plan.intermediate, plan.top_k)
        m.update(rank=r, time_us=t_s * 1e6, num_recv_tokens=int(recv[r]), touched_experts=touched,
                 t_reduction_us=float(res.t_reduction_ns[r]) / 1e3)
        per_rank.append(m)
    time_us = float(np.mean([m["time_us"] for m in per_rank]))

    legacy = legacy_time_ns(plan, res.hardware, res.scenario.routing_ids())
    out = {
        "time_us": time_us,
        "tflops": float(np.mean([m["tflops"] for m in per_rank])),
        "hbm_gbs": float(np.mean([m["hbm_gbs"] for m in per_rank])),
        "nvlink_gbs": float(np.mean([m["nvlink_gbs"] for m in per_rank])),
        "t_reduction_us": float(np.mean([m["t_reduction_us"] for m in per_rank])),
        "t_reduction_formula_us": float(np.mean([m["t_red_formula_us"] for m in per_rank])),
        "overlap_efficiency": overlap_efficiency(tr),
        # per unit: the SMs, or the CTAs where two share an SM (the trace records each CTA)
        "busy_fraction": busy_fractions(tr, max(rp.num_sms for rp in plan.ranks), span),
        "speedup_vs_legacy": legacy["total_ns"] / 1e3 / time_us if time_us > 0 else 0.0,
        "legacy_us": {k.replace("_ns", "_us"): v / 1e3 for k, v in legacy.items()},
        "num_recv_tokens": [int(x) for x in recv],
        "hbm_bytes_formula": float(np.mean([m["hbm_bytes"] for m in per_rank])),
        "hbm_bytes_simulated": float(np.mean(res.hbm_bytes_sim)),
        "nvlink_bytes_formula": float(np.mean([m["nvlink_bytes"] for m in per_rank])),
        "nvlink_bytes_simulated": float(np.mean(res.nvlink_bytes_sim)),
        "per_rank": per_rank,
        "num_events": int(res.num_events),
        "num_trace_records": int(len(tr)),
    }
    return out
