"""Three what-if studies (issue 8), run by the docs build and by ``benchmarks/what_if.py``.

1. **Experts per wave** at EP8 decode (V4-Pro, B200): predicted time against a fixed
   experts-per-wave override, beside the reference heuristic's choice.
2. **Reserved SMs** (SMs taken by a shared expert or another stream, as SGLang's
   integration does): predicted time against the SMs left to the kernel.
3. **Pull order under skewed routing** (V4-Flash, EP8): round-robin min-remaining vs the
   naive rank-by-rank order as traffic concentrates on EP rank 0's experts, on the B200
   switched fabric (any pair can fill a port) and on a what-if point-to-point fabric where
   one GPU pair carries 1/7 of a port (``nvlink_peer_gbs`` scaled by 1/7).

Each ``study_*`` returns plain rows (lists of dicts); :func:`plot_study` draws one PNG.

:func:`bounds` asks one call what bounds it (``megamoe simulate --bounds``): the call again with one
resource made faster at a time.
"""

from __future__ import annotations

from megamoe.scenario import Scenario

from .engine import simulate


def _time(hardware=None, **kw) -> dict:
    res = simulate(Scenario(**kw), hardware)
    pulls = res.trace.where(kind="pull")
    return {"time_us": res.summary["time_us"], "experts_per_wave": res.plan.ranks[0].experts_per_wave,
            "pull_us": float((pulls["t_end_ns"].max() - pulls["t_start_ns"].min()) / 1e3) if len(pulls) else 0.0}


def study_experts_per_wave(tokens=(32, 128), waves=(1, 2, 3, 4, 6, 8, 12, 16, 24, 48)) -> list[dict]:
    rows = []
    for t in tokens:
        ref = _time(shape="deepseek-v4-pro", num_ranks=8, tokens_per_rank=t)
        for w in waves:
            r = _time(shape="deepseek-v4-pro", num_ranks=8, tokens_per_rank=t, experts_per_wave=w)
            rows.append({"tokens": t, "experts_per_wave": w, "time_us": r["time_us"],
                         "reference_experts_per_wave": ref["experts_per_wave"], "reference_time_us": ref["time_us"]})
    return rows


def study_reserved_sms(tokens=(128, 4096), reserved=(0, 8, 16, 32, 48, 64)) -> list[dict]:
    rows = []
    for t in tokens:
        for s in reserved:
            r = _time(shape="deepseek-v4-pro", num_ranks=8, tokens_per_rank=t, reserved_sms=s)
            rows.append({"tokens": t, "reserved_sms": s, "sms": 148 - s, "time_us": r["time_us"]})
    return rows


def study_pull_order(fractions=(0.0, 0.3, 0.6, 0.9), tokens: int = 512) -> list[dict]:
    from .hardware import load_hardware

    b200 = load_hardware("b200")
    fabrics = {"switched": b200, "point-to-point": b200.scaled(nvlink_peer_gbs=1 / 7)}
    rows = []
    for fabric, hw in fabrics.items():
        for f in fractions:
            for policy in ("round-robin", "rank-by-rank"):
                r = _time(hw, shape="deepseek-v4-flash", num_ranks=8, tokens_per_rank=tokens,
                          routing=f"hot:{f}:8", policies=[policy])
                rows.append({"fabric": fabric, "hot_fraction": f, "pull_order": policy, "time_us": r["time_us"],
                             "pull_us": r["pull_us"]})
    return rows


#: The resources :func:`bounds` speeds up one at a time: (name, hardware figure -> factor, which
#: calls it applies to: "all", "ep" (several ranks) or a design).
BOUND_PROBES = (
    ("HBM bandwidth x2", {"hbm_gbs": 2.0}, "all"),
    ("tensor-core rate x2", {"fp8_dense_tflops": 2.0}, "all"),
    ("NVLink bandwidth x2", {"nvlink_gbs_per_direction": 2.0, "nvlink_peer_gbs": 2.0}, "ep"),
    ("grid syncs and NVLink barriers x0.5", {"grid_sync_ns": 0.5, "nvl_barrier_ns": 0.5}, "all"),
    ("epilogues x0.5", {"l1_epilogue_thread_ns_per_elem": 0.5, "l2_epilogue_thread_ns_per_elem": 0.5}, "all"),
    ("K loop's decode, promotion and stage hand-off x0.5",
     {"e2m1_decode_thread_ns_per_elem": 0.5, "sm90_promotion_ns_per_row": 0.5, "stage_handoff_ns": 0.5},
     "megamoe-sm90"),
)


