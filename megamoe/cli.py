"""The ``megamoe`` command line.

``megamoe simulate`` (the main job) predicts one Mega MoE call; ``megamoe validate``
compares the simulator with DeepGEMM PR #316's published rows.  Bad input prints one line
``megamoe: error: <field>: expected ..., got ...`` on stderr and exits with code 2.  Output
files are checked before any work and written all or nothing (:class:`Outputs`): a failed
command leaves no partial output and no existing file changed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile

from .errors import InputError, OneLineArgumentParser, parse_float, parse_int, require
from .outputs import Outputs


def _one_of_ints(*allowed: int, said: str | None = None):
    """An integer among ``allowed``; the error names them (or ``said``, for a long list)."""
    def conv(text: str) -> int:
        try:
            v = parse_int(text)
        except ValueError:
            v = None
        if v not in allowed:
            raise argparse.ArgumentTypeError(f"expected {said or ' or '.join(map(str, allowed))}, got {text!r}")
        return v
    return conv


def _int_at_least(lo: int):
    def conv(text: str) -> int:
        try:
            v = parse_int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"expected an integer >= {lo}, got {text!r}")
        return v
    return conv


_nonneg = _int_at_least(0)
_positive = _int_at_least(1)


def _wgmma_n_step(text: str) -> int:
    """``--wgmma-n-step``: the plan's rule said at once (0 used to get "an integer >= 1", and 1 then
    the plan's own message; fresh-user report, session 52). design_sm90 (numpy) loads only here."""
    from .design_sm90 import WGMMA_N_STEPS, WGMMA_N_STEPS_SAID

    return _one_of_ints(*WGMMA_N_STEPS, said=WGMMA_N_STEPS_SAID)(text)


