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
