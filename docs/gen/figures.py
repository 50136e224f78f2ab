"""Figures, tables and the interactive timeline of the documentation site, made from the code.

Everything here is computed at build time from ``megamoe`` (plan, shapes, formats, layouts)
and from the simulator (``sim``); nothing is a hand-drawn image.  The mkdocs hook
(``docs/hooks/megamoe_docs.py``) calls :func:`generate` once per build and serves the
results as generated files; ``python docs/gen/figures.py OUTDIR`` writes them to a folder
for inspection.

:func:`generate` returns ``(files, snippets)``: ``files`` maps a site path
(``generated/...``) to bytes, ``snippets`` maps a marker name to Markdown that replaces
``<!-- gen:NAME -->`` in the pages.
"""

from __future__ import annotations

import io
import json
import tempfile
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch, Rectangle  # noqa: E402

from megamoe import plan as P  # noqa: E402
from megamoe.scenario import Scenario  # noqa: E402
from megamoe.trace import KIND, KINDS, ROLE  # noqa: E402

DPI = 90
RANK_COLORS = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7")

# The small scenario every page figure uses (keeps the build fast: ~1 s of simulation).
SMALL = dict(shape="deepseek-v4-flash", num_ranks=8, tokens_per_rank=512, hardware="b200", seed=0)


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _md_table(header: list[str], rows: list[list], align: str | None = None) -> str:
    align = align or "l" + "r" * (len(header) - 1)
    sep = ["---:" if a == "r" else ":---:" if a == "c" else "---" for a in align]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(sep) + " |"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _fitted_figures_table(doc: dict) -> str:
    """The figures of a hardware TOML (parsed) read off traces or the cycle profile: each one's value,
    what it was fitted on and by which function, from its ``[sources]`` text (a figure whose source
    starts "fitted to", "measured in benchmarks/traces" or "kept from the fit")."""
    import re

    rows = []
    for k, v in doc["figures"].items():
        src = doc["sources"][k]
        if not re.match(r"(fitted to|measured in benchmarks/traces|kept from the fit)", src):
            continue
        on = re.match(r"(?:fitted to|measured in) (\S+)", src)
        by = re.search(r"by (sim\.calibrate\.\w+)", src)
        on = (f"`{on.group(1).replace('benchmarks/traces/', '').replace('benchmarks/results/', '')}`"
              if on else src.split(":")[0].split(" (")[0])
        rows.append([f"`{k}`", f"{v:g}", on, f"`{by.group(1)}`" if by else "-"])
    return _md_table(["figure", "value", "fitted on", "by"], rows, "lrll")


def _traces_named(doc: dict) -> set[str]:
    """The trace files (``kernel_flash_*.npz`` names) that any source of a hardware TOML (parsed)
    names, with ``{a,b}`` alternatives expanded."""
    import re

    names = set()
    for src in doc["sources"].values():
        for m in re.finditer(r"benchmarks/traces/([\w{},.]+?\.npz)", src):
            pat = m.group(1)
            br = re.search(r"\{([^}]*)\}", pat)
            alts = br.group(1).split(",") if br else [""]
            names.update(pat[:br.start()] + a + pat[br.end():] if br else pat for a in alts)
    return names