def _tokens(text: str) -> int | list[int]:
    """--tokens: one count, or one per rank; a negative count names the whole range, as the
    scenario's own check does above it (a fresh user's report, session 54: ">= 0" hid the cap)."""
    from .scenario import MAX_TOKENS_PER_RANK
    try:
        vals = [parse_int(p) for p in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if min(vals) < 0:
        raise argparse.ArgumentTypeError(f"expected integers in [0, {MAX_TOKENS_PER_RANK}] per rank, got {text!r}")
    return vals[0] if len(vals) == 1 else vals


def _out_path(*suffixes: str):
    """An output file path whose folder exists, that is not a folder, and whose suffix is one
    of ``suffixes`` in any case (``X.NPZ`` is an NPZ file, ``T.JSON.GZ`` a gzipped JSON: the
    file is written in the format its suffix names, see :class:`Outputs`)."""
    def conv(text: str) -> str:
        folder = os.path.dirname(os.path.abspath(text))
        if not os.path.isdir(folder):
            raise argparse.ArgumentTypeError(f"expected a path in an existing folder, got {text!r}")
        if os.path.isdir(text):
            raise argparse.ArgumentTypeError(f"expected a file path (not a folder), got {text!r}")
        if suffixes and not text.lower().endswith(suffixes):
            raise argparse.ArgumentTypeError(f"expected a file ending in {' or '.join(suffixes)}, got {text!r}")
        return text
    return conv


def _out_dir(text: str) -> str:
    """An output folder: an existing folder, or a new one under an existing folder (not a file),
    each name in it short enough for its file system."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a folder (existing or new), got an empty path")
    for part in os.path.normpath(text).split(os.sep):
        if len(os.fsencode(part)) > 255:  # NAME_MAX of Linux file systems
            raise argparse.ArgumentTypeError(f"expected folder names of at most 255 bytes, got one of "
                                             f"{len(os.fsencode(part))} bytes")
    path = os.path.abspath(text)
    while not os.path.exists(path):  # the nearest part of the path that exists must be a folder
        path = os.path.dirname(path)
    if not os.path.isdir(path):
        what = "an existing file" if path == os.path.abspath(text) else f"{path} is a file"
        raise argparse.ArgumentTypeError(f"expected a folder (existing or new), got {text!r} ({what})")
    return text


def _clamp(text: str) -> float:
    """SwiGLU clamp: a finite number > 0 (leave the flag out for no clamp)."""
    import math

    try:
        v = parse_float(text)
    except ValueError:
        v = math.nan
    if not (math.isfinite(v) and v > 0):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0 (leave --clamp out for no clamp), "
                                         f"got {text!r}")
    return v


def _skew(text: str) -> float | list[float]:
    from .scenario import MAX_LAUNCH_SKEW_US, skew_in_range

    try:
        vals = [parse_float(x) for x in text.split(",")]
    except ValueError:
        vals = [float("nan")]
    if not all(skew_in_range(v) for v in vals):
        raise argparse.ArgumentTypeError(f"expected microseconds in [0, {MAX_LAUNCH_SKEW_US:g}] (one number or one "
                                         f"per rank), got {text!r}")
    return vals[0] if len(vals) == 1 else vals


def add_scenario_args(p: argparse.ArgumentParser) -> None:
    """Scenario and plan options shared by simulate / sweep (``megamoe run`` has its own)."""
    from .scenario import DESIGNS, MAX_RANKS_X_EXPERTS, MAX_ROUTED_SLOTS, MAX_TOKENS_PER_RANK

    g = p.add_argument_group("scenario")
    g.add_argument("--shape", default="deepseek-v4-pro",
                   help="preset (deepseek-v4-pro, deepseek-v4-flash) or E,k,H,I (default %(default)s)")
    g.add_argument("--ranks", type=_positive, default=8,
                   help=f"EP size (default %(default)s; ranks x experts at most {MAX_RANKS_X_EXPERTS})")
    g.add_argument("--tokens", type=_tokens, default=None,
                   help="tokens per rank, or a comma list with one value per rank (default 8192, at most "
                        f"{MAX_TOKENS_PER_RANK}, and ranks x tokens x top_k at most {MAX_ROUTED_SLOTS}; a routing "
                        "file decides it when not given)")
    g.add_argument("--max-tokens", type=_positive, default=None,
                   help=f"num_max_tokens_per_rank (default max(8192, tokens), at most {MAX_TOKENS_PER_RANK})")
    g.add_argument("--routing", default="uniform",
                   help="uniform | masked[:RATIO, default 0.5] | zipf[:S, default 1] | hot[:FRACTION[:N], "
                        "default 0.5:4] | one_expert (every token to expert 3 in slot 0, its other slots uniform) | file:PATH (PATH may hold {rank})")
    g.add_argument("--seed", type=_nonneg, default=0, help="seed of the routing and of the blocks' jitter (default %(default)s)")
    g.add_argument("--hardware", default="b200", help="b200 | h200 | h100 | h20 | path to a TOML file (default %(default)s)")
    g.add_argument("--design", default="deepgemm-sm100", choices=DESIGNS, help="deepgemm-sm100 | megamoe-sm90 (default %(default)s)")
    g.add_argument("--reserved-sms", type=_nonneg, default=0,
                   help="SMs taken away from the kernel (default %(default)s)")
    g.add_argument("--launch-skew-us", type=_skew, default=0.0,
                   help="host launch jitter: how much later the ranks' kernels start, microseconds: one "
                        "number (the last rank is that late) or one value per rank (default 0)")
    g = p.add_argument_group("plan overrides")
    g.add_argument("--experts-per-wave", type=_positive, default=None,
                   help="experts whose L1 and L2 blocks form one wave (default: the design's choice)")
    g.add_argument("--block-m", type=_positive, default=None,
                   help="token rows per block (deepgemm-sm100: 16, 32, 64, 96, 128, 192; megamoe-sm90: 16, 32, 64, 128; "
                        "default: the design's choice)")
    g.add_argument("--pool-tokens", type=_positive, default=None,
                   help="pool (ring) capacity in tokens (deepgemm-sm100, at least one expert's worst-case "
                        "wave; megamoe-sm90 has no ring, its pool holds every routed row; default: the design's choice)")
    g.add_argument("--num-stages", type=_positive, default=None,
                   help="shared-memory pipeline stages (default: as many as fit in shared memory, megamoe-sm90 "
                        "5 of the 8 at block_m 128; fewest: 2 for deepgemm-sm100, one per issuing producer warp "
                        "for megamoe-sm90, i.e. 4 at block_m 16-64 and 2 at 128). megamoe-sm90's model gives the "
                        "same time at every allowed count (within ~0.2%% at two CTAs per SM); its kernel runs "
                        "2-3%% faster at 5 stages than at 8 at block_m 128 (docs/kernel.md, Stages)")
    g.add_argument("--k-split", type=_positive, default=None,
                   help="megamoe-sm90 what-if: split every block's K blocks into N parts run by N CTAs "
                        "(split-K; the last part's CTA adds the others' FP32 partial sums and runs the "
                        "epilogue). N divides hidden/128 and intermediate/128. The H200 kernel is built "
                        "without it (default: no split)")
    g.add_argument("--wgmma-n-step", type=_wgmma_n_step, default=None,
                   help="megamoe-sm90 what-if: each block's WGMMAs (swap AB: the tokens are their N) cover its "
                        "valid rows rounded up to this many tokens, a multiple of 8 from 8 to 128, not the whole "
                        "block_m (at or above a block_m: whole blocks). The H200 kernel v9.12 steps by 32 at block_m "
                        "128 and runs whole blocks below it (default: the kernel's)")
    g.add_argument("--ctas-per-sm", type=_one_of_ints(1, 2), default=None,
                   help="megamoe-sm90: CTAs sharing one SM, 1 or 2 (default: the kernel's rule, two at block_m 16 "
                        "and one rank where the one-CTA wave rule gives at most 128 experts per wave, 3-682 "
                        "tokens on V4-Flash; kernel v9.2, taking their blocks by ticket since v9.3, with the "
                        "wide walk since v9.5; 2 at another block_m or rank count is an error)")
    g.add_argument("--combine-relay", choices=("on", "off"), default=None,
                   help="megamoe-sm90 what-if, one rank: on = each token's 128-column slice is summed by the "
                        "dispatch warps while the GEMMs run and the call ends without a grid sync; off = the "
                        "combine after the final barrier, as the H200 kernel is built (default: off)")
    g.add_argument("--l2-wait", default="k_block",
                   help="k_block (PR #304) | pool_block (PR #316): what an L2 K block waits for. It "
                        "rarely changes the time, because the scheduler puts a wave's L2 blocks after "
                        "all of its L1 blocks (with few SMs an L2 block can start earlier and the choice shows, e.g. "
                        "--reserved-sms 100)")
    g.add_argument("--policy", action="append", default=[],
                   help="scheduler policy: built-in name (fixed-waves:N, adaptive-waves, block-m:N, "
                        "rank-by-rank, wave-scheduler, wave-lag, interleaved, ...), module:Class or file.py:Class; repeatable")


def scenario_from_args(a: argparse.Namespace):
    from .scenario import Scenario

    return Scenario(shape=a.shape, num_ranks=a.ranks, tokens_per_rank=a.tokens,
                    max_tokens_per_rank=a.max_tokens, routing=a.routing, seed=a.seed,
                    hardware=a.hardware, design=a.design, experts_per_wave=a.experts_per_wave,
                    block_m=a.block_m, pool_tokens=a.pool_tokens, num_stages=a.num_stages,
                    k_split=a.k_split, wgmma_n_step=a.wgmma_n_step,
                    combine_relay=None if a.combine_relay is None else a.combine_relay == "on",
                    ctas_per_sm=a.ctas_per_sm, l2_wait=a.l2_wait, reserved_sms=a.reserved_sms, policies=a.policy,
                    launch_skew_us=a.launch_skew_us)


def _json_safe(obj):
    """``obj`` with every non-finite float as ``None``: JSON has no NaN or infinity (a NaN
    error of a comparison without matched intervals is written as ``null``)."""
    import math

    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj


def _console():
    """A rich console that does not cut wide tables when stdout is not a terminal (nor break its
    long lines of text, which logs are grepped for), and leaves a closed stdout to :func:`main`
    (rich itself would exit 1)."""
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            raise BrokenPipeError(32, "Broken pipe")

    return _Console() if sys.stdout.isatty() else _Console(width=200, soft_wrap=True)


def _fmt_overlap(v: float | None) -> str:
    """Overlap efficiency for a table: ``n/a`` (JSON null) when no rank has compute to overlap
    with (:func:`sim.metrics.overlap_efficiency` returns None)."""
    return "n/a" if v is None else f"{v:.2f}"


def _print_bounds(bnd: dict, verdict: str) -> None:
    """``simulate --bounds``: each probe's time and change, then the verdict line."""
    from rich.table import Table

    t = Table(title="what bounds it: the call again with one resource made faster, the rest as it is")
    for c in ("made faster", "time (us)", "change"):
        t.add_column(c, justify="right" if c != "made faster" else "left")
    t.add_row("(nothing: the call as it is)", f"{bnd['time_us']:.1f}", "")
    for r in bnd["rows"]:
        if r["change"] is None:
            t.add_row(r["probe"], "-", f"left out: {r['skipped']}")
        else:
            t.add_row(r["probe"], f"{r['time_us']:.1f}", f"{100 * r['change']:+.1f}%")
    con = _console()
    con.print(t)
    con.print(verdict, highlight=False)


def _print_scenario(con, res) -> None:
    """The two lines that name a simulated call: its scenario (shape, ranks, tokens, routing, seed,
    hardware, design) and rank 0's plan (block sizes, waves, stages, SMs and CTAs, pool, blocks)."""
    from sim.hardware import preset_names

    from . import design_sm90

    sc, plan = res.scenario, res.plan
    rp = plan.ranks[0]
    shape = sc.shape
    con.print(f"[bold]{shape.name}[/] (E={shape.num_experts}, k={shape.top_k}, H={shape.hidden}, "
              f"I={shape.intermediate})  EP{sc.num_ranks}  tokens/rank={_tokens_shown(sc)}  "
              f"routing={sc.routing.describe()}  seed={sc.seed}  hardware={res.hardware.name}"
              + ("" if sc.hardware.lower() in preset_names() else f" ({sc.hardware})") + "  "
              f"design={plan.design}"
              + (f"  launch skew (us)={sc.launch_offsets_us()}" if any(sc.launch_offsets_us()) else ""))
    con.print(f"plan (rank 0): block_m={rp.config.block_m} block_n={rp.config.block_n} "
              f"block_k={rp.config.block_k} experts/wave={rp.experts_per_wave} waves={rp.num_waves} "
              f"stages={rp.num_stages} SMs={plan.num_sms}"
              + (f" x {rp.ctas_per_sm} CTAs" if rp.ctas_per_sm > 1 else "")
              + (" (blocks by ticket" + (", wave-lag order)" if rp.lists_wave_lag else ")") if rp.block_tickets else "")
              + f" pool={plan.pool_tokens} tokens "
              f"pull={plan.bytes_per_pull} B  blocks={len(rp.blocks())}"
              + (f"  k_split={rp.k_split} (what-if)" if rp.k_split > 1 else "")
              + (f"  WGMMA N step={rp.wgmma_n_step}"
                 + (" (what-if)" if rp.wgmma_n_step != design_sm90.kernel_wgmma_n_step(rp.config.block_m) else "")
                 if rp.wgmma_n_step < rp.config.block_m else "")
              + ("  combine relay (what-if)" if rp.combine_relay else "")
              + ("  count: local, no count barrier" if rp.local_count else "")
              + (f"  policies: {', '.join(f'{k}={v}' for k, v in plan.policies.items())}" if plan.policies else ""))


def _print_summary(res) -> None:
    from rich.table import Table

    s, sc, plan = res.summary, res.scenario, res.plan
    con = _console()
    _print_scenario(con, res)
    mem = plan.memory_per_rank()
    con.print("HBM per rank (plan.memory_per_rank" + (", the symmetric buffer's workspace left out" if
                                                      plan.design == "deepgemm-sm100" else "") + "): "
              + " + ".join(f"{k} {mem[k] / 1e9:.2f}" for k in ("weights", "pools", "combine", "input"))
              + f" = {mem['total'] / 1e9:.2f} GB", highlight=False)
    t = Table()
    t.add_column("predicted (mean over ranks)")
    t.add_column("value", justify="right")
    t.add_row(f"time (us, {res.hardware.launch_ns / 1e3:g} us launch included)", f"{s['time_us']:.1f}")
    t.add_row("TFLOPS", f"{s['tflops']:.0f}")
    t.add_row("HBM GB/s", f"{s['hbm_gbs']:.0f}")
    t.add_row("NVLink GB/s (PR #316 formula" + ("; counts routed tokens, none cross NVLink at EP1)"
                                                if sc.num_ranks == 1 else ")"), f"{s['nvlink_gbs']:.0f}")
    if sc.num_ranks == 1:  # the formula counts every received token; one rank moves none over NVLink
        t.add_row("NVLink bytes simulated (EP1)", f"{s.get('nvlink_bytes_simulated', 0):.0f}")
    t.add_row("reduction tail (us)", f"{s['t_reduction_us']:.1f}")
    t.add_row("overlap efficiency", _fmt_overlap(s["overlap_efficiency"]))
    for role, v in s["busy_fraction"].items():
        t.add_row(f"busy: {role}", f"{v:.2f}")
    t.add_row("speedup vs legacy", f"{s['speedup_vs_legacy']:.2f}x")
    con.print(t)
    # the legacy path's fixed costs were fitted only with several ranks on the B200 (PR #316's
    # speedup column); at one rank (no all-to-all) or on other presets they are estimates
    src = res.hardware.sources.get("legacy_a2a_latency_ns", "")
    if sc.num_ranks == 1:
        con.print("speedup vs legacy: against this model's idealised unfused path at one rank (sim.legacy: a local "
                  "permute, grouped GEMMs at the FP4 weights' roofline, SwiGLU, a reduction), not a measured one; "
                  f"its launch gaps are an estimate (legacy_launch_ns {res.hardware.legacy_launch_ns / 1e3:g} us)",
                  highlight=False)
    elif res.hardware.is_estimate("legacy_a2a_latency_ns"):
        con.print("speedup vs legacy: against this model's idealised unfused path (sim.legacy: DeepEP all-to-alls "
                  "around grouped GEMMs at the FP4 weights' roofline), not a measured one; on "
                  f"{res.hardware.name} its all-to-all latency is not fitted to this GPU (legacy_a2a_latency_ns: {src})",
                  highlight=False)
    for note in _design_notes(plan.design, res.hardware):
        con.print(note, highlight=False)
    if sum(s["num_recv_tokens"]) == 0:
        con.print("empty call (no token routed to an expert): time, busy fractions and speedup describe the "
                  "call's fixed cost (count exchange, grid syncs, barriers); overlap efficiency: n/a (no compute; "
                  "null in --json)", highlight=False)


def _kernel_build_notes(meta: dict, res) -> list[str]:
    """The note under ``compare`` of a kernel trace recorded by another kernel build than the one
    most of the hardware's SM90 figures were fitted to (the ``build <hash>`` their sources name):
    part of such a trace's difference is the kernel's own change between the builds."""
    import re
    from collections import Counter

    from sim.hardware import SM90_DESIGN_FIGURES

    build, hw = meta.get("kernel_build"), res.hardware
    if res.plan.design != "megamoe-sm90" or not isinstance(build, str) or len(build) < 8:
        return []
    fits = Counter(b for k in SM90_DESIGN_FIGURES for b in set(re.findall(r"build ([0-9a-f]{8})", hw.sources.get(k, ""))))
    if not fits or fits.most_common(1)[0][0] == build[:8]:
        return []
    main, n = fits.most_common(1)[0]
    own = fits.get(build[:8], 0)
    return [f"note: the trace was recorded by kernel build {build[:8]}; {n} of {hw.name}'s {len(SM90_DESIGN_FIGURES)} "
            f"SM90 figures were fitted to traces of build {main}"
            + (f" ({own} to this build's)" if own else " (none to this build's)")
            + ": part of a difference may be the kernel's own change between the builds"]


def _design_notes(design: str, hw) -> list[str]:
    """The notes under a simulated call about its design on its hardware: a design built for another
    architecture than the GPU's (``arch`` of the hardware file against :data:`megamoe.plan.DESIGN_ARCH`:
    a what-if), and an SM90-design call whose hardware's SM90 figures are estimates (not fitted to
    traces of our SM90 kernel on that GPU)."""
    from megamoe.plan import DESIGN_ARCH
    from sim.hardware import SM90_DESIGN_FIGURES, inherited_from

    notes = []
    if hw.arch and DESIGN_ARCH[design] != hw.arch:
        native = [d for d, a in DESIGN_ARCH.items() if a == hw.arch]
        notes.append(f"note: design {design} is built for {DESIGN_ARCH[design].upper()} GPUs and {hw.name} is "
                     f"{hw.arch.upper()}: a what-if of that design on {hw.name}'s figures"
                     + (f"; --design {native[0]} models the kernel that runs there" if native else ""))
    est = [k for k in SM90_DESIGN_FIGURES if hw.is_estimate(k)] if design == "megamoe-sm90" else []
    # a figure a file takes from its base preset, where the preset measured or fitted it (not an estimate there)
    inherited = {}
    for k in est:
        got = inherited_from(hw.sources[k])
        if got and not got[1].lstrip().lower().startswith("estimate"):
            inherited.setdefault(got[0], []).append(k)
    n_inh = sum(map(len, inherited.values()))
    if est:
        n = len(SM90_DESIGN_FIGURES)
        parts = [f"{len(ks)} are the {p} preset's fits, taken through base" for p, ks in inherited.items()]
        if len(est) > n_inh:
            parts.append(f"{len(est) - n_inh} are estimates")
        lead = f"none of its {n} SM90 figures is" if len(est) == n else f"{len(est)} of its {n} SM90 figures are not"
        notes.append(f"note: design megamoe-sm90 on {hw.name}: {lead} fitted to traces of our SM90 kernel on this "
                     "GPU (the h200 preset's are): " + "; ".join(parts))
    return notes


_SUFFIXES = {"json": (".json",), "trace": (".json", ".json.gz"), "npz": (".npz",), "plot": (".png", ".svg", ".pdf"),
             "toml": (".toml",)}


def _tokens_shown(sc) -> str:
    """Tokens per rank as given: one number where every rank has it (a routing file gives a list)."""
    t = sc.tokens_list()
    return str(t[0]) if len(set(t)) == 1 else str(t)


def cmd_simulate(a: argparse.Namespace) -> int:
    from sim.engine import simulate
    from sim.hardware import load_hardware

    with Outputs() as outs:  # every output path and --trace-sms are checked before the simulation runs
        j = outs.reserve("--json", a.json, _SUFFIXES["json"])
        tr = outs.reserve("--trace", a.trace, _SUFFIXES["trace"])
        npz = outs.reserve("--trace-npz", a.trace_npz, _SUFFIXES["npz"])
        png = outs.reserve("--plot", a.plot, _SUFFIXES["plot"])
        if a.trace_sms is not None and not a.trace:
            raise InputError("--trace-sms", "a --trace to limit (it sets the Chrome trace's SMs per rank)",
                             f"--trace-sms {a.trace_sms} without --trace")
        sc = scenario_from_args(a)
        hw = load_hardware(sc.hardware)
        n_sms = sc.usable_sms(hw.num_sms)  # the plan's SMs
        if a.trace_sms is not None and a.trace_sms > n_sms:
            raise InputError("trace_sms", f"at most the plan's {n_sms} SMs per rank", a.trace_sms)
        trace_sms = min(8, n_sms) if a.trace_sms is None else a.trace_sms
        res = simulate(sc, hw)
        if a.bounds:
            from sim.studies import bound_verdict, bounds

            bnd = bounds(sc, hw, base=res)
            verdict = bound_verdict(bnd)
        if j:
            out = dict(res.summary)
            out["plan"] = res.plan.to_dict()
            out["scenario"] = res.scenario.to_dict()
            out["hardware"] = {"name": res.hardware.name, "path": res.hardware.path}
            if a.bounds:
                out["bounds"] = bnd["rows"]
                out["bounds_verdict"] = verdict
            with open(j, "w") as f:
                json.dump(out, f, indent=1, allow_nan=False)
        if tr:
            res.trace.save_chrome(tr, max_sms=trace_sms)
        if npz:
            res.trace.save_npz(npz)
        if png:
            from sim.plots import plot_timeline

            plot_timeline(res, png)
        outs.commit()  # all outputs produced: rename them into place, then report
    _print_summary(res)
    if a.bounds:
        _print_bounds(bnd, verdict)
    if a.json:
        print(f"wrote {a.json}")
    if a.trace:
        print(f"wrote {a.trace} (Chrome trace; SMs 0..{trace_sms - 1} of every rank"
              f"{'' if trace_sms == n_sms else f', of {n_sms}'})")
    if a.trace_npz:
        print(f"wrote {a.trace_npz}")
        from .policies import is_builtin

        own = [p for p in (a.policy or []) if not is_builtin(p)]
        if own:  # the trace records a policy of one's own by its name only
            print(f"note: the trace records {', '.join(own)} by name only: compare it with "
                  + " ".join(f"--policy {p}" for p in own))
    if a.plot:
        print(f"wrote {a.plot}")
    return 0


def cmd_validate(a: argparse.Namespace) -> int:
    from rich.table import Table

    from sim.validate import validate, verdict

    with Outputs() as outs:
        j = outs.reserve("--json", a.json, _SUFFIXES["json"])
        rows = validate(a.hardware, seed=a.seed)
        v = verdict(rows)
        if j:
            with open(j, "w") as f:
                json.dump(_json_safe({"rows": rows, **v}), f, indent=1, allow_nan=False)
        outs.commit()  # written whatever the verdict: the report of a FAIL is a result too
    t = Table(title=f"simulator ({a.hardware}) vs DeepGEMM PR #316 (V4-Flash, 8 x B200, EP8)")
    for c in ("tokens/rank", "time us pred", "pub", "err", "TFLOPS pred", "pub", "HBM GB/s pred",
              "pub", "NVL GB/s pred", "pub", "speedup pred", "pub"):
        t.add_column(c, justify="right")
    for r in rows:
        t.add_row(str(r["tokens_per_rank"]), f"{r['time_us_pred']:.1f}", f"{r['time_us_pub']:.1f}",
                  f"{100 * r['time_us_err']:+.1f}%", f"{r['tflops_pred']:.0f}", f"{r['tflops_pub']:.0f}",
                  f"{r['hbm_gbs_pred']:.0f}", f"{r['hbm_gbs_pub']:.0f}", f"{r['nvlink_gbs_pred']:.0f}",
                  f"{r['nvlink_gbs_pub']:.0f}", f"{r['speedup_vs_legacy_pred']:.2f}",
                  f"{r['speedup_vs_legacy_pub']:.2f}")
    _console().print(t)
    print(f"time error: max {100 * v['max_abs_time_error']:.1f}%, median "
          f"{100 * v['median_abs_time_error']:.1f}% (targets 15% / 8%): {'PASS' if v['pass'] else 'FAIL'}")
    if a.hardware != "b200":
        print(f"note: the published rows were measured on B200s; this run used hardware {a.hardware!r}")
    if a.json:
        print(f"wrote {a.json}")
    return 0 if v["pass"] else 1


def _check_sweep_out(out: str, names: list[str]) -> None:
    """``sweep --out``, checked before any point runs: the folder exists, or is still to be made in
    an existing folder (the sweep makes the folder, not its parents: a mistyped parent is refused,
    as every other output path's missing folder is), it (or that parent) is writable, and none of
    the files the sweep writes there is a folder or a read-only file.  (The sweep makes the folder
    once a point is valid, keeps ``points.jsonl`` as its resume log and writes the results at the
    end: sim.sweep.)

    Raises:
        InputError: ``--out`` as above.
    """
    folder = os.path.abspath(out)
    if not os.path.exists(folder):
        folder = os.path.dirname(folder)
        if not os.path.isdir(folder):
            raise InputError("--out", "a folder, existing or new in an existing folder (its parents are not made)",
                             f"{out} ({folder} is {'not a folder' if os.path.exists(folder) else 'missing'})")
    elif not os.path.isdir(folder):
        raise InputError("--out", "a folder, existing or new in an existing folder", f"{out} (a file)")
    try:  # a real probe: os.access says yes to root on read-only file systems and /proc
        fd, probe = tempfile.mkstemp(prefix=".megamoe-probe-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise InputError("--out", "a folder this user can write (existing or new)",
                         f"{out} ({folder}: {exc.strerror or type(exc).__name__})") from None
    for name in names:
        path = os.path.join(out, name)
        if os.path.isdir(path):
            raise InputError("--out", f"a folder where {name} can be written", f"{out} ({name} is a folder)")
        if os.path.exists(path) and not os.access(path, os.W_OK):
            raise InputError("--out", f"a folder where {name} can be written", f"{out} ({name} is read-only)")


def _options_given(argv: list[str], cmd: str) -> set[str]:
    """The dests of the options of subcommand ``cmd`` that ``argv`` gives explicitly: ``argv`` parsed
    again with every option's default replaced by a marker (``None`` for the appending ones)."""
    probe = build_parser()
    subs = next(x for x in probe._actions if isinstance(x, argparse._SubParsersAction))
    unset = object()
    for act in subs.choices[cmd]._actions:
        if act.option_strings and act.dest != "help":
            act.default = None if isinstance(act, argparse._AppendAction) else unset
    ns = probe.parse_args(argv)
    return {k for k, v in vars(ns).items() if v is not unset and v is not None}


def cmd_sweep(a: argparse.Namespace) -> int:
    from sim.sweep import parse_values, sweep

    axes = {}
    for item in a.set:
        axis, sep, vals = item.partition("=")
        if not sep:
            raise InputError("--set", "AXIS=VALUES (e.g. tokens=1,8,64 or experts_per_wave=1:8)", item)
        if axis in axes:
            raise InputError("--set", "each axis once (give its values as one list)", f"{axis} twice")
        axes[axis] = parse_values(axis, vals)
    if not axes:
        raise InputError("--set", "at least one AXIS=VALUES", "none")
    # a swept axis replaces its own option's value at every point: both given is a contradiction
    # (--policy is not one: a policy axis adds to the --policy list)
    both = sorted(x for x in set(axes) & _options_given(getattr(a, "argv", []), "sweep") if x != "policy")
    if both:
        raise InputError("--set", "an axis not also given as its own option",
                         f"{both[0]} in --set and --{both[0].replace('_', '-')}")
    _check_sweep_out(a.out, ["points.jsonl", "results.csv", "results.parquet", *(f"time_us_vs_{x}.png" for x in axes)])
    base = scenario_from_args(a)  # validates the shared fields once
    kw = {"shape": base.shape, "num_ranks": base.num_ranks, "tokens_per_rank": base.tokens_per_rank,
          "max_tokens_per_rank": a.max_tokens, "routing": base.routing, "seed": base.seed,
          "hardware": base.hardware, "design": base.design, "experts_per_wave": base.experts_per_wave,
          "block_m": base.block_m, "pool_tokens": base.pool_tokens, "num_stages": base.num_stages,
          "k_split": base.k_split, "wgmma_n_step": base.wgmma_n_step, "combine_relay": base.combine_relay,
          "ctas_per_sm": base.ctas_per_sm,
          "l2_wait": base.l2_wait,
          "reserved_sms": base.reserved_sms, "policies": list(a.policy),
          "launch_skew_us": base.launch_skew_us}
    earlier = os.path.exists(os.path.join(a.out, "results.csv"))
    rows = sweep(axes, kw, a.out, jobs=a.jobs, resume=not a.no_resume, address=a.address)
    bad = [r for r in rows if r["error"]]  # not all: sweep() refuses a sweep with no valid point
    written = [f for f in ["results.csv", "results.parquet", *(f"time_us_vs_{x}.png" for x in axes)]
               if os.path.exists(os.path.join(a.out, f))]
    print(f"{len(rows)} point{'s' * (len(rows) != 1)} ({len(bad)} invalid) -> {a.out}/" + ", ".join(written))
    if earlier:
        print("(results.csv and the plots there now hold this grid's points, an earlier sweep's replaced; "
              "points.jsonl keeps every point run in the folder, and a point already in it is not run again)")
    if "results.parquet" not in written:
        print("no results.parquet: it needs pandas and pyarrow (pip install -e '.[analysis]')")
    if bad:
        print(f"first invalid point: {bad[0]['error']}")
    _print_fastest(rows, list(axes), kw)
    return 0


def _print_fastest(rows: list[dict], axes: list[str], base: dict) -> None:
    """The sweep's fastest points as a table; for a sweep of plan decisions only, the plan's own
    choice of the same call simulated once beside them (how many grid points beat it)."""
    from rich.table import Table

    from sim.sweep import PLAN_AXES, WORKLOAD_AXES, fastest, run_point

    valid = [r for r in rows if not r["error"]]
    if set(axes) & WORKLOAD_AXES:  # different work per point: listed in the grid's order, not ranked
        best = valid[:20]
        title = f"the first {len(best)} valid of {len(rows)} points (grid order)"
    else:
        best = fastest(rows)
        title = f"the fastest {len(best)} of {len(rows)} points"
    chose = [k for k in ("block_m", "experts_per_wave") if k not in axes]  # what the plan decided per point
    t = Table(title=title)
    for c in [*axes, *(f"{k} (plan, rank 0)" for k in chose), "time (us)", "TFLOPS", "HBM GB/s"]:
        t.add_column(c, justify="right")
    for r in best:
        t.add_row(*(str(r[x]) for x in axes), *(str(r[f"{k}_r0"]) for k in chose), f"{r['time_us']:.1f}",
                  f"{r['tflops']:.0f}", f"{r['hbm_gbs']:.0f}")
    con = _console()
    con.print(t)
    if set(axes) <= PLAN_AXES:
        ref = run_point({}, base)
        if ref["error"]:
            con.print(f"the plan's own choice: invalid ({ref['error']})", highlight=False)
        else:
            n = sum(1 for r in valid if r["time_us"] < ref["time_us"])
            con.print(f"the plan's own choice (block_m {ref['block_m_r0']}, experts_per_wave {ref['experts_per_wave_r0']} "
                      f"on rank 0): {ref['time_us']:.1f} us; {n} of the {len(valid)} valid points {'is' if n == 1 else 'are'} faster",
                      highlight=False)


def cmd_compare(a: argparse.Namespace) -> int:
    from rich.table import Table

    from sim.compare import compare_file, plot_overlay
    from sim.hardware import load_hardware

    with Outputs() as outs:
        j = outs.reserve("--json", a.json, _SUFFIXES["json"])
        png = outs.reserve("--plot", a.plot, _SUFFIXES["plot"])
        report, measured, res = compare_file(a.trace, load_hardware(a.hardware) if a.hardware else None,
                                             a.policy or None)
        if j:
            with open(j, "w") as f:
                json.dump(_json_safe(report), f, indent=1, allow_nan=False)
        if png:
            plot_overlay(measured, res.trace, png)
        outs.commit()
    con = _console()
    _print_scenario(con, res)  # what the trace's call was simulated as
    side = "recorded" if measured.from_simulator else "measured"
    con.print(f"{a.trace}: {side} {report['makespan_measured_us']:.1f} us, simulated "
              f"{report['makespan_simulated_us']:.1f} us (the traced spans: launch not included), makespan error "
              f"{100 * report['makespan_error']:+.1f}%, median kind error {100 * report['median_kind_error']:.1f}% "
              f"(distributions {100 * report['median_kind_quantile_error']:.1f}%)")
    if a.hardware:  # another GPU model than the one the trace names: say so (as validate does)
        rec = measured.meta.get("hardware")
        try:
            same = rec is not None and load_hardware(rec).name == res.hardware.name
        except InputError:  # a file on the machine that recorded it
            same = False
        if not same:
            con.print(f"note: the trace was recorded on hardware {rec!r} (its meta); this run simulated it with "
                      f"{a.hardware!r} ({res.hardware.name})", highlight=False)
    for note in _design_notes(res.plan.design, res.hardware) + _kernel_build_notes(measured.meta, res):
        con.print(note, highlight=False)
    recorded, used = measured.meta.get("policies") or {}, res.scenario.to_dict()["policies"]
    if a.policy and used != recorded:
        con.print(f"note: the trace records the policies {recorded or 'none (the defaults)'}; this run simulated it "
                  f"with {used}", highlight=False)
    if any(report["launch_skew_us"]):
        con.print("ranks' launch skew read off the trace (host launch jitter: an input of the model, which it "
                  "does not predict; simulated with it): "
                  + ", ".join(f"{v:.1f}" for v in report["launch_skew_us"]) + " us; makespan error without it "
                  f"{100 * report['makespan_error_no_skew']:+.1f}%")
    t = Table(title="per-kind duration error",
              caption="median, p90: matched intervals; distribution: the kind's 10th-90th percentiles")
    for c in ("kind", "matched", "median", "p90", "distribution"):
        t.add_column(c, justify="right")
    for k, v in report["kind_errors"].items():
        q = report["kind_quantile_errors"].get(k)
        t.add_row(k, str(v["matched"]), f"{100 * v['median']:.1f}%", f"{100 * v['p90']:.1f}%",
                  "-" if q is None else f"{100 * q:.1f}%")
    con.print(t)
    for role, err in report["busy_fraction_error"].items():
        con.print(f"busy {role}: {side} {report['busy_fraction_measured'][role]:.2f}, simulated "
                  f"{report['busy_fraction_simulated'][role]:.2f} ({round(err, 2) + 0.0:+.2f})")  # no "-0.00"
    con.print(f"overlap efficiency: {side} {_fmt_overlap(report['overlap_efficiency_measured'])}, simulated "
              f"{_fmt_overlap(report['overlap_efficiency_simulated'])}")
    from sim.compare import MILESTONE_LABELS

    def _us(v):
        return "-" if v is None else f"{v:.1f}"

    con.print(f"phases, us from each trace's first record ({side} / simulated): "
              + "; ".join(f"{MILESTONE_LABELS[k]} {_us(v['measured_us'])} / {_us(v['simulated_us'])}"
                          for k, v in report["milestones"].items()), highlight=False)
    if a.json:
        print(f"wrote {a.json}")
    if a.plot:
        print(f"wrote {a.plot}")
    return 0


@contextlib.contextmanager
def _as_option(field: str, option: str):
    """Report an :class:`InputError` about ``field`` itself (not one of its parts, such as
    ``hardware.hbm_gbs``) under the command-line option that gave it."""
    try:
        yield
    except InputError as e:
        if e.field != field:
            raise
        raise InputError(option, e.expected, e.got) from None


def cmd_calibrate(a: argparse.Namespace) -> int:
    from sim.calibrate import base_preset, calibrated_toml, from_kernel_trace, measure

    with Outputs() as outs:  # a bad --base, --kernel-trace or --out is reported before measuring
        out = outs.reserve("--out", a.out, _SUFFIXES["toml"])
        with _as_option("calibrate --base", "--base"):
            base_preset(a.base)
        if a.kernel_trace:
            from megamoe.trace import Trace
            with _as_option("trace", "--kernel-trace"):
                Trace.load(a.kernel_trace)
        measured = measure()
        kernel = from_kernel_trace(a.kernel_trace, measured["fp8_gemm_tflops"]) if a.kernel_trace else None
        text = calibrated_toml(a.base, measured, kernel)
        with open(out, "w") as f:
            f.write(text)
        outs.commit()
    print(json.dumps({"measured": measured, "from_kernel_trace": kernel}, indent=1))
    print(f"wrote {a.out}")
    return 0


def cmd_build(a: argparse.Namespace) -> int:
    from .kernel.cli_support import build_main

    return build_main(a.arch, a.strict, a.force)


def cmd_run(a: argparse.Namespace) -> int:
    from .kernel.cli_support import run_main
    from .kernel.runtime import check_kernel_shape
    from .routing import kernel_routing_name
    from .scenario import check_tokens_per_rank
    from .shapes import get_shape

    s = get_shape(a.shape)  # bad --shape / --routing / --tokens / --trace / kernel limits are reported before looking for a GPU
    # the ranks named as simulate names them (the kernel's API says num_ranks)
    require(s.num_experts % a.ranks == 0, "ranks", f"a divisor of the expert count {s.num_experts}", a.ranks)
    check_kernel_shape(s.num_experts, s.top_k, s.hidden, s.intermediate, a.ranks)
    check_tokens_per_rank(a.tokens)
    routing = kernel_routing_name(a.routing)  # simulate's vocabulary -> the kernel generator's name
    try:  # the kernel runs through torch; `pip install -e .` and the `kernel` extra do not bring it
        import torch  # noqa: F401
    except ImportError:
        raise InputError("device", "torch (a CUDA build, >= 2.9) to run the kernel", "torch not installed") from None
    with Outputs() as outs:
        if a.ranks > 1:  # one process per GPU (starts torchrun, or joins an existing process group)
            from .kernel.ep import run_ep_main

            # every rank writes <trace>.rank<r>.json; a rank process of a running group only its own
            here = [int(os.environ["RANK"])] if "RANK" in os.environ else range(a.ranks)
            tr = outs.reserve_derived("--trace", a.trace, [f".rank{r}.json" for r in here]) if a.trace else None
            rc = run_ep_main(a.ranks, s.num_experts, s.top_k, s.hidden, s.intermediate, a.tokens, routing,
                             a.clamp, a.reps, tr, not a.no_check, a.seed)
        else:
            tr = outs.reserve("--trace", a.trace, _SUFFIXES["json"])
            with _StdoutRewrite(tr, a.trace):  # run_main names the path it wrote: show the final one
                rc = run_main(s.num_experts, s.top_k, s.hidden, s.intermediate, a.tokens, routing, a.clamp, a.reps,
                              tr, not a.no_check, a.seed)
        # the trace is kept when it was written (a failed reference check still writes it, exit 1)
        if a.trace and not outs.unwritten():
            outs.commit()
    return rc


class _StdoutRewrite:
    """Within the block, ``old`` printed on stdout appears as ``new`` (no-op when ``old`` is None)."""

    def __init__(self, old: str | None, new: str | None):
        self.old, self.new, self.saved = old, new, None

    def __enter__(self):
        if self.old:
            self.saved = sys.stdout
            sys.stdout = self
        return self

    def __exit__(self, *exc):
        if self.saved is not None:
            sys.stdout = self.saved

    def write(self, text: str) -> int:
        return self.saved.write(text.replace(self.old, self.new))

    def __getattr__(self, name):
        return getattr(self.saved, name)


def build_parser() -> argparse.ArgumentParser:
    p = OneLineArgumentParser(prog="megamoe", description="megamoe: predict (simulate), validate, sweep and run MegaMoE-style "
                "fused MoE kernels. Bad input: one line on stderr, exit code 2.")
    from importlib.metadata import PackageNotFoundError, version
    try:
        ver = version("megamoe")
    except PackageNotFoundError:  # running from a source tree that was not installed
        ver = "unknown (not installed)"
    p.add_argument("--version", action="version", version=f"megamoe {ver}")
    sub = p.add_subparsers(dest="cmd", parser_class=OneLineArgumentParser)
    s = sub.add_parser("simulate", help="predict one Mega MoE call (the main job)")
    add_scenario_args(s)
    o = s.add_argument_group("outputs")
    o.add_argument("--json", type=_out_path(".json"),
                   help="write the summary metrics (top-level keys), plan and scenario as JSON")
    o.add_argument("--trace", type=_out_path(".json", ".json.gz"),
                   help="write a Chrome trace JSON (opens in Perfetto; .json.gz ok)")
    o.add_argument("--trace-sms", type=_positive, default=None,
                   help="keep SMs 0..N-1 of every rank in --trace, N at most the plan's SMs (default 8, or all "
                        "when fewer; rank-level rows always)")
    o.add_argument("--trace-npz", type=_out_path(".npz"),
                   help="write the full trace as columnar NPZ (with scenario meta and routing)")
    o.add_argument("--plot", type=_out_path(".png", ".svg", ".pdf"), help="write a timeline figure")
    o.add_argument("--bounds", action="store_true",
                   help="also say what bounds the call: simulate it again with one resource made faster at a time "
                        "(HBM or tensor-core rate x2, NVLink x2 with several ranks, grid syncs and barriers x0.5, "
                        "epilogues x0.5, the SM90 K loop's own work x0.5: sim.studies.BOUND_PROBES), 4-6 more "
                        "simulations; in --json as 'bounds' and 'bounds_verdict'")
    s.set_defaults(func=cmd_simulate)
    w = sub.add_parser("sweep", help="simulate a grid of scenario / plan / hardware choices")
    add_scenario_args(w)
    from sim.sweep import AXIS_NAMES  # the axes, named once (sim.sweep: no simulator import)

    w.add_argument("--set", action="append", default=[], metavar="AXIS=VALUES",
                   help=f"swept axis: {', '.join(AXIS_NAMES)} or any "
                        "<hardware figure>_scale, with a,b,c or start:stop[:step] (combine_relay: on,off); shapes are "
                        "separated by ';' when one is a custom E,k,H,I; repeatable; an axis and its own option "
                        "together are refused (a policy axis adds to --policy)")
    w.add_argument("--out", type=_out_dir, default="sweep-out",
                   help="output folder (default %(default)s; made once a point is valid): points.jsonl (the resume "
                        "log), results.csv, results.parquet (with the analysis extra: pandas, pyarrow) and one PNG per "
                        "swept axis")
    w.add_argument("--jobs", type=_positive, default=None,
                   help="local worker processes, at most 4 x the CPUs (default: the CPUs; none with --address)")
    w.add_argument("--no-resume", action="store_true",
                   help="ignore points.jsonl from an earlier run (a point is reused only when its scenario and "
                        "the contents of the files it names are unchanged)")
    w.add_argument("--address", help="Dask (tcp://host:port) or Ray (ray://host:port) cluster address")
    w.set_defaults(func=cmd_sweep)
    c = sub.add_parser("compare", help="simulate a kernel trace's scenario and compare the timelines")
    c.add_argument("trace", help="trace file (.npz with meta and topk_idx)")
    c.add_argument("--hardware", help="hardware preset or TOML (default: the trace's)")
    c.add_argument("--policy", action="append", default=[], metavar="SPEC",
                   help="policy to simulate with in place of the trace's (repeatable; a policy of your own, "
                        "which a trace records only by name: FILE.py:Class or module:Class)")
    c.add_argument("--json", type=_out_path(".json"), help="write the report as JSON")
    c.add_argument("--plot", type=_out_path(".png", ".svg", ".pdf"),
                   help="write a measured-vs-simulated timeline figure")
    c.set_defaults(func=cmd_compare)
    k = sub.add_parser("calibrate", help="measure this GPU and write a hardware TOML (needs a GPU)",
                       description="Measure this GPU (SMs, L2, shared memory, copy bandwidth, FP8 GEMM rate, "
                       "peer copy where two GPUs see each other) and write a hardware TOML: a preset with the "
                       "measured figures replaced, each with its source; --kernel-trace adds the figures read "
                       "off a trace of our kernel.")
    k.add_argument("--base", default="h200",
                   help="preset whose other figures and sources are kept (b200, h100, h20, h200; default %(default)s)")
    k.add_argument("--out", type=_out_path(".toml"), default="calibrated.toml",
                   help="hardware TOML to write (default %(default)s)")
    k.add_argument("--kernel-trace", help="a megamoe kernel trace (.npz) for grid sync and MMA-path figures")
    k.set_defaults(func=cmd_calibrate)
    b = sub.add_parser("build", help="compile the CUDA kernel ahead of time (nvcc; no GPU needed)")
    b.add_argument("--arch", default="sm_90a", choices=("sm_90a", "sm_100a"),
                   help="sm_90a (H100/H200) or sm_100a (B200; never executed in this project); default %(default)s")
    b.add_argument("--strict", action="store_true",
                   help="fail on any local-memory load/store in a timed kernel instance's matrix code (from its "
                        "first to its last matrix instruction, and the whole K loop around each, from the stage "
                        "wait to the back edge; needs cuobjdump), on more than 512 B of spill stores per kernel instance (4096 B for the two-CTAs-per-SM "
                        "instances), "
                        "and when ptxas serialized an instance's WGMMAs (diagnostics such as C7514/C7518)")
    b.add_argument("--force", action="store_true", help="rebuild even when cached")
    b.set_defaults(func=cmd_build)
    r = sub.add_parser("run", help="run one scenario on the GPU(s) (--ranks N launches N processes), check it, time it")
    r.add_argument("--shape", default="deepseek-v4-flash", help="preset or E,k,H,I (default %(default)s)")
    r.add_argument("--tokens", type=_nonneg, default=64, help="tokens per rank (default %(default)s)")
    r.add_argument("--ranks", type=_positive, default=1, help="EP size: GPUs, one process each (NVLink; default %(default)s)")
    r.add_argument("--routing", default="uniform",
                   help="the names of simulate --routing that the kernel's input generator makes: uniform | "
                        "zipf (exponent 1; experts 0, 1, 2, ... the most popular) | one_expert (expert 3 in "
                        "slot 0 of every token, the other slots uniform); default %(default)s")
    r.add_argument("--clamp", type=_clamp, default=None,
                   help="SwiGLU clamp: a finite number > 0 (default: no clamp)")
    r.add_argument("--reps", type=_positive, default=10,
                   help="timed repetitions; the median is reported (default %(default)s)")
    r.add_argument("--trace", type=_out_path(".json"),
                   help="write the kernel's own trace (Chrome JSON; with --ranks R one file per rank, "
                        "TRACE.rank<r>.json)")
    r.add_argument("--no-check", action="store_true",
                   help="skip the reference checks (exact partial sums within 5e-3 rel L2, and the share of "
                        "outputs bitwise equal to the H200-WGMMA-modelled reference; the latter takes ~20 s "
                        "at 4096 tokens on an H200)")
    r.add_argument("--seed", type=_nonneg, default=0, help="input seed (default %(default)s)")
    r.set_defaults(func=cmd_run)
    v = sub.add_parser("validate", help="simulator vs DeepGEMM PR #316 published rows")
    v.add_argument("--hardware", default="b200",
                   help="hardware preset or TOML (default %(default)s: the rows were measured on B200s)")
    v.add_argument("--seed", type=_nonneg, default=0, help="seed of the routing and of the blocks' jitter (default %(default)s)")
    v.add_argument("--json", type=_out_path(".json"),
                   help="write the rows (predicted and published) and the verdict as JSON")
    v.set_defaults(func=cmd_validate)
    return p


def _stdout_gone() -> None:
    """stdout's reader went away (``megamoe sweep ... | head -1``): point stdout at /dev/null
    so the interpreter's last flush does not complain again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no real file descriptor (tests capturing stdout)
        pass


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the exit code: 0, 1 (a failed verdict or check), 2 (bad input,
    one line on stderr), 130 (Ctrl-C: one line), 141 (stdout closed early, quietly, like a
    unix tool stopped by SIGPIPE).  Outputs are written all or nothing (:class:`Outputs`)."""
    try:
        argv = sys.argv[1:] if argv is None else argv
        parser = build_parser()
        if not argv:  # the help, and the one-line error of a missing command
            parser.print_help()
            commands = next(x.choices for x in parser._actions if isinstance(x, argparse._SubParsersAction))
            raise InputError("command", "one of " + ", ".join(commands), "none")
        args = parser.parse_args(argv)
        args.argv = list(argv)  # what was given (cmd_sweep: an option and its axis both)
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        rc = args.func(args)
        sys.stdout.flush()  # a closed pipe shows here, not after main returned
        return rc
    except InputError as exc:
        print(f"megamoe: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        _stdout_gone()
        return 141
    except KeyboardInterrupt:
        print("megamoe: interrupted", file=sys.stderr)
        return 130
    except OSError as exc:  # an input or output path the OS refused (a folder, no permission, ...)
        where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
        print(f"megamoe: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
