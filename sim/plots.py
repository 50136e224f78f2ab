"""Figures of a simulated (or measured) call: timeline per warp role and utilization."""

from __future__ import annotations

import numpy as np

from megamoe.trace import KIND, KINDS, ROLE

COLORS = {
    "count": "#999999", "index_exchange": "#bbbbbb", "grid_sync": "#444444", "nvl_barrier": "#000000",
    "pull": "#1f77b4", "l1_load": "#aec7e8", "l1_mma": "#2ca02c", "l1_epilogue": "#98df8a",
    "l2_load": "#ffbb78", "l2_mma": "#d62728", "l2_epilogue": "#ff9896", "combine": "#9467bd",
    "idle_wait": "#f7f7f7",
}


def _edge(kind: str) -> str:
    """A bar's (and its legend patch's) edge: idle_wait's near-white fill needs one to be seen."""
    return "#666666" if kind == "idle_wait" else "none"


def _per_sm_union(s: np.ndarray, e: np.ndarray, sm: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The intervals ``[s, e)`` merged per SM (overlaps of one SM's intervals counted once)."""
    out_s, out_e = [], []
    order = np.lexsort((s, sm))
    cur_sm, a, b = None, 0.0, 0.0
    for i in order.tolist():
        if sm[i] == cur_sm and s[i] <= b:
            b = max(b, e[i])
            continue
        if cur_sm is not None:
            out_s.append(a)
            out_e.append(b)
        cur_sm, a, b = sm[i], s[i], e[i]
    if cur_sm is not None:
        out_s.append(a)
        out_e.append(b)
    return np.asarray(out_s, dtype=np.float64), np.asarray(out_e, dtype=np.float64)


def utilization(trace, rank: int, num_sms: int, bins: int = 400, mma_role: str = "mma") -> dict:
    """Fraction of SMs in MMA, in a pull round, in an L2 epilogue over time (rank ``rank``).

    ``tensor``: the share of the ``num_sms`` SMs with a block in its K loop, from the MMA records
    (``l1_mma``, ``l2_mma``) of role ``mma_role``: ``mma`` for ``deepgemm-sm100``, ``consumer``
    for ``megamoe-sm90``, whose units at two CTAs per SM are CTAs (units ``c`` and ``c + num_sms``
    share SM ``c``; an SM with both CTAs in MMA counts once).

    Returns dict with ``t_us`` (bin centres) and one array per resource."""
    t = trace.where(rank=rank)
    t_end = float(t["t_end_ns"].max()) if len(t) else 1.0
    edges = np.linspace(0.0, t_end, bins + 1)
    width = edges[1] - edges[0]

    def cover(s: np.ndarray, e: np.ndarray, per_sm: bool) -> np.ndarray:
        acc = np.zeros(bins)
        for a, b in zip(s, e):
            i0, i1 = int(a // width), min(int(b // width), bins - 1)
            if i0 > bins - 1:
                continue
            if i0 == i1:
                acc[i0] += (b - a) / width
            else:
                acc[i0] += ((i0 + 1) * width - a) / width
                acc[i0 + 1:i1] += 1.0
                acc[i1] += (b - i1 * width) / width
        return acc / (num_sms if per_sm else 1.0)

    def records(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return t["t_start_ns"][mask], t["t_end_ns"][mask]

    kind = t["kind"]
    mma = ((kind == KIND["l1_mma"]) | (kind == KIND["l2_mma"])) & (t["role"] == ROLE[mma_role])
    ms, me = _per_sm_union(*records(mma), t["sm"][mma] % num_sms)
    return {
        "t_us": (edges[:-1] + width / 2) / 1e3,
        "tensor": np.clip(cover(ms, me, True), 0, 1),
        "pull": np.clip(cover(*records(kind == KIND["pull"]), False), 0, 1),
        "l2_writeback": np.clip(cover(*records(kind == KIND["l2_epilogue"]), True), 0, 1),
    }


def plot_timeline(res, path: str, rank: int = 0, sms: int = 8) -> None:
    """Timeline PNG: roles of SMs ``0 .. sms-1`` of ``rank`` + utilization over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    tr = res.trace.where(rank=rank)
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(13, 7.5), height_ratios=[3, 1], sharex=True)
    roles = ("producer", "consumer") if res.plan.design == "megamoe-sm90" else ("tma_a", "mma", "epilogue")
    lanes = [(-1, "dispatch")] + [(s, r) for s in range(sms) for r in roles]
    for y, (sm, role) in enumerate(lanes):
        sel = (tr["sm"] == sm) & (tr["role"] == ROLE[role])
        if sm == -1:
            sel = (tr["sm"] == -1)
        for k in np.unique(tr["kind"][sel]):
            s2 = sel & (tr["kind"] == k)
            bars = list(zip(tr["t_start_ns"][s2] / 1e3, (tr["t_end_ns"][s2] - tr["t_start_ns"][s2]) / 1e3))
            ax.broken_barh(bars, (y - 0.4, 0.8), facecolors=COLORS[KINDS[k]], edgecolor=_edge(KINDS[k]),
                           linewidth=0.3)
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels(["rank (all SMs)" if sm < 0 else f"SM{sm} {role}" for sm, role in lanes], fontsize=7)
    ax.invert_yaxis()
    used = sorted({KINDS[k] for k in np.unique(tr["kind"])})
    ax.legend(handles=[Patch(facecolor=COLORS[k], edgecolor=_edge(k), linewidth=0.3, label=k) for k in used],
              ncol=1, fontsize=7,
              loc="upper left", bbox_to_anchor=(1.005, 1.0), frameon=False)
    sc = res.scenario
    ax.set_title(f"{sc.shape.name} EP{sc.num_ranks} T={sc.tokens_per_rank} on {res.hardware.name} "
                 f"({res.plan.design}): rank {rank}, {res.summary['time_us']:.1f} us")
    sm90 = res.plan.design == "megamoe-sm90"
    u = utilization(res.trace, rank, res.plan.num_sms, mma_role="consumer" if sm90 else "mma")
    ax2.plot(u["t_us"], u["tensor"], label="tensor cores (SMs in MMA)", color="#2ca02c")
    ax2.plot(u["t_us"], u["pull"], label="dispatch pulls", color="#1f77b4")
    ax2.plot(u["t_us"], u["l2_writeback"], label="L2 write-back (SMs)", color="#d62728")
    ax2.set_ylim(0, 1.05)
    ax2.set_xlabel("time (us)")
    ax2.set_ylabel("utilization")
    ax2.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.005, 1.0), frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