def bounds(scenario: Scenario, hardware=None, base=None) -> dict:
    """What bounds one call: the call simulated again with each of :data:`BOUND_PROBES` (one resource
    made faster, every other figure as it is), against the call as it is.

    Args:
        scenario: the call.
        hardware: as :func:`sim.simulate` takes it (default: the scenario's).
        base: the call's own result on that hardware where the caller has it (not simulated again).

    Returns:
        ``{"time_us": the call's time, "rows": [{"probe", "factors", "time_us", "change"}]}``, ``change``
        the probe's time over the call's less 1 (negative: faster), in :data:`BOUND_PROBES`' order,
        the probes that do not apply left out (NVLink at one rank, the K-loop probe but for the
        megamoe-sm90 design); a probe that would take a figure past its range
        (:data:`sim.hardware.FIGURE_RANGES`) has ``time_us`` and ``change`` None and ``skipped``
        saying which.

    Raises:
        InputError: as :func:`sim.simulate`.
    """
    from .hardware import FIGURE_RANGES, Hardware, in_range, load_hardware

    hw = hardware if isinstance(hardware, Hardware) else load_hardware(hardware or scenario.hardware)
    base = base if base is not None else simulate(scenario, hw)
    design = base.plan.design
    rows = []
    for name, factors, where in BOUND_PROBES:
        if where == "ep" and scenario.num_ranks == 1 or where not in ("all", "ep", design):
            continue
        past = [f"{k} x{f:g} = {getattr(hw, k) * f:g} {FIGURE_RANGES[k][2]}, past its range's "
                f"{FIGURE_RANGES[k][0 if f < 1 else 1]:g}" for k, f in factors.items() if not in_range(k, getattr(hw, k) * f)]
        if past:  # a figure already near the end of its range: this probe is left out, said why
            rows.append({"probe": name, "factors": dict(factors), "time_us": None, "change": None,
                         "skipped": "; ".join(past)})
            continue
        t = simulate(scenario, hw.scaled(**factors)).summary["time_us"]
        rows.append({"probe": name, "factors": dict(factors), "time_us": t, "change": t / base.summary["time_us"] - 1})
    return {"time_us": base.summary["time_us"], "rows": rows}


def bound_verdict(result: dict) -> str:
    """One line from :func:`bounds`: the probe that gains most, and the next where it gains over
    half as much, with a caveat where the most is under 10%; or, where none gains 3%, that no one
    resource bounds the call."""
    rows = sorted((r for r in result["rows"] if r["change"] is not None), key=lambda r: r["change"])
    if not rows or rows[0]["change"] > -0.03:
        return "no one resource bounds it: none of these made faster gains 3% (the call's fixed costs and its chains)"
    top = [rows[0]] + [r for r in rows[1:2] if r["change"] < rows[0]["change"] / 2]
    line = "bound most by " + " and then ".join(
        f"{r['probe'].rsplit(' x', 1)[0]} ({100 * r['change']:+.1f}% at {r['probe'].rsplit(' ', 1)[1]})" for r in top)
    if rows[0]["change"] > -0.10:
        line += "; no resource alone gains 10%: the call's fixed costs and dependency chains weigh more"
    return line


def plot_study(name: str, rows: list[dict], path: str) -> None:
    """One PNG per study (``name`` in ``experts_per_wave``, ``reserved_sms``, ``pull_order``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    if name == "experts_per_wave":
        for t in sorted({r["tokens"] for r in rows}):
            sel = [r for r in rows if r["tokens"] == t]
            ax.plot([r["experts_per_wave"] for r in sel], [r["time_us"] for r in sel], marker="o", label=f"{t} tokens/rank")
            ax.scatter([sel[0]["reference_experts_per_wave"]], [sel[0]["reference_time_us"]], marker="*", s=160,
                       zorder=5, color="black")
        ax.set_xlabel("experts per wave (override; star = reference heuristic)")
        ax.set_title("V4-Pro EP8 decode on B200")
    elif name == "reserved_sms":
        for t in sorted({r["tokens"] for r in rows}):
            sel = [r for r in rows if r["tokens"] == t]
            base = sel[0]["time_us"]
            ax.plot([r["reserved_sms"] for r in sel], [r["time_us"] / base for r in sel], marker="o",
                    label=f"{t} tokens/rank ({base:.0f} us with 0 reserved)")
        ax.set_xlabel("SMs reserved for other work (of 148)")
        ax.set_ylabel("time / time with all SMs")
        ax.set_title("V4-Pro EP8 on B200")
    else:
        for fabric, style in (("switched", "-"), ("point-to-point", "--")):
            for pol, marker in (("round-robin", "o"), ("rank-by-rank", "s")):
                sel = [r for r in rows if r["pull_order"] == pol and r["fabric"] == fabric]
                ax.plot([r["hot_fraction"] for r in sel], [r["pull_us"] for r in sel], marker=marker,
                        linestyle=style, label=f"{fabric}, {pol}")
        ax.set_xlabel("share of draws to the 8 hot experts (all on EP rank 0)")
        ax.set_title("pull phase: V4-Flash EP8, 512 tokens/rank, B200")
    if name != "reserved_sms":
        ax.set_ylabel("predicted time (us)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