class Gen:
    """Collects generated files and snippets; caches simulations."""

    def __init__(self, log=print):
        self.files: dict[str, bytes] = {}
        self.snippets: dict[str, str] = {}
        self.log = log
        self._sims: dict[tuple, object] = {}
        self.timings: dict[str, float] = {}

    def sim(self, **kw):
        from sim.engine import simulate

        sc = Scenario(**kw)
        key = json.dumps(sc.to_dict(), sort_keys=True, default=str) + repr(kw.get("policies"))
        if key not in self._sims:  # the same scenario spelled differently runs once
            self._sims[key] = simulate(sc)
        return self._sims[key]

    def small(self, **over):
        return self.sim(**{**SMALL, **over})

    def fig(self, name: str, fig) -> None:
        self.files[f"generated/{name}.png"] = _png(fig)

    # -- simulator figures ---------------------------------------------------------------
    def timeline(self) -> None:
        from sim.plots import plot_timeline

        res = self.small()
        path = Path(self._tmp) / "timeline.png"
        plot_timeline(res, str(path))
        self.files["generated/timeline_small.png"] = path.read_bytes()
        s = res.summary
        rp = res.plan.ranks[0]
        self.snippets["small_summary"] = _md_table(
            ["metric", "value"],
            [["scenario", "DeepSeek-V4-Flash (E=256, k=6, H=4096, I=2048), EP8, 512 tokens/rank, uniform routing, B200"],
             ["plan (rank 0)", f"block_m={rp.config.block_m}, block_n={rp.config.block_n}, block_k={rp.config.block_k}, "
                               f"experts/wave={rp.experts_per_wave}, waves={rp.num_waves}, stages={rp.num_stages}, "
                               f"SMs={res.plan.num_sms}, blocks={len(rp.blocks())}"],
             ["predicted time", f"{s['time_us']:.1f} us"],
             ["TFLOPS (per rank)", f"{s['tflops']:.0f}"],
             ["HBM / NVLink", f"{s['hbm_gbs']:.0f} / {s['nvlink_gbs']:.0f} GB/s"],
             ["reduction tail", f"{s['t_reduction_us']:.1f} us"],
             ["overlap efficiency", f"{s['overlap_efficiency']:.2f}"],
             ["speedup vs legacy 5-kernel path", f"{s['speedup_vs_legacy']:.2f}x"]], "ll")

    def stage_gantt(self) -> None:
        """Span of every trace kind on rank 0 (the nine stages as the simulator sees them)."""
        res = self.small()
        tr = res.trace.where(rank=0)
        order = ["count", "index_exchange", "grid_sync", "nvl_barrier", "pull", "l1_load", "l1_mma",
                 "l1_epilogue", "l2_load", "l2_mma", "l2_epilogue", "combine"]
        from sim.plots import COLORS

        fig, ax = plt.subplots(figsize=(10, 4.2))
        rows = []
        for i, k in enumerate(order):
            sel = tr["kind"] == KIND[k]
            if not sel.any():
                continue
            s, e = tr["t_start_ns"][sel] / 1e3, tr["t_end_ns"][sel] / 1e3
            busy = float(np.sum(e - s))
            if sel.sum() <= 20:  # few intervals (rank-wide phases): draw each one
                ax.broken_barh(list(zip(s, e - s)), (i - 0.4, 0.8), facecolors=COLORS[k], edgecolor="#333",
                               linewidth=0.5)
            else:  # per-block kinds: first start to last end
                ax.barh(i, e.max() - s.min(), left=s.min(), color=COLORS[k], edgecolor="#333", linewidth=0.5)
            ax.text(e.max() + 1, i, f"{s.min():.1f}-{e.max():.1f} us", va="center", fontsize=7)
            rows.append([k, f"{s.min():.1f}", f"{e.max():.1f}", f"{int(sel.sum())}", f"{busy:.0f}"])
        ax.set_yticks(range(len(order)))
        ax.set_yticklabels(order, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("time (us), rank 0")
        ax.set_title(f"Each interval kind on rank 0 (rank-wide phases drawn one by one, per-block kinds first start to last end)\n (V4-Flash EP8, 512 tokens/rank, B200): "
                     f"{res.summary['time_us']:.1f} us", fontsize=9)
        ax.set_xlim(0, res.summary["time_us"] * 1.18)
        self.fig("stage_gantt", fig)
        self.snippets["stage_table"] = _md_table(
            ["trace kind", "first start (us)", "last end (us)", "intervals", "busy time summed over SMs (us)"], rows)

    def barrier_fig(self) -> None:
        """Rank-wide phases (count, exchange, grid sync, NVLink barrier, pulls, combine) of every rank."""
        from sim.plots import COLORS

        res = self.small()
        tr = res.trace.select(res.trace["sm"] == -1)
        kinds = ["count", "index_exchange", "grid_sync", "nvl_barrier", "pull", "combine"]
        fig, ax = plt.subplots(figsize=(10, 3.6))
        R = res.plan.num_ranks
        for r in range(R):
            t = tr.where(rank=r)
            for k in kinds:
                sel = t["kind"] == KIND[k]
                if sel.any():
                    s, e = t["t_start_ns"][sel] / 1e3, t["t_end_ns"][sel] / 1e3
                    ax.broken_barh(list(zip(s, e - s)), (r - 0.4, 0.8), facecolors=COLORS[k], edgecolor="#333",
                                   linewidth=0.4)
        ax.set_yticks(range(R))
        ax.set_yticklabels([f"rank {r}" for r in range(R)], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("time (us)")
        ax.legend(handles=[Patch(color=COLORS[k], label=k) for k in kinds], ncol=6, fontsize=7, loc="upper center",
                  bbox_to_anchor=(0.5, -0.2))
        ax.set_title("Rank-wide phases of every rank (V4-Flash EP8, 512 tokens/rank, B200); GEMM work in between "
                     "is not drawn", fontsize=9)
        self.fig("barriers_ranks", fig)
        rows = []
        t0 = tr.where(rank=0)
        for k in ("grid_sync", "nvl_barrier"):
            sel = t0["kind"] == KIND[k]
            for a, b in zip(t0["t_start_ns"][sel] / 1e3, t0["t_end_ns"][sel] / 1e3):
                rows.append([k, f"{a:.1f}", f"{b:.1f}", f"{b - a:.1f}"])
        self.snippets["barrier_table"] = _md_table(["kind (rank 0)", "start (us)", "end (us)", "duration (us)"], rows)

    def plotly_timeline(self) -> None:
        import plotly
        import plotly.graph_objects as go
        from sim.plots import COLORS

        res = self.small()
        tr = res.trace.where(rank=0)
        sms = 4
        lanes = [(-1, "dispatch")] + [(s, r) for s in range(sms) for r in ("tma_a", "mma", "epilogue")]
        label = {ln: ("rank 0, all SMs" if ln[0] < 0 else f"SM{ln[0]} {ln[1]}") for ln in lanes}
        lane_of = np.full(len(tr), -1)
        for i, (sm, role) in enumerate(lanes):
            sel = (tr["sm"] == -1) if sm < 0 else ((tr["sm"] == sm) & (tr["role"] == ROLE[role]))
            lane_of[sel] = i
        keep = lane_of >= 0
        fig = go.Figure()
        for k in np.unique(tr["kind"][keep]):
            sel = keep & (tr["kind"] == k)
            name = KINDS[k]
            st, en = tr["t_start_ns"][sel] / 1e3, tr["t_end_ns"][sel] / 1e3
            y = [label[lanes[i]] for i in lane_of[sel]]
            hover = [f"{name}<br>expert {e} m {m} n {n} wave {w}<br>{a:.2f}-{b:.2f} us"
                     for e, m, n, w, a, b in zip(tr["expert"][sel], tr["m_block"][sel], tr["n_block"][sel],
                                                 tr["wave"][sel], st, en)]
            fig.add_trace(go.Bar(x=np.round(en - st, 4), base=np.round(st, 4), y=y, orientation="h", name=name,
                                 marker=dict(color=COLORS[name], line=dict(width=0.3, color="#555")),
                                 hovertext=hover, hoverinfo="text"))
        fig.update_layout(barmode="overlay", height=520, margin=dict(l=10, r=10, t=30, b=40),
                          xaxis_title=f"time (us); rank 0, SMs 0-{sms - 1}, call {res.summary['time_us']:.1f} us", legend=dict(orientation="h", y=-0.15),
                          yaxis=dict(categoryorder="array", categoryarray=[label[l] for l in lanes][::-1]))
        self.files["generated/plotly.min.js"] = plotly.offline.get_plotlyjs().encode()
        div = fig.to_html(full_html=False, include_plotlyjs=False, div_id="megamoe-timeline",
                          config={"displaylogo": False, "responsive": True})
        self.snippets["plotly_timeline"] = (
            '<script src="{root}generated/plotly.min.js"></script>\n'
            f'<div class="megamoe-plotly">\n{div}\n</div>\n')
        self.snippets["plotly_records"] = str(int(keep.sum()))

    def utilization_regions(self) -> None:
        """Utilization curves of rank 0 with the three overlap regions shaded."""
        from sim.plots import utilization

        res = self.small()
        u = utilization(res.trace, 0, res.plan.num_sms, bins=300)
        tr = res.trace.where(rank=0)
        fig, ax = plt.subplots(figsize=(10, 3.6))
        ax.plot(u["t_us"], u["tensor"], color="#2ca02c", label="tensor cores (fraction of SMs in MMA)")
        ax.plot(u["t_us"], u["pull"], color="#1f77b4", label="dispatch pulls in flight")
        ax.plot(u["t_us"], u["l2_writeback"], color="#d62728", label="L2 epilogue write-back (fraction of SMs)")

        def span(kind):
            sel = tr["kind"] == KIND[kind]
            return (float(tr["t_start_ns"][sel].min() / 1e3), float(tr["t_end_ns"][sel].max() / 1e3)) if sel.any() else None

        regions = []
        p, l1m, l1e, l2l, l2e = span("pull"), span("l1_mma"), span("l1_epilogue"), span("l2_load"), span("l2_epilogue")
        if p and l1m:
            regions.append(("I", max(p[0], l1m[0]), min(p[1], l1m[1])))
        if l1e and l2l:
            regions.append(("II", max(l1e[0], l2l[0]), min(l1e[1], l2l[1])))
        if l2e and l1m:
            regions.append(("III", max(l2e[0], l1m[0]), min(l2e[1], l1m[1])))
        shades = {"I": "#1f77b4", "II": "#ff7f0e", "III": "#9467bd"}
        for i, (name, a, b) in enumerate(regions):
            if b > a:
                y = 1.08 + 0.09 * i
                ax.plot([a, b], [y, y], color=shades[name], lw=5, solid_capstyle="butt")
                ax.text(a, y + 0.025, f"region {name}", fontsize=8, color=shades[name], va="bottom")
                ax.axvspan(a, b, color=shades[name], alpha=0.06)
        ax.set_ylim(0, 1.08 + 0.09 * len(regions) + 0.05)
        ax.set_yticks([0, 0.25, 0.5, 0.75, 1.0])
        ax.set_xlabel("time (us), rank 0")
        ax.set_ylabel("utilization")
        ax.legend(fontsize=7, loc="lower right")
        ax.set_title("Overlap in the simulated call (V4-Flash EP8, 512 tokens/rank, B200)", fontsize=9)
        self.fig("overlap_regions", fig)
        self.snippets["overlap_regions_table"] = _md_table(
            ["region", "what overlaps", "from (us)", "to (us)"],
            [[n, {"I": "dispatch pulls with L1 MMA", "II": "L1 epilogue with L2 loads/MMA",
                  "III": "L2 write-back with L1 MMA of later blocks/waves"}[n], f"{a:.1f}", f"{b:.1f}"]
             for n, a, b in regions])

    def wave_map(self) -> None:
        """Per-SM block sequence (expert, phase, wave) from the plan of a small skewed scenario."""
        res = self.small(tokens_per_rank=128, routing="zipf:1.0")
        rp = res.plan.ranks[0]
        S = res.plan.num_sms
        show = 16
        fig, ax = plt.subplots(figsize=(11, 4.6))
        cmap = plt.get_cmap("tab20")
        maxlen = 0
        for s in range(show):
            rows = rp.sm_blocks(s)
            maxlen = max(maxlen, len(rows))
            for j, (phase, e, m, n, w, _kp) in enumerate(rows):
                ax.add_patch(Rectangle((j, s), 0.95, 0.9, facecolor=cmap(int(e) % 20),
                                       hatch=None if phase == P.L1 else "////", edgecolor="#333",
                                       linewidth=1.2 if w % 2 else 0.3))
                ax.text(j + 0.47, s + 0.45, f"{'L1' if phase == P.L1 else 'L2'} e{e}\nm{m} n{n}", ha="center",
                        va="center", fontsize=5)
        ax.set_xlim(0, maxlen)
        ax.set_ylim(show, 0)
        ax.set_xlabel("position in the SM's block sequence (colour = local expert, hatched = L2; thick edge = odd wave)")
        ax.set_ylabel("SM")
        ax.set_title(f"MegaMoEScheduler order, rank 0, SMs 0-{show - 1} of {S} (V4-Flash EP8, 128 tokens/rank, zipf:1.0 "
                     f"routing: block_m={rp.config.block_m}, {rp.experts_per_wave} experts/wave, {rp.num_waves} waves)",
                     fontsize=9)
        self.fig("wave_map", fig)
        tab = []
        for T in (1, 32, 128, 512, 2048, 8192):
            sc = Scenario(**{**SMALL, "tokens_per_rank": T})
            pl = sc.plan(148, P.SM100_SMEM_CAPACITY)
            r0 = pl.ranks[0]
            e = P.expected_tokens_per_expert(T, 8, 6, 256)
            tab.append([T, f"{e:.1f}", r0.config.block_m, r0.config.block_k, r0.config.num_epilogue_threads,
                        r0.experts_per_wave, r0.num_waves, r0.num_stages, len(r0.blocks())])
        self.snippets["plan_table"] = _md_table(
            ["tokens/rank", "expected tokens/expert", "block_m", "block_k", "epilogue threads", "experts/wave",
             "waves", "stages", "blocks (rank 0)"], tab)

    def pull_order_fig(self) -> None:
        counts = [5, 3, 9, 2]
        order = P.pull_order(counts)
        remaining = np.array(counts)
        rounds, pos = [], 0
        while (remaining > 0).any():
            active = np.nonzero(remaining > 0)[0]
            L = int(remaining[active].min())
            rounds.append((len(rounds) + 1, [int(a) for a in active], L, pos, pos + L * len(active)))
            pos += L * len(active)
            remaining[active] -= L
            rounds[-1] = rounds[-1] + (remaining.tolist(),)
        fig, ax = plt.subplots(figsize=(10, 2.6))
        for i, (src, idx) in enumerate(order):
            ax.add_patch(Rectangle((i, 0), 0.95, 1, facecolor=RANK_COLORS[src], edgecolor="#333"))
            ax.text(i + 0.47, 0.5, f"r{src}\n#{idx}", ha="center", va="center", fontsize=7, color="white")
        for rnd, active, L, a, b in [r[:5] for r in rounds]:
            ax.plot([a - 0.02, a - 0.02], [-0.1, 1.25], color="black", lw=1.2)
            ax.text(a + 0.1, 1.12, f"round {rnd}\nL={L} x {len(active)}", ha="left", va="bottom", fontsize=7.5)
        naive = np.concatenate([[r] * c for r, c in enumerate(counts)])
        for i, src in enumerate(naive):
            ax.add_patch(Rectangle((i, -1.6), 0.95, 1, facecolor=RANK_COLORS[src], edgecolor="#333", alpha=0.6))
        ax.text(-0.3, -1.1, "naive\n(rank by rank)", ha="right", va="center", fontsize=8)
        ax.text(-0.3, 0.5, "min-peeling", ha="right", va="center", fontsize=8)
        ax.set_xlim(-0.2, len(order))
        ax.set_ylim(-1.8, 1.75)
        ax.axis("off")
        ax.legend(handles=[Patch(color=RANK_COLORS[r], label=f"source rank {r} ({c} tokens)") for r, c in enumerate(counts)],
                  ncol=4, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.02))
        self.fig("pull_order_5392", fig)
        self.snippets["pull_rounds"] = _md_table(
            ["round", "active ranks", "min remaining L", "pool slots", "remaining after the round"],
            [[r, ", ".join(map(str, act)), L, f"{a}-{b - 1}", ", ".join(map(str, rem))] for r, act, L, a, b, rem in rounds])
        self.snippets["pull_order_list"] = "`" + " ".join(f"{s}" for s in order[:, 0]) + "`"
        # Windows of 8 consecutive pulls: distinct peers touched, naive vs min-peeling, for a real expert
        res = self.small()
        rp = res.plan.ranks[0]
        e = int(np.argmax(rp.tokens_per_expert))
        o = rp.pull_order(e)[:, 0]
        nv = np.concatenate([[r] * c for r, c in enumerate(rp.recv_counts[e])])
        w = 8

        def peers(seq):
            return np.mean([len(set(seq[i:i + w])) for i in range(0, max(len(seq) - w, 0) + 1)])

        self.snippets["pull_peers"] = (
            f"For local expert {e} of rank 0 in the small scenario ({int(rp.tokens_per_expert[e])} tokens from 8 source "
            f"ranks: {', '.join(map(str, rp.recv_counts[e]))}), a window of {w} consecutive pulls touches on average "
            f"**{peers(o):.1f}** distinct source ranks in the plan's order and **{peers(nv):.1f}** in rank-by-rank order.")

    def moe_align(self) -> None:
        res = self.small(tokens_per_rank=128)
        rp = res.plan.ranks[0]
        tok = rp.tokens_per_expert
        bm = rp.config.block_m
        padded = rp.m_blocks_per_expert * bm
        fig, ax = plt.subplots(figsize=(10, 3.2))
        x = np.arange(len(tok))
        ax.bar(x, padded, color="#dddddd", edgecolor="#999", label=f"padded to block_m={bm}")
        ax.bar(x, tok, color="#4e79a7", label="routed items (token, slot)")
        ax.set_xlabel("local expert of rank 0")
        ax.set_ylabel("rows in the pool")
        ax.legend(fontsize=8)
        ax.set_title(f"Expert-contiguous pool of rank 0 (V4-Flash EP8, 128 tokens/rank, uniform): {int(tok.sum())} items, "
                     f"{int(padded.sum())} padded rows ({100 * (1 - tok.sum() / padded.sum()):.0f}% padding)", fontsize=9)
        self.fig("moe_align", fig)

    def buffer_layout(self) -> None:
        """Symmetric buffer regions of the V4-Pro default (sizes from the plan's formulas)."""
        H, I, E, k, R, T = 7168, 3072, 384, 6, 8, 8192
        el = E // R
        pool = P.pool_capacity_tokens(R, T, k, el)
        regions = [
            ("input x (FP8)", T * H), ("input x_sf (UE8M0)", T * H // 32), ("topk_idx (int64)", T * k * 8),
            ("topk_weights (FP32)", T * k * 4),
            ("L1 token pool (FP8)", pool * H), ("L1 SF pool", pool * H // 32), ("L1 top-k weight pool", pool * 4),
            ("L2 token pool (FP8)", pool * I), ("L2 SF pool", pool * I // 32),
            ("combine buffer (BF16, k x T x H)", k * T * H * 2),
        ]
        total = sum(b for _, b in regions)
        fig, ax = plt.subplots(figsize=(10, 2.6))
        left = 0
        cmap = plt.get_cmap("tab20")
        for i, (name, b) in enumerate(regions):
            ax.barh(0, b / 2**20, left=left / 2**20, color=cmap(i), edgecolor="white")
            left += b
        ax.set_yticks([])
        ax.set_xlabel("MiB from the start of the symmetric buffer (workspace not to scale, omitted)")
        ax.legend(handles=[Patch(color=cmap(i), label=f"{n}: {b / 2**20:.1f} MiB") for i, (n, b) in enumerate(regions)],
                  ncol=2, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.45))
        ax.set_title(f"Per-rank symmetric buffer, V4-Pro EP8, T_max=8192: pool {pool} tokens, total ~{total / 2**30:.2f} GiB",
                     fontsize=9)
        self.fig("buffer_layout", fig)
        self.snippets["pool_formula"] = (
            f"`pool = align({R}*{T}*min({k},{el}) + {el}*(192-1), 384)` = **{pool}** tokens "
            f"(`megamoe.plan.pool_capacity_tokens({R}, {T}, {k}, {el})`).")
        self.snippets["buffer_table"] = _md_table(["region", "bytes", "MiB"],
                                                  [[n, f"{b:,}", f"{b / 2**20:.1f}"] for n, b in regions])

    def warp_roles(self) -> None:
        fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 3.4), width_ratios=[1.4, 1])
        roles = [("dispatch", 0, 4, "#1f77b4"), ("TMA A + SFA", 4, 5, "#aec7e8"), ("TMA B + SFB", 5, 6, "#ffbb78"),
                 ("MMA issue (leader CTA)", 6, 7, "#2ca02c"), ("warp 7 (no task of its own)", 7, 8, "#eeeeee"),
                 ("epilogue + combine", 8, 16, "#d62728")]
        for name, a, b, c in roles:
            for w in range(a, b):
                ax.add_patch(Rectangle((w, 0), 0.95, 1, facecolor=c, edgecolor="#333"))
                ax.text(w + 0.47, 0.5, f"w{w}", ha="center", va="center", fontsize=7)
        ax.set_xlim(0, 16)
        ax.set_ylim(-0.2, 1.2)
        ax.axis("off")
        ax.legend(handles=[Patch(color=c, label=n) for n, _, _, c in roles], fontsize=7, ncol=2, loc="upper center",
                  bbox_to_anchor=(0.5, 0.0))
        ax.set_title("16 warps of one SM100 CTA (512 threads)", fontsize=9)
        regs = [("dispatch", 48, 128), ("TMA + MMA (non-epilogue)", 40, 128), ("epilogue", 208, 256)]
        left = 0
        handles = []
        for (name, r, t), c in zip(regs, ("#1f77b4", "#2ca02c", "#d62728")):
            ax2.barh(0, r * t, left=left, color=c, edgecolor="white", height=0.5)
            handles.append(Patch(color=c, label=f"{name}: {r} regs x {t} threads = {r * t}"))
            left += r * t
        ax2.axvline(65536, color="black", ls="--")
        ax2.text(65536, 0.32, "65536 (64 Ki) per SM ", fontsize=7, ha="right")
        ax2.set_xlim(0, 70000)
        ax2.set_ylim(-0.5, 0.5)
        ax2.set_yticks([])
        ax2.set_xticks([0, 16384, 32768, 49152, 65536])
        ax2.set_xticklabels(["0", "16 Ki", "32 Ki", "48 Ki", "64 Ki"])
        ax2.set_xlabel("32-bit registers of one SM")
        ax2.legend(handles=handles, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.25))
        ax2.set_title(f"Register split 48/40/208: {left} of 65536", fontsize=9)
        self.fig("warp_roles", fig)

    def numerics_fig(self) -> None:
        e2m1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=float)
        src = "`megamoe.formats`"
        try:
            import torch
            from megamoe import formats

            e2m1 = formats.e2m1_table().float().numpy()[:8]
            codes = torch.arange(0, 127, dtype=torch.uint8)
            e4m3 = formats.decode_e4m3(codes).numpy()
        except ImportError as exc:  # torch missing: the formats' definition, in numpy
            src = f"numpy (megamoe.formats unavailable: {type(exc).__name__})"
            exp, man = np.arange(127) >> 3, np.arange(127) & 7
            e4m3 = np.where(exp == 0, man / 8 * 2.0**-6, (1 + man / 8) * 2.0 ** (exp - 7.0))
        fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 3.0))
        ax.scatter(e4m3[e4m3 > 0], np.ones(int((e4m3 > 0).sum())), marker="|", s=200, color="#4e79a7")
        ax.scatter(e2m1[e2m1 > 0], np.zeros(int((e2m1 > 0).sum())), marker="|", s=300, color="#e15759")
        ax.set_xscale("log", base=2)
        ax.set_yticks([0, 1])
        ax.set_yticklabels(["E2M1 (FP4)", "E4M3 (FP8)"])
        ax.set_ylim(-0.6, 1.6)
        ax.set_xlabel("positive representable values (log2 axis)")
        ax.set_title(f"E4M3 max {e4m3.max():g}, E2M1 values {', '.join(f'{v:g}' for v in e2m1)}", fontsize=9)
        # UE8M0: a block of 32 values, amax -> power-of-two scale
        rng = np.random.default_rng(0)
        x = rng.standard_normal(32) * 3.3
        amax = np.abs(x).max()
        scale = 2.0 ** np.ceil(np.log2(amax / 448.0))
        q = np.clip(x / scale, -448, 448)
        ax2.bar(np.arange(32), x, color="#bbbbbb", label="block of 32 values")
        ax2.axhline(amax, color="#e15759", ls="--", lw=1)
        ax2.axhline(-amax, color="#e15759", ls="--", lw=1, label=f"amax {amax:.2f}")
        ax2.set_title(f"UE8M0 scale = 2^ceil(log2(amax/448)) = 2^{int(np.log2(scale))}; "
                      f"x/scale spans +-{np.abs(q).max():.0f} of 448", fontsize=9)
        ax2.legend(fontsize=7)
        self.fig("numerics_formats", fig)
        self.snippets["numerics_source"] = f"*Values decoded by {src} when this site was built.*"

    def weight_layout_fig(self) -> None:
        """8-row gate/up interleave and the UTCCP [4,32]->[32,4] transpose, from megamoe.layouts."""
        rows_i = 32  # I = 32 -> L1 rows 2I = 64
        try:
            import torch
            from megamoe import layouts

            t = torch.arange(2 * rows_i, dtype=torch.int32).reshape(1, 2 * rows_i, 1)
            inter = layouts.interleave_gate_up(t).reshape(-1).numpy()
            sf = torch.arange(128, dtype=torch.int32).reshape(1, 128, 1)
            utccp = layouts.utccp_transpose_sf(sf).reshape(-1).numpy()
            src = "megamoe.layouts"
        except ImportError as exc:  # torch missing: the layout rule, in numpy
            idx = np.arange(2 * rows_i)
            g, u = idx[:rows_i].reshape(-1, 8), idx[rows_i:].reshape(-1, 8)
            inter = np.stack([g, u], 1).reshape(-1)
            utccp = np.arange(128).reshape(4, 32).T.reshape(-1)
            src = f"numpy (megamoe.layouts unavailable: {type(exc).__name__})"
        fig, (ax, ax2) = plt.subplots(2, 1, figsize=(11, 3.6))
        for i, r in enumerate(inter):
            gate = r < rows_i
            ax.add_patch(Rectangle((i, 0), 0.95, 1, facecolor="#4e79a7" if gate else "#f28e2b", edgecolor="white"))
            ax.text(i + 0.47, 0.5, str(r if gate else r - rows_i), ha="center", va="center", fontsize=5.5, color="white")
        ax.set_xlim(0, len(inter))
        ax.set_ylim(0, 1)
        ax.axis("off")
        ax.set_title("L1 weight rows after interleave (blue: gate row g, orange: up row u), "
                     f"granularity 8, I=32 (computed by {src})", fontsize=9)
        cmap = plt.get_cmap("viridis")
        for i, r in enumerate(utccp[:64]):
            ax2.add_patch(Rectangle((i, 0), 0.95, 1, facecolor=cmap(int(r) / 127), edgecolor="white"))
            ax2.text(i + 0.47, 0.5, str(int(r)), ha="center", va="center", fontsize=5.5, color="white")
        ax2.set_xlim(0, 64)
        ax2.set_ylim(0, 1)
        ax2.axis("off")
        ax2.set_title("UTCCP transpose of scale rows: stored row 4i+j holds logical row 32j+i (first 64 of 128 stored rows)",
                      fontsize=9)
        self.fig("weight_layout", fig)

    def sm100_vs_sm90(self) -> None:
        rows = []
        try:
            from megamoe import design_sm90 as d9
        except Exception:
            d9 = None
        for T in (32, 128, 512, 2048, 8192):
            sc = Scenario(**{**SMALL, "tokens_per_rank": T})
            r0 = sc.plan(148, P.SM100_SMEM_CAPACITY).ranks[0]
            e = P.expected_tokens_per_expert(T, 8, 6, 256)
            row = [T, f"{e:.1f}", r0.config.block_m, r0.num_stages, r0.experts_per_wave]
            try:  # this project's SM90 plan, as the simulator and the kernel get it
                sc9 = Scenario(**{**SMALL, "tokens_per_rank": T, "hardware": "h200", "design": "megamoe-sm90"})
                q = sc9.plan(132, P.SM100_SMEM_CAPACITY).ranks[0]
                row += [q.config.block_m, q.num_stages, q.experts_per_wave]
                sm90_src = "`Scenario(design=\"megamoe-sm90\").plan` with 132 SMs"
            except Exception:
                if d9 is not None and hasattr(d9, "design_for"):
                    d = d9.design_for(T, 4096, 2048, 256, 6, num_sms=132).as_dict()
                    row += [d.get("block_m", "-"), d.get("num_stages", "-"), d.get("experts_per_wave", "-")]
                    sm90_src = "`megamoe.design_sm90.design_for` with 132 SMs"
                else:
                    row += ["-", "-", "-"]
                    sm90_src = "not available"
            rows.append(row)
        if d9 is not None:
            thr = getattr(d9, "THREADS", None)
            dw, pw, cw = (getattr(d9, n, None) for n in ("DISPATCH_WARPS", "PRODUCER_WARPS", "CONSUMER_WARPS"))
            roles = []
            w0 = 0
            for name, n in (("dispatch", dw), ("producer", pw), ("consumer", cw)):
                if n:
                    roles.append(f"{name} warps {w0}-{w0 + n - 1}")
                    w0 += n
            self.snippets["sm90_cta"] = f"{thr} threads: " + ", ".join(roles) + " (`megamoe.design_sm90`)"
            self.snippets["sm90_tile"] = (f"block_m {', '.join(map(str, getattr(d9, 'BLOCK_MS', ())))}, "
                                          f"block_n {getattr(d9, 'BLOCK_N', '-')}, block_k {getattr(d9, 'BLOCK_K', '-')}")
        else:
            self.snippets["sm90_cta"] = self.snippets["sm90_tile"] = "(megamoe.design_sm90 not importable)"
        self.snippets["sm90_plan_source"] = sm90_src
        self.snippets["sm90_plan_table"] = _md_table(
            ["tokens/rank", "expected tokens/expert", "SM100 block_m", "SM100 stages", "SM100 experts/wave",
             "SM90 block_m", "SM90 stages", "SM90 experts/wave"], rows)
        # Does the simulator run the SM90 design yet?
        try:
            sc9 = Scenario(**{**SMALL, "hardware": "h200", "design": "megamoe-sm90"})
            sc9.plan(132, P.SM100_SMEM_CAPACITY)
            r9 = self.small(hardware="h200", design="megamoe-sm90")
            self.snippets["sm90_sim_status"] = (
                f"The simulator runs the SM90 design: V4-Flash EP8, 512 tokens/rank on the H200 model with "
                f"`--design megamoe-sm90` predicts **{r9.summary['time_us']:.1f} us** "
                f"({r9.summary['tflops']:.0f} TFLOPS per rank).")
        except Exception as exc:
            self.snippets["sm90_sim_status"] = (
                "The simulator does not run the SM90 design yet: at the time this site was built, "
                f"`--design megamoe-sm90` stopped with `{type(exc).__name__}: {str(exc)[:120]}`.")
        # Hardware what-if: the reference design's schedule at B200 vs H200 rates
        b = self.small()
        h = self.small(hardware="h200")
        names = ["B200, deepgemm-sm100 plan", "H200, deepgemm-sm100 plan"]
        vals = [b.summary["time_us"], h.summary["time_us"]]
        if "predicts" in self.snippets["sm90_sim_status"]:
            names.append("H200, megamoe-sm90 design")
            vals.append(self.small(hardware="h200", design="megamoe-sm90").summary["time_us"])
        fig, ax = plt.subplots(figsize=(7, 1.0 + 0.6 * len(vals)))
        ax.barh(names, vals, color=["#4e79a7", "#76b7b2", "#f28e2b"][:len(vals)])
        ax.invert_yaxis()
        for i, v in enumerate(vals):
            ax.text(v, i, f" {v:.0f} us", va="center", fontsize=8)
        ax.set_xlabel("predicted time (us)")
        ax.set_xlim(0, max(vals) * 1.2)
        ax.set_title("Predicted time, V4-Flash EP8, 512 tokens/rank", fontsize=9)
        self.fig("hw_b200_h200", fig)

    # -- what-if tutorials -----------------------------------------------------------------
    def whatif(self) -> None:
        base = self.small()
        rp = base.plan.ranks[0]
        # 1. experts per wave
        epws = [1, 2, 4, 8, 16, 32]
        res = [self.small(experts_per_wave=e) for e in epws]
        t = [r.summary["time_us"] for r in res]
        fig, ax = plt.subplots(figsize=(7, 3))
        ax.plot(epws, t, "o-", color="#4e79a7")
        ax.axvline(rp.experts_per_wave, color="#e15759", ls="--", label=f"heuristic: {rp.experts_per_wave}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("experts per wave (--experts-per-wave)")
        ax.set_ylabel("predicted time (us)")
        ax.legend(fontsize=8)
        ax.set_title("V4-Flash EP8, 512 tokens/rank, B200", fontsize=9)
        self.fig("whatif_epw", fig)
        self.snippets["whatif_epw"] = _md_table(
            ["experts/wave", "waves", "time (us)", "TFLOPS", "overlap efficiency"],
            [[e, r.plan.ranks[0].num_waves, f"{r.summary['time_us']:.1f}", f"{r.summary['tflops']:.0f}",
              f"{r.summary['overlap_efficiency']:.2f}"] for e, r in zip(epws, res)])
        # 2. routing skew
        routings = ["uniform", "zipf:0.5", "zipf:1.0", "hot:0.3:4"]
        rr = [self.small(routing=r) for r in routings]
        rows = []
        for name, r in zip(routings, rr):
            nr = r.plan.num_recv_tokens()
            rows.append([f"`{name}`", f"{nr.min()}-{nr.max()}", f"{r.summary['time_us']:.1f}",
                         f"{r.summary['tflops']:.0f}", f"{r.summary['speedup_vs_legacy']:.2f}x"])
        self.snippets["whatif_routing"] = _md_table(
            ["routing", "items received per rank (min-max)", "time (us)", "TFLOPS", "speedup vs legacy"], rows)
        # 3. L2 wait granularity
        rows, diffs = [], []
        for T in (512, 2048):
            kb, pb = self.small(tokens_per_rank=T), self.small(tokens_per_rank=T, l2_wait="pool_block")
            d = pb.summary["time_us"] / kb.summary["time_us"] - 1
            diffs.append((T, d))
            rows.append([T, f"{kb.summary['time_us']:.1f}", f"{pb.summary['time_us']:.1f}", f"{100 * d:+.1f}%"])
        self.snippets["whatif_l2wait"] = _md_table(
            ["tokens/rank", "`k_block` time (us)", "`pool_block` time (us)", "pool_block vs k_block"], rows)
        if all(abs(d) < 0.005 for _, d in diffs):
            self.snippets["whatif_l2wait_verdict"] = (
                f"At {' and '.join(str(T) for T, _ in diffs)} tokens per rank the simulator predicts the same time "
                "for both waits (within 0.5%).")
        else:
            self.snippets["whatif_l2wait_verdict"] = " ".join(
                f"At {T} tokens per rank waiting for the whole pool block changes the time by {100 * d:+.1f}%."
                for T, d in diffs)
        # 4. tokens sweep
        toks = [64, 256, 512, 2048]
        tr = [self.small(tokens_per_rank=T) for T in toks]
        fig, ax = plt.subplots(figsize=(7, 3))
        ax.plot(toks, [r.summary["tflops"] for r in tr], "o-", color="#59a14f", label="TFLOPS per rank")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tokens per rank")
        ax.set_ylabel("TFLOPS")
        ax2 = ax.twinx()
        ax2.plot(toks, [r.summary["time_us"] for r in tr], "s--", color="#e15759", label="time (us)")
        ax2.set_ylabel("time (us)")
        for T, r in zip(toks, tr):
            ax.annotate(f"bm={r.plan.ranks[0].config.block_m}", (T, r.summary["tflops"]), fontsize=7,
                        textcoords="offset points", xytext=(4, -10))
        h1, l1 = ax.get_legend_handles_labels()
        h2, l2 = ax2.get_legend_handles_labels()
        ax.legend(h1 + h2, l1 + l2, fontsize=8, loc="upper left")
        ax.set_title("Token sweep, V4-Flash EP8 on B200 (bm = block_m chosen by the plan)", fontsize=9)
        self.fig("whatif_tokens", fig)
        # 5. reserved SMs
        rs = [0, 16, 32]
        rr = [self.small(reserved_sms=r) for r in rs]
        self.snippets["whatif_reserved"] = _md_table(
            ["--reserved-sms", "SMs used", "time (us)", "TFLOPS"],
            [[r, x.plan.num_sms, f"{x.summary['time_us']:.1f}", f"{x.summary['tflops']:.0f}"] for r, x in zip(rs, rr)])
        # 8. split-K on the SM90 design (H200, EP1)
        rows, worse = [], []
        for T in (1, 2, 4, 16):
            kw = {"shape": "deepseek-v4-flash", "num_ranks": 1, "tokens_per_rank": T, "max_tokens_per_rank": 8192,
                  "hardware": "h200", "design": "megamoe-sm90"}
            one, two = self.sim(**kw), self.sim(**kw, k_split=2)
            d = two.summary["time_us"] / one.summary["time_us"] - 1
            worse.append(d > 0)
            rows.append([T, len(one.plan.ranks[0].blocks()), f"{one.summary['time_us']:.1f}",
                         len(two.plan.ranks[0].blocks()), f"{two.summary['time_us']:.1f}", f"{100 * d:+.1f}%"])
        self.snippets["whatif_ksplit"] = _md_table(
            ["tokens", "blocks", "time (us)", "blocks, `--k-split 2`", "time (us), `--k-split 2`", "split vs not"], rows)
        self.snippets["whatif_ksplit_verdict"] = (
            "The model predicts split-K slower at every one of these sizes." if all(worse) else
            "The model predicts split-K faster at " + ", ".join(
                f"{r[0]} token{'s' * (r[0] != 1)}" for r, w in zip(rows, worse) if not w) + ".")
        # 10. WGMMA N at a block's valid rows (SM90, H200, EP1)
        rows = []
        for T in (1, 64, 256, 2731, 4096, 8192):
            kw = {"shape": "deepseek-v4-flash", "num_ranks": 1, "tokens_per_rank": T, "max_tokens_per_rank": 8192,
                  "hardware": "h200", "design": "megamoe-sm90"}
            whole = self.sim(**kw, wgmma_n_step=128)  # whole blocks (kernel v9.11; v9.12 steps by 32 at 128)
            rp = whole.plan.ranks[0]
            bm = rp.config.block_m
            fill = float(rp.tokens_per_expert.sum()) / (int(rp.pool_block_offset[-1]) * bm)  # valid rows / rows
            cells = [T, bm, f"{fill:.2f}", f"{whole.summary['time_us']:.1f}"]
            for step in (32, 8):
                if step < bm:
                    r = self.sim(**kw, wgmma_n_step=step)
                    d = r.summary["time_us"] / whole.summary["time_us"] - 1
                    cells.append(f"{r.summary['time_us']:.1f} ({100 * d:+.1f}%)")
                else:
                    cells.append("whole blocks")
            rows.append(cells)
        self.snippets["whatif_wgmma_n"] = _md_table(
            ["tokens", "block_m", "rows filled", "time (us), whole blocks", "`--wgmma-n-step 32`", "`--wgmma-n-step 8`"], rows)
        # 9. how far an answer moves with the seed's block jitter alone (the routing held: seed 0's)
        import dataclasses

        from sim.engine import simulate
        from sim.hardware import load_hardware

        hw = load_hardware("h200")
        rows = []
        for T in (6, 12, 64, 4096):
            base = Scenario(shape="deepseek-v4-flash", num_ranks=1, tokens_per_rank=T, max_tokens_per_rank=8192,
                            hardware="h200", design="megamoe-sm90")
            held = dataclasses.replace(base, topk_idx=base.routing_ids())
            times = [simulate(dataclasses.replace(held, seed=s), hw).summary["time_us"] for s in range(6)]
            still = simulate(held, dataclasses.replace(hw, block_jitter=0.0)).summary["time_us"]
            rows.append([T, held.plan(hw.num_sms, hw.smem_per_block_bytes).ranks[0].ctas_per_sm,
                         f"{min(times):.1f} - {max(times):.1f}", f"{100 * (max(times) / min(times) - 1):.2f}%",
                         f"{still:.1f}"])
        self.snippets["whatif_jitter"] = _md_table(
            ["tokens", "CTAs per SM", "time (us), seeds 0-5", "spread", "time (us), `block_jitter` 0"], rows)

    def policies_whatif(self) -> None:
        """Plug-in scheduler policies (``megamoe.policies``) against the reference choices."""
        import dataclasses

        if "policies" not in {f.name for f in dataclasses.fields(Scenario)}:
            msg = "*(This version of `Scenario` has no `policies` field: nothing generated.)*"
            self.snippets["whatif_policies"] = self.snippets["pull_policy_sim"] = msg
            self.snippets["pull_policy_verdict"] = self.snippets["pull_policy_verdict_zh"] = ""
            return
        base = self.small()
        rows = []
        for pol in ("adaptive-waves", "interleaved", "fixed-waves:4", "rank-by-rank"):
            r = self.small(policies=(pol,))
            rows.append([f"`{pol}`", f"{r.summary['time_us']:.1f}",
                         f"{100 * (r.summary['time_us'] / base.summary['time_us'] - 1):+.1f}%",
                         f"{r.summary['overlap_efficiency']:.2f}"])
        self.snippets["whatif_policies"] = _md_table(
            ["--policy", "time (us)", "vs reference", "overlap efficiency"],
            [["(reference)", f"{base.summary['time_us']:.1f}", "", f"{base.summary['overlap_efficiency']:.2f}"]] + rows)
        rows, diffs = [], []
        for T in (512, 2048, 8192):
            a, b = self.small(tokens_per_rank=T), self.small(tokens_per_rank=T, policies=("rank-by-rank",))
            diffs.append(abs(b.summary["time_us"] / a.summary["time_us"] - 1))
            rows.append([T, f"{a.summary['time_us']:.1f}", f"{b.summary['time_us']:.1f}",
                         f"{100 * (b.summary['time_us'] / a.summary['time_us'] - 1):+.1f}%"])
        small = max(diffs) < 0.01
        self.snippets["pull_policy_verdict"] = (
            f"The simulator sees almost no difference (at most {100 * max(diffs):.1f}%)." if small else
            f"The simulator predicts up to {100 * max(diffs):.1f}% from the order.")
        self.snippets["pull_policy_verdict_zh"] = (
            f"模拟器几乎看不出差别（最多 {100 * max(diffs):.1f}%）。" if small else
            f"模拟器预测顺序带来的差别最多为 {100 * max(diffs):.1f}%。")
        self.snippets["pull_policy_sim"] = _md_table(
            ["tokens/rank", "round-robin min-remaining (us)", "`rank-by-rank` (us)", "difference"], rows)

    def studies(self) -> None:
        """The three studies of ``sim.studies`` (experts per wave, reserved SMs, pull order)."""
        from sim.studies import plot_study, study_experts_per_wave, study_pull_order, study_reserved_sms

        data = {"experts_per_wave": study_experts_per_wave(tokens=(32,), waves=(1, 2, 4, 8, 16, 48)),
                "reserved_sms": study_reserved_sms(tokens=(128, 4096), reserved=(0, 16, 32, 64)),
                "pull_order": study_pull_order(fractions=(0.0, 0.6, 0.9))}
        for name, rows in data.items():
            path = Path(tempfile.mkdtemp()) / f"{name}.png"
            plot_study(name, rows, str(path))
            self.files[f"generated/study_{name}.png"] = path.read_bytes()
        e = data["experts_per_wave"]
        self.snippets["study_epw"] = _md_table(
            ["experts per wave", "time (us)"],
            [[r["experts_per_wave"], f"{r['time_us']:.1f}"] for r in e]
            + [[f"reference heuristic ({e[0]['reference_experts_per_wave']})", f"{e[0]['reference_time_us']:.1f}"]])
        self.snippets["study_reserved"] = _md_table(
            ["tokens/rank", "reserved SMs", "SMs used", "time (us)"],
            [[r["tokens"], r["reserved_sms"], r["sms"], f"{r['time_us']:.1f}"] for r in data["reserved_sms"]])
        self.snippets["study_pull"] = _md_table(
            ["fabric", "hot share", "pull order", "pull phase (us)", "whole call (us)"],
            [[r["fabric"], r["hot_fraction"], f"`{r['pull_order']}`", f"{r['pull_us']:.1f}", f"{r['time_us']:.1f}"]
             for r in data["pull_order"]])

    def h200_compare(self) -> None:
        """The simulator against this project's committed H200 kernel traces (issue 7)."""
        from sim.compare import compare_file, plot_overlay

        root = Path(__file__).resolve().parents[2]
        rows, overlay = [], None
        paths = sorted((root / "benchmarks" / "traces").glob("kernel_flash_ep*_t*.npz"),
                       key=lambda q: (q.name.split("_t")[0], int(q.stem.split("_t")[-1])))
        for path in paths:
            r, measured, res = compare_file(str(path))
            T = int(path.stem.split("_t")[-1])
            kinds = ", ".join(f"{k} {100 * v['median']:.0f}%" for k, v in r["kind_errors"].items())
            skew = max(r["launch_skew_us"])
            ctas = (measured.meta.get("plan") or {}).get("ctas_per_sm", 1)  # SM90 kernel v9.2: 2 at block_m 16
            rows.append([r["scenario"]["num_ranks"], T, ctas, f"{r['makespan_measured_us']:.1f}",
                         f"{r['makespan_simulated_us']:.1f}", f"{100 * r['makespan_error']:+.1f}%",
                         f"{skew:.0f} us, {100 * r['makespan_error_no_skew']:+.1f}%" if skew else "-",
                         f"{100 * r['median_kind_error']:.1f}%", f"{100 * r['median_kind_quantile_error']:.1f}%",
                         kinds])
            if T == 512 and r["scenario"]["num_ranks"] == 1 and "one_cta" not in path.name:
                p = Path(tempfile.mkdtemp()) / "overlay.png"
                plot_overlay(measured, res.trace, str(p), sms=6)
                overlay = p.read_bytes()
        if overlay is not None:
            self.files["generated/h200_overlay_t512.png"] = overlay
        self.snippets["h200_compare_table"] = _md_table(
            ["EP", "tokens per rank", "CTAs per SM", "measured us", "simulated us", "makespan error",
             "launch skew read off the trace, error without it", "median per-kind error (block by block)",
             "median per-kind error (distributions)", "median error per kind"], rows) if rows else "*(no committed kernel traces)*"
        choices = root / "benchmarks" / "results" / "compare_h200.json"
        if choices.exists():
            pairs = json.loads(choices.read_text())["plan_choices"]
            self.snippets["h200_plan_choices"] = _md_table(
                ["tokens", "choice A", "choice B", "kernel us (A / B)", "simulated us (A / B)", "same order"],
                [[p["tokens"], f"`{json.dumps(p['a'])}`", f"`{json.dumps(p['b'])}`",
                  f"{p['kernel_us'][0]:.0f} / {p['kernel_us'][1]:.0f}",
                  f"{p['simulated_us'][0]:.0f} / {p['simulated_us'][1]:.0f}",
                  ("yes" if p["same_order"] else "**no**") + ("" if p["must_agree"] else " (kernel within 5%)")]
                 for p in pairs])
        else:
            self.snippets["h200_plan_choices"] = ""

    def validation(self) -> None:
        from sim.validate import verdict

        rows = self._validation_rows.result() if hasattr(self, "_validation_rows") else _validation_rows()
        v = verdict(rows)
        tab = []
        for r in rows:
            tab.append([r["tokens_per_rank"], f"{r['time_us_pred']:.1f}", f"{r['time_us_pub']:.1f}",
                        f"{100 * r['time_us_err']:+.1f}%", f"{r['tflops_pred']:.0f}", f"{r['tflops_pub']:.0f}",
                        f"{r['hbm_gbs_pred']:.0f}", f"{r['hbm_gbs_pub']:.0f}", f"{r['nvlink_gbs_pred']:.0f}",
                        f"{r['nvlink_gbs_pub']:.0f}", f"{r['speedup_vs_legacy_pred']:.2f}",
                        f"{r['speedup_vs_legacy_pub']:.2f}"])
        self.snippets["validation_table"] = _md_table(
            ["tokens/rank", "time pred (us)", "time pub (us)", "time err", "TFLOPS pred", "TFLOPS pub",
             "HBM GB/s pred", "HBM GB/s pub", "NVLink GB/s pred", "NVLink GB/s pub", "speedup pred",
             "speedup pub"], tab)
        self.snippets["validation_short"] = (
            f"on time within {100 * v['max_abs_time_error']:.1f}% (median {100 * v['median_abs_time_error']:.1f}%) "
            f"over its {len(rows)} rows")
        self.snippets["validation_short_zh"] = (
            f"在全部 {len(rows)} 行上耗时误差不超过 {100 * v['max_abs_time_error']:.1f}%"
            f"（中位数 {100 * v['median_abs_time_error']:.1f}%）")
        self.snippets["validation_verdict"] = (
            f"Time error: max **{100 * v['max_abs_time_error']:.1f}%**, median "
            f"**{100 * v['median_abs_time_error']:.1f}%** (targets 15% / 8%): "
            f"**{'PASS' if v['pass'] else 'FAIL'}**.")
        fig, ax = plt.subplots(figsize=(8, 3.2))
        x = np.arange(len(rows))
        ax.bar(x - 0.2, [r["time_us_pub"] for r in rows], 0.4, label="published (PR #316)", color="#bbbbbb")
        ax.bar(x + 0.2, [r["time_us_pred"] for r in rows], 0.4, label="simulated", color="#4e79a7")
        ax.set_xticks(x)
        ax.set_xticklabels([str(r["tokens_per_rank"]) for r in rows])
        ax.set_yscale("log")
        ax.set_xlabel("tokens per rank")
        ax.set_ylabel("time (us)")
        ax.legend(fontsize=8)
        ax.set_title("V4-Flash, 8 x B200, EP8: simulator vs DeepGEMM PR #316", fontsize=9)
        self.fig("validation", fig)

    def cli_help(self) -> None:
        from megamoe.cli import build_parser

        p = build_parser()
        sub = next(a for a in p._actions if a.__class__.__name__ == "_SubParsersAction")
        for name, sp in sub.choices.items():
            sp.formatter_class = lambda prog: __import__("argparse").HelpFormatter(prog, width=100)
            self.snippets[f"cli_help_{name}"] = "```text\n$ megamoe " + name + " --help\n" + sp.format_help() + "```\n"
        self.snippets["cli_commands"] = ", ".join(f"`megamoe {n}`" for n in sub.choices)
        helps = {a.dest: a.help for a in sub._choices_actions}
        others = [n for n in sub.choices if n not in ("simulate", "validate")]
        self.snippets["cli_help_others"] = "\n".join(
            f"## `megamoe {n}`\n\n{(helps.get(n) or '').capitalize()}.\n\n{self.snippets[f'cli_help_{n}']}"
            for n in others) if others else ""

    def kernel_status(self) -> None:
        """What of the kernel is committed, and which committed results hold kernel measurements."""
        import subprocess

        try:
            tracked = subprocess.run(["git", "ls-files", "csrc", "megamoe/kernel", "benchmarks", "tests"],
                                     cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
            where = "committed (`git ls-files`)"
        except Exception:
            tracked = [str(p.relative_to(ROOT)) for d in ("csrc", "megamoe/kernel", "benchmarks", "tests")
                       for p in (ROOT / d).rglob("*") if p.is_file()]
            where = "present in the checkout (git unavailable)"
        src = [f for f in tracked if f.startswith("csrc/")]
        py = [f for f in tracked if f.startswith("megamoe/kernel/")]
        tests = [f for f in tracked if f.startswith("tests/test_kernel")]
        results = [f for f in tracked if f.startswith("benchmarks/results/") and f.endswith(".json")]
        kernel_results = []
        for f in results:
            try:
                d = json.loads((ROOT / f).read_text())
            except Exception:
                continue
            text = json.dumps(d)[:20000].lower()
            if "kernel" in Path(f).name.lower() or ("gpu" in text and "sim_speed" not in f):
                kernel_results.append(f)

        def lst(xs):
            return ", ".join(f"`{x}`" for x in xs) if xs else "none"

        self.snippets["kernel_status"] = "\n".join([
            *self._kernel_targets(),
            f"Files {where} when this site was built:", "",
            f"* CUDA sources: {lst(src)}",
            f"* Python side (`megamoe.kernel`): {lst(py)}",
            f"* kernel tests: {lst(tests)}",
            f"* committed result files under `benchmarks/results/`: {lst(results)}",
            f"* of those, files with kernel (GPU) measurements: {lst(kernel_results)}", ""])
        self.snippets["kernel_has_results"] = "yes" if kernel_results else "no"
        self._kernel_results(results)

    def _kernel_targets(self) -> list[str]:
        """Issue 5's performance targets against the committed EP1 benchmark
        (``kernel_h200_ep1_wgmma.json``, back to back) and the interleaved FlagGems run
        (``kernel_peer_ab_h200.json``): >= 800 TFLOP/s at 8192 tokens, >= 70% of the measured
        copy bandwidth on weight streaming at <= 64 tokens, faster than every peer at every
        token count."""
        bench = ROOT / "benchmarks/results/kernel_h200_ep1_wgmma.json"
        if not bench.exists():
            return []
        d = json.loads(bench.read_text())
        by = {}
        for r in d["rows"]:
            by.setdefault(r["impl"], {})[int(r["tokens"])] = r
        ours = by.get("megamoe_sm90", {})
        if 8192 not in ours or not d.get("copy_gbs_steady"):
            return []
        copy = d["copy_gbs_steady"]
        stream = {t: ours[t]["hbm_gbs_steady"] / copy for t in ours if t <= 64}

        def not_slower(key):  # "impl at T" for every peer row whose time `key` is at most ours
            return [f"{impl} at {t}" for impl, rows in by.items() if impl != "megamoe_sm90"
                    for t, r in rows.items() if t in ours and key in r and key in ours[t] and r[key] <= ours[t][key]]

        slower, slower_g = not_slower("us_steady"), not_slower("us_graph")
        graphs = any("us_graph" in r for r in ours.values())
        uncapturable = sorted({impl for impl, rows in by.items() if any("graph_error" in r for r in rows.values())})
        lines = [("Issue 5's targets against the committed runs (one H200, V4-Flash shape, EP1, "
                  f"{d.get('date', '')}, back to back; `benchmarks/results/kernel_h200_ep1_wgmma.json`):"), "",
                 (f"* at least 800 TFLOP/s at 8192 tokens: {ours[8192]['tflops_steady']:.1f} "
                  f"({'met' if ours[8192]['tflops_steady'] >= 800 else 'missed'})."),
                 (f"* weight streaming at 70% or more of the measured copy bandwidth ({copy:.0f} GB/s) at up to 64 tokens: "
                  + ", ".join(f"{100 * v:.1f}% at {t}" for t, v in sorted(stream.items()))
                  + f" ({'met' if min(stream.values()) >= 0.70 else 'missed'})."),
                 ("* faster than every peer that runs here at every token count, back to back: "
                  + ("yes" if not slower else "no (" + ", ".join(slower) + ")") + ".")]
        if graphs:
            gstream = {t: ours[t]["hbm_gbs_graph"] / copy for t in ours if t <= 64 and "hbm_gbs_graph" in ours[t]}
            lines += [("* the same with every call replayed as a CUDA graph (no host time per call, as serving "
                       "loops run small batches): weight streaming "
                       + ", ".join(f"{100 * v:.1f}% at {t}" for t, v in sorted(gstream.items()))
                       + f" ({'met' if gstream and min(gstream.values()) >= 0.70 else 'missed'}); faster than every "
                       "peer: " + ("yes" if not slower_g else "no (" + ", ".join(slower_g) + ")")
                       + (f" ({', '.join(uncapturable)}: not capturable, so not compared)" if uncapturable else "")
                       + ".")]
        lines += self._streaming_bound_lines()
        ab = ROOT / "benchmarks/results/kernel_peer_ab_h200.json"
        if ab.exists():
            a = json.loads(ab.read_text())
            worst = max(v["ratio_median"] for pr in a["processes"] for v in pr["tokens"].values())
            other = (f", build `{a['build'][:8]}`, not the benchmark's build: not re-measured on it"
                     if a.get("build") and a.get("build") != d.get("build") else "")
            lines.append(f"* the same when the two alternate with FlagGems (`kernel_peer_ab_h200.json`, "
                         f"{len(a['processes'])} processes{other}): our time over FlagGems' at most {worst:.3f} "
                         f"({'faster everywhere' if worst < 1 else 'not faster everywhere'}).")
        abg = ROOT / "benchmarks/results/kernel_peer_ab_graph_h200.json"
        if abg.exists():
            g = json.loads(abg.read_text())
            ratios = sorted(((int(t), v["ratio_median"]) for t, v in g["tokens"].items()))
            not_faster = [t for t, v in ratios if v >= 1]
            lines.append(f"* both as CUDA graphs, alternating (`kernel_peer_ab_graph_h200.json`, {g['rounds']} ABBA "
                         "rounds): our time over FlagGems' " + ", ".join(f"{v:.3f} at {t}" for t, v in ratios)
                         + (" (faster everywhere)." if not not_faster else
                            f" (not faster at {', '.join(map(str, not_faster))} token{'s' if len(not_faster) > 1 else ''})."))
        return lines + [""]

    def _streaming_bound_lines(self) -> list[str]:
        """Issue 5's streaming target against what a perfect schedule of the traced work could
        reach (``benchmarks/streaming_bound.py``'s ``streaming_bound_h200.json``): per token count,
        the consumers' work spread evenly over the CTAs, with and without the traced start and
        tail, against the time 70% of the copy allows."""
        f = ROOT / "benchmarks/results/streaming_bound_h200.json"
        if not f.exists():
            return []
        rows = json.loads(f.read_text())["rows"]

        def cells(pred):
            return ", ".join(f"{r['tokens']} token{'s' if r['tokens'] > 1 else ''} (work {r['work_us']:.1f} us, with start and tail "
                             f"{r['balanced_us']:.1f}, t70 {r['t70_us']:.1f})" for r in rows if pred(r))

        alone = cells(lambda r: r["work_us"] > r["t70_us"])
        fixed = cells(lambda r: r["work_us"] <= r["t70_us"] < r["balanced_us"])
        sched = [str(r["tokens"]) for r in rows if r["balanced_us"] <= r["t70_us"] < r["traced_makespan_us"]]
        text = ("* what a perfect schedule of the same work could reach (`benchmarks/streaming_bound.py`, from the "
                "committed traces: the consumers' traced start, their K loops and epilogues spread evenly over the "
                "CTAs, and the traced tail, against the time 70% of the copy allows, t70)")
        parts = []
        if alone:
            parts.append(f"the consumers' work alone exceeds t70 at {alone}")
        if fixed:
            parts.append(f"with the start and tail it exceeds t70 at {fixed}")
        if sched:
            parts.append(f"a better schedule could meet it at {', '.join(sched)} tokens")
        return [text + (": " + "; ".join(parts) if parts else "") + "."]

    def _kernel_results(self, results: list[str]) -> None:
        """Tables and figures from committed kernel measurements (``benchmarks/results``)."""
        from sim.plots import COLORS

        bench, traces = [], []
        for f in results:
            try:
                d = json.loads((ROOT / f).read_text())
            except Exception:
                continue
            if isinstance(d, dict) and isinstance(d.get("rows"), list) and any("impl" in r for r in d["rows"]):
                bench.append((f, d))
            elif isinstance(d, dict) and "traceEvents" in d:
                traces.append((f, d))
        out = []
        for f, d in bench:
            sh = d.get("shape", {})
            by = {}
            for r in d["rows"]:  # EP benchmarks say tokens_per_rank
                by.setdefault(int(r.get("tokens", r.get("tokens_per_rank", -1))), {})[r["impl"]] = r
            impls = sorted({r["impl"] for r in d["rows"]})
            ours = min((i for i in impls if "megamoe" in i), key=len, default=impls[0])
            variants = [i for i in impls if i != ours and i.startswith(ours)]  # e.g. the CUDA-graph replay
            base = [i for i in impls if i != ours and i not in variants]
            ranks = int(d.get("ranks", 1))
            steady = any("us_steady" in r for r in d["rows"])  # back-to-back times (fifteenth session on)
            graph = any("us_graph" in r for r in d["rows"])  # CUDA-graph replays (twenty-sixth session on)
            sim_ok = True
            # the preset of the GPU the file was measured on (the H100's is the H200's fit with its
            # own HBM, L2 and GEMM figures: sim/hardware/h100.toml)
            hw_name = "h100" if "H100" in str(d.get("device", "")) else "h200"
            rows = []
            for T in sorted(by):
                r = by[T].get(ours, {})
                row = [T, f"{r.get('us', float('nan')):.1f}", f"{r.get('tflops', float('nan')):.1f}"]
                if steady:
                    row += [f"{r['us_steady']:.1f}" if "us_steady" in r else "-",
                            f"{r['us_kernel']:.1f}" if "us_kernel" in r else "-"]
                if graph:
                    row.append(f"{r['us_graph']:.1f}" if "us_graph" in r else "-")
                for v in variants:
                    vu = by[T].get(v, {}).get("us")
                    row.append(f"{vu:.1f}" if vu else "-")
                for b in base:
                    bu = by[T].get(b, {}).get("us")
                    row += [f"{bu:.1f}" if bu else "-", f"{bu / r['us']:.2f}x" if bu and r.get("us") else "-"]
                    if steady:
                        bs = by[T].get(b, {}).get("us_steady")
                        row += [f"{bs:.1f}" if bs else "-",
                                f"{bs / r['us_steady']:.2f}x" if bs and r.get("us_steady") else "-"]
                    if graph:
                        bg = by[T].get(b, {}).get("us_graph")
                        row += [f"{bg:.1f}" if bg else ("not capturable" if "graph_error" in by[T].get(b, {}) else "-"),
                                f"{bg / r['us_graph']:.2f}x" if bg and r.get("us_graph") else "-"]
                chk = r.get("check") or {}
                row.append(f"{chk['rel_l2']:.1e}" if "rel_l2" in chk else "-")
                if sim_ok:
                    try:
                        shape = f"{sh['E']},{sh['K']},{sh['H']},{sh['I']}" if sh else "deepseek-v4-flash"
                        res = self.sim(shape=shape, num_ranks=ranks, tokens_per_rank=T, hardware=hw_name,
                                       design="megamoe-sm90")
                        row.append(f"{res.summary['time_us']:.1f}")
                    except Exception:
                        sim_ok = False
                        row.append("-")
                else:
                    row.append("-")
                rows.append(row)
            head = ["tokens", f"`{ours}` (us)", "TFLOPS"]
            if steady:
                head += ["back to back (us)", "kernel alone (us)"]
            if graph:
                head += ["as a CUDA graph, back to back (us)"]
            head += [f"`{v}` (us)" for v in variants]
            for b in base:
                head += [f"`{b}` (us)", "its time / ours (>1: ours faster)"]
                if steady:
                    head += ["back to back (us)", "its / ours, back to back"]
                if graph:
                    head += ["as a CUDA graph (us)", "its / ours, as graphs"]
            head += ["rel. L2 error vs reference", f"simulator, `megamoe-sm90` on `{hw_name}` (us)"]
            meta = ", ".join(f"{k} {d[k]}" for k in ("device", "torch", "date") if k in d)
            meta += f", kernel build `{d['build']}`" if "build" in d else ", kernel build not recorded in the file"
            extra = []
            if "copy_gbs" in d:
                extra.append(f"measured copy bandwidth {d['copy_gbs']:.0f} GB/s"
                             + (f" ({d['copy_gbs_steady']:.0f} back to back)" if "copy_gbs_steady" in d else ""))
            if "fp8_gemm_tflops" in d:
                extra.append(f"measured FP8 GEMM {d['fp8_gemm_tflops']:.0f} TFLOP/s"
                             + (f" ({d['fp8_gemm_tflops_steady']:.0f} back to back)" if "fp8_gemm_tflops_steady" in d else ""))
            how = (" Times per call: one call from an idle GPU (CUDA events around it, so the host's work before "
                   f"the launch is inside), back to back (one event pair around {d.get('steady_calls', 10)} calls, divided"
                   + (", opened after one untimed lead-in call so that the first call's host work is outside"
                      if d.get("steady_lead_in") else "") + ": the GPU's time "
                   "per call while the host runs ahead) and, for this kernel, its own GPU duration (CUPTI)."
                   if steady else "")
            how += (" As a CUDA graph: the call captured once and replayed back to back in the same way (no host "
                    "work per call); an implementation whose call cannot be captured (it synchronizes the host) "
                    "says so." if graph else "")
            out.append(f"**`{f}`** ({meta}; shape E={sh.get('E')}, k={sh.get('K')}, H={sh.get('H')}, I={sh.get('I')}, "
                       f"EP{ranks}{'; ' + ', '.join(extra) if extra else ''}).{how}\n\n" + _md_table(head, rows))
            # figure: time vs tokens
            fig, ax = plt.subplots(figsize=(7.5, 3.4))
            Ts = sorted(by)
            ax.plot(Ts, [by[T].get(ours, {}).get("us", np.nan) for T in Ts], "o-", label=f"{ours} (measured)",
                    color="#e15759")
            if steady:
                ax.plot(Ts, [by[T].get(ours, {}).get("us_steady", np.nan) for T in Ts], "o:",
                        label=f"{ours} (measured, back to back)", color="#e15759")
            for b, c in zip(base, ("#4e79a7", "#59a14f")):
                ax.plot(Ts, [by[T].get(b, {}).get("us", np.nan) for T in Ts], "s-", label=f"{b} (measured)", color=c)
            if sim_ok:
                ax.plot(Ts, [float(r[-1]) for r in rows], "^--", label=f"simulator, megamoe-sm90 on {hw_name}", color="#999")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("tokens")
            ax.set_ylabel("time per call (us)")
            ax.legend(fontsize=7)
            ax.set_title(f"Committed measurements: {Path(f).name}", fontsize=9)
            name = f"kernel_times_{Path(f).stem}"  # one figure per results file
            self.fig(name, fig)
            out.append(f"![Measured and simulated time per call](generated/{name}.png)\n")
        if traces:
            f, d = traces[0]
            ev = [e for e in d["traceEvents"] if e.get("ph") == "X"]
            names = {(e["pid"], e["tid"]): e["args"]["name"] for e in d["traceEvents"]
                     if e.get("ph") == "M" and e.get("name") == "thread_name"}
            lanes = sorted(set(names.values()), key=lambda n: (int(n.split()[0][2:]) if n.startswith("SM") and
                                                                n.split()[0][2:].isdigit() else 1 << 30, n))
            lane_idx = {n: i for i, n in enumerate(lanes)}
            fig, ax = plt.subplots(figsize=(11, 0.22 * len(lanes) + 1.6))
            kinds = sorted({e["name"] for e in ev})
            for k in kinds:
                bars = {}
                for e in ev:
                    if e["name"] == k and (e["pid"], e["tid"]) in names:
                        bars.setdefault(lane_idx[names[(e["pid"], e["tid"])]], []).append((e["ts"], e["dur"]))
                for y, b in bars.items():
                    ax.broken_barh(b, (y - 0.4, 0.8), facecolors=COLORS.get(k, "#888888"))
            ax.set_yticks(range(len(lanes)))
            ax.set_yticklabels(lanes, fontsize=6)
            ax.invert_yaxis()
            ax.set_xlabel("time (us, from the kernel's %globaltimer)")
            ax.legend(handles=[Patch(color=COLORS.get(k, "#888888"), label=k) for k in kinds], ncol=1, fontsize=7,
                      loc="center left", bbox_to_anchor=(1.01, 0.5))
            ax.set_title(f"Measured in-kernel trace: {Path(f).name}", fontsize=9)
            self.fig("kernel_trace", fig)
            out.append(f"The in-kernel trace committed as `{f}` ({len(ev)} intervals), drawn at build time:\n\n"
                       "![Measured in-kernel trace](generated/kernel_trace.png)\n")
        self.snippets["kernel_results"] = "\n".join(out) if out else (
            "No committed file under `benchmarks/results/` holds kernel measurements yet.")

    def kernel_experiments(self) -> None:
        """The measured kernel experiments (``benchmarks/results/kernel_experiments_*.json``; most
        not kept, their conclusions say which were): per experiment, its time over its baseline's
        (``baseline``, v7.2 unless the file says otherwise) from the interleaved A/B (both builds
        in one process; the median of the per-round ratios), per variant."""
        out = []
        for f in sorted((ROOT / "benchmarks" / "results").glob("kernel_experiments_*.json")):
            d = json.loads(f.read_text())
            tokens = ["64", "1024", "4096", "8192"]
            rows = []
            for name, e in d.get("experiments", {}).items():
                inter = (e.get("interleaved") or {}).get("variants", {})
                cells = []
                for t in tokens:
                    vs = [f"{v[t]['median']:.2f}" for v in inter.values() if t in v]
                    cells.append(" / ".join(vs) + " (interleaved)" if vs else "-")
                title = e.get("title", name)
                if any(inter):  # name the variants (in the order of their ratios)
                    title += f" (ratio{'s' * (len(inter) > 1)}: " + " / ".join(inter) + ")"
                rows.append([name.split("_", 1)[0], title, *cells, e.get("conclusion", "")])
            bases = {e.get("baseline", "v7.2") for e in d.get("experiments", {}).values()}
            base = next(iter(bases)) if len(bases) == 1 else "baseline"  # rows name theirs in their titles
            head = ["#", "experiment", *(f"{t} tokens: time / {base}'s" for t in tokens), "what it showed"]
            aa = (d.get("a_a_check_of_the_interleaved_method") or {}).get("ratio", {})
            aa_txt = (" An interleaved A/A check (v7.2 against a copy of itself) read " +
                      ", ".join(f"{v['median']:.3f} at {t}" for t, v in aa.items()) + " tokens.") if aa else ""
            depth = (d.get("ring_depth_probe") or {}).get("ratio", {})
            depth_txt = ("\n\nRing-depth probe, v7.2 against itself (time at the default stage count over the time "
                         "at fewer stages, median of the per-round ratios): " +
                         ", ".join(f"{v['median']:.3f} at {t} tokens ({v['stages_default']} vs {v['stages_fewer']} "
                                   "stages)" for t, v in depth.items()) + ".") if depth else ""
            probes = []
            fb = d.get("fault_bit_probe") or {}
            if fb.get("ratio"):
                probes.append("Parts switched off by fault bits in one probe build (its time without the part over "
                              "its time with it, median of the per-round ratios):\n\n" + _md_table(
                                  ["part switched off", *(f"{t} tokens" for t in tokens)],
                                  [[name, *(f"{v[t]['median']:.3f}" if t in v else "-" for t in tokens)]
                                   for name, v in fb["ratio"].items()], "l" + "r" * len(tokens))
                              + f"\n\n{fb.get('conclusion', '')}")
            tp = d.get("trace_parts") or {}
            if tp.get("tokens"):
                ts = list(tp["tokens"])
                names = list(next(iter(tp["tokens"].values())))
                probes.append("Trace overhead in kernel time (CUPTI durations) with one role's records switched "
                              "off:\n\n" + _md_table(["records written", *(f"{t} tokens" for t in ts)],
                                                     [[n, *(f"{100 * tp['tokens'][t][n]['overhead']:+.2f}%" for t in ts)]
                                                      for n in names if n != "off"], "l" + "r" * len(ts))
                              + f"\n\n{tp.get('conclusion', '')}")
            probes_txt = "".join(f"\n\n{x}" for x in probes)
            if not rows and not probes and not depth:  # a session file in another layout (checks, runs)
                out.append(f"`{f.relative_to(ROOT)}` ({d.get('device', '')}, {d.get('date', '')}): "
                           f"{d.get('what', 'no experiment table')} (in another layout; benchmarks/NOTES_kernel.md quotes it).")
                continue
            out.append(f"From `{f.relative_to(ROOT)}` ({d.get('device', '')}, {d.get('date', '')}); a ratio "
                       "above 1 is slower, several ratios are several variants; \"-\" where the experiment "
                       f"has no interleaved A/B against {base} at that size (where a row measured something "
                       "else, v7.2's own plan choices or a probe build, its text gives the numbers); "
                       "\"interleaved\": both builds in one process, calls alternating "
                       "(`benchmarks/device/ab_interleaved.py`), the "
                       f"median of the per-round ratios.{aa_txt}\n\n" + _md_table(head, rows, "llrrrrl") + depth_txt
                       + probes_txt)
        self.snippets["kernel_experiments"] = "\n\n".join(out) if out else "No experiment file is committed."

    def wgmma_model(self) -> None:
        """The H200 FP8 WGMMA accumulation model: how well each candidate reproduces the tensor
        core (``benchmarks/results/wgmma_acc_fit_h200.json``, from ``benchmarks/wgmma_acc_fit.py``)
        and the kernel against its two references (``kernel_numerics_h200.json``, from
        ``benchmarks/device/numerics_h200.py``)."""
        res = ROOT / "benchmarks" / "results"
        fit = json.loads((res / "wgmma_acc_fit_h200.json").read_text())
        rows = []
        for name, per_kind in fit["fraction_bitwise_equal"].items():
            worst = min(min(v.values()) for v in per_kind.values())
            cells = [f"{100 * min(per_kind[k][v] for k in per_kind):.2f}%" for v in fit["variants"]]
            rows.append([name, *cells, f"{100 * worst:.2f}%"])
        n = fit["results_per_variant"]
        fit_md = (f"Results reproduced bit for bit, of {n:,} per variant ({fit['tiles']} tiles of 64 x 16, "
                  f"{len(fit['kinds'])} operand kinds: {', '.join(fit['kinds'])}; the worst kind per column; "
                  f"{fit['note']}):\n\n" + _md_table(["model of one k32 step", *fit["variants"], "worst"], rows,
                                                     "l" + "r" * (len(fit["variants"]) + 1)))
        num = json.loads((res / "kernel_numerics_h200.json").read_text())
        krows = []
        for r in num["rows"]:
            e, h = r["exact"], r["h200_wgmma"]
            krows.append([r["case"], r["tokens"], f"{e['rel_l2']:.1e}", f"{100 * e['frac_off_1pct']:.1f}%",
                          f"{100 * e['l2_pool']['bytes_equal']:.2f}%", f"{h['rel_l2']:.1e}",
                          f"{100 * h['frac_off_1pct']:.1f}%", f"{100 * h['bitwise_equal']:.2f}%",
                          f"{100 * h['l2_pool']['bytes_equal']:.2f}%", f"{r['kernel_vs_exact_math']['rel_l2']:.2e}"])
        kern_md = (f"The kernel (build `{num.get('build', '?')[:8]}`, {num['device']}, torch {num['torch']}) against "
                   "`reference_sm90` with exact partial sums and with the model:\n\n" + _md_table(
                       ["case", "tokens", "exact: rel L2", "off > 1%", "L2-pool bytes equal", "model: rel L2",
                        "off > 1%", "outputs bitwise equal", "L2-pool bytes equal", "kernel vs exact math"],
                       krows, "lrrrrrrrrr"))
        self.snippets["wgmma_model"] = fit_md + "\n\n" + kern_md

    def tma_probe(self) -> None:
        """The copy-engine probe on the H200 (``benchmarks/results/tma_probe_h200.json``, from
        ``benchmarks/device/tma_probe.py``): copy latency and streaming rates."""
        d = json.loads((ROOT / "benchmarks" / "results" / "tma_probe_h200.json").read_text())
        lat = {(r["bytes"], r["source"], r["ctas"]): r for r in d["latency"]}
        sizes = sorted({r["bytes"] for r in d["latency"]})
        cols = [("hbm", 1), ("l2", 1), ("hbm", d["sms"]), ("l2", d["sms"])]
        head = ["bytes per copy"] + [f"{'HBM' if s == 'hbm' else 'L2'}, {c} CTA{'s' if c > 1 else ''}" for s, c in cols]
        rows = [[f"{b:,}"] + [f"{lat[b, s, c]['ns_p50']:.0f} ({lat[b, s, c]['ns_p10']:.0f}-{lat[b, s, c]['ns_p90']:.0f})"
                              for s, c in cols] for b in sizes]
        srows = [[r["ctas"], r["warps"], r["stages_per_warp"], f"{r['bytes']:,}", "HBM" if r["source"] == "hbm" else "L2",
                  f"{r['gbs_p50']:,.1f}"] for r in d["stream"]]
        self.snippets["tma_probe"] = (
            f"{d['device']}, {d['date']} (`{d['source']}`): one copy's latency, issue to completion, ns, median "
            f"(p10-p90) of {d['copies_per_sample']} copies per CTA:\n\n" + _md_table(head, rows, "lrrrr")
            + "\n\nStreaming: each issuing warp keeps its copies in flight, GB/s, median of five runs:\n\n"
            + _md_table(["CTAs", "issuing warps", "copies in flight per warp", "bytes per copy", "from", "GB/s"],
                        srows, "rrrrlr"))

    def hardware_table(self) -> None:
        import tomllib

        hw = {}
        for p in sorted((ROOT / "sim" / "hardware").glob("*.toml")):
            with open(p, "rb") as f:
                hw[p.stem] = tomllib.load(f)
        keys = ["num_sms", "fp8_dense_tflops", "mma_efficiency", "hbm_gbs", "nvlink_gbs_per_direction",
                "smem_per_block_bytes", "nvl_barrier_ns", "grid_sync_ns"]
        names = list(hw)
        self.snippets["hardware_table"] = _md_table(
            ["figure"] + [f"`{n}` ({hw[n].get('name', n)})" for n in names],
            [[f"`{k}`"] + [f"{hw[n]['figures'].get(k, '-')}" for n in names] for k in keys])
        fields = list(hw[names[0]]["figures"]) if names else []
        fitted = [k for k, v in hw.get("b200", {}).get("sources", {}).items() if str(v).startswith("fitted")]
        self.snippets["b200_fitted"] = (f"{len(fitted)} figures of `b200.toml` are marked \"fitted\" in its "
                                        f"`[sources]` table ({', '.join(f'`{k}`' for k in fitted)})")
        self.snippets["hardware_fields"] = ", ".join(f"`{k}`" for k in fields)
        self.snippets["h200_fitted_figures"] = _fitted_figures_table(hw["h200"])
        compared = [t["trace"] for t in json.loads((ROOT / "benchmarks" / "results" / "compare_h200.json").read_text())["traces"]]
        fitted = _traces_named(hw["h200"])
        free = [t.removeprefix("kernel_flash_").removesuffix(".npz") for t in compared if t not in fitted]
        self.snippets["h200_out_of_sample"] = (", ".join(f"`{t}`" for t in free) if free else "none") + (
            f" ({len(free)} of the {len(compared)} compared traces; the others each fit a few figures, named in the "
            "table above)")

    def run_all(self) -> None:
        import tempfile

        import concurrent.futures as cf
        import multiprocessing as mp

        pool = None
        try:  # the validation (the slowest part) runs in a second process meanwhile
            pool = cf.ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("fork"))
            self._validation_rows = pool.submit(_validation_rows)
            self._worker_figs = pool.submit(_worker_figures)
        except Exception:  # no fork on this platform: run it inline later
            pool = None
        try:
            self._run_all()
        finally:
            if pool is not None:
                pool.shutdown(wait=True)

    def _run_all(self) -> None:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            self._tmp = tmp
            for name in ("timeline", "stage_gantt", "barrier_fig", "plotly_timeline", "utilization_regions", "wave_map",
                         "pull_order_fig", "moe_align", "buffer_layout", "warp_roles", "numerics_fig",
                         "weight_layout_fig", "sm100_vs_sm90", "whatif", "policies_whatif", "studies", "h200_compare", "validation", "tma_probe", "hardware_table", "cli_help", "kernel_status",
                         "kernel_experiments", "wgmma_model"):
                if name in WORKER_FIGURES and hasattr(self, "_worker_figs"):
                    continue  # made by the worker process, collected below
                t0 = time.time()
                getattr(self, name)()
                self.timings[name] = time.time() - t0
            if hasattr(self, "_worker_figs"):
                t0 = time.time()
                files, snippets = self._worker_figs.result()
                self.files.update(files)
                self.snippets.update(snippets)
                self.timings["worker figures (wait)"] = time.time() - t0


# Made in the second process after the validation (they import torch or run many simulations),
# so the two processes finish at about the same time on a 2-core machine.
WORKER_FIGURES = ("numerics_fig", "weight_layout_fig", "policies_whatif", "studies", "h200_compare")


def _worker_figures() -> tuple[dict, dict]:
    g = Gen()
    for name in WORKER_FIGURES:
        getattr(g, name)()
    return g.files, g.snippets


def _validation_rows() -> list[dict]:
    from sim.validate import validate

    return validate("b200")


def generate(log=print) -> tuple[dict[str, bytes], dict[str, str], dict[str, float]]:
    """Run every generator; returns ``(files, snippets, timings)``."""
    g = Gen(log)
    g.run_all()
    return g.files, g.snippets, g.timings


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "out/docs-gen")
    t0 = time.time()
    files, snippets, timings = generate()
    for k, v in files.items():
        (out / k).parent.mkdir(parents=True, exist_ok=True)
        (out / k).write_bytes(v)
    (out / "snippets.json").write_text(json.dumps(snippets, indent=1, ensure_ascii=False))
    print(json.dumps({k: round(v, 2) for k, v in timings.items()}, indent=1))
    print(f"wrote {len(files)} files to {out} in {time.time() - t0:.1f} s")
