"""Simulator vs the committed H200 kernel traces (issue 7): makespan and per-kind errors,
and the ranking of plan choices measured on the kernel.

Prints two tables and writes benchmarks/results/compare_h200.json.  Runs on any CPU: the
traces (benchmarks/traces/*.npz) and the kernel's plan-choice times
(results/kernel_plan_choices_h200.json) were measured on the lent H200s: the EP1 traces and
plan choices on one H200, the traces with the FP8 WGMMA kernel v9.11 (build 9fbc8612, 2026-12-04,
forty-fourth session; the committed sources' build d9de8ea2 has the same SASS), the plan choices with
v9.10 (build ee6b3823, the same session, whose SASS v9.11 keeps in those instances; kernel time by
CUPTI since the forty-first session, until then one call's CUDA-event time), the EP2 traces on two
(NV18) with v6.4 (build fbc2931d, 2026-12-01; the two-GPU machine was not lent when v6.5-v9.11 were
recorded). Each trace's row also holds the phase milestones of ``sim.compare.milestones`` (us from
its first record, measured and simulated). EP traces are simulated with the ranks' launch skew read off the trace (host jitter; the column
without it is shown too).
"median kind err" pairs each block's durations on the two sides; "kind dist err" compares each
kind's duration distribution (quantiles, ``sim.compare.QUANTILES``): at two CTAs per SM which block
runs on an SM's first CTA and which on its second is decided at run time on each side apart.
A plan-choice pair must be ordered like the kernel only where the kernel's times differ by
more than 5% (``must_agree``); ``ranking_ok`` says whether all of those are.
"""

from __future__ import annotations

import glob
import json
import os

from megamoe.scenario import Scenario
from sim import simulate
from sim.compare import compare_file

HERE = os.path.dirname(os.path.abspath(__file__))


def trace_rows() -> list[dict]:
    rows = []
    for path in sorted(glob.glob(os.path.join(HERE, "traces", "kernel_*.npz")),
                       key=lambda p: (p.split("_t")[0], int(p.split("_t")[-1].split(".")[0]))):
        r, tr, _ = compare_file(path)
        rows.append({"trace": os.path.basename(path), "ranks": r["scenario"]["num_ranks"],
                     "kernel_build": tr.meta.get("kernel_build"),
                     "tokens": r["scenario"]["tokens_per_rank"][0],
                     **{k: r[k] for k in ("makespan_measured_us", "makespan_simulated_us", "makespan_error",
                                          "makespan_error_no_skew", "launch_skew_us", "median_kind_error",
                                          "median_kind_quantile_error",
                                          "overlap_efficiency_error", "unmatched_block_work")},
                     "kind_median_errors": {k: v["median"] for k, v in r["kind_errors"].items()},
                     "kind_quantile_errors": r["kind_quantile_errors"],
                     "busy_fraction_error": r["busy_fraction_error"],
                     "milestones_us": r["milestones"]})
    return rows


def ranking_rows() -> list[dict]:
    with open(os.path.join(HERE, "results", "kernel_plan_choices_h200.json")) as f:
        meas = json.load(f)
    for m in meas:
        sc = Scenario(shape="deepseek-v4-flash", num_ranks=1, tokens_per_rank=m["tokens"], max_tokens_per_rank=m.get("max_tokens", 4096),
                      design="megamoe-sm90", hardware="h200", **m["override"])
        m["simulated_us"] = simulate(sc).trace.makespan_ns / 1e3
    pairs = []
    for i in range(0, len(meas), 2):
        a, b = meas[i], meas[i + 1]
        diff = abs(a["kernel_us"] / b["kernel_us"] - 1)
        pairs.append({"tokens": a["tokens"], "a": a["override"], "b": b["override"],
                      "kernel_build": a.get("kernel_build", "not recorded"),
                      "kernel_us": [a["kernel_us"], b["kernel_us"]], "simulated_us": [a["simulated_us"], b["simulated_us"]],
                      "kernel_diff": diff, "must_agree": diff > 0.05,
                      "same_order": (a["kernel_us"] < b["kernel_us"]) == (a["simulated_us"] < b["simulated_us"])})
    return pairs


def main() -> None:
    rows, pairs = trace_rows(), ranking_rows()
    print(f"{'EP':>3s} {'tokens':>6s} {'measured us':>12s} {'simulated us':>13s} {'makespan err':>13s} "
          f"{'median kind err':>16s} {'kind dist err':>14s} {'launch skew us':>15s} {'err w/o skew':>13s}  kernel build")
    for r in rows:
        print(f"{r['ranks']:3d} {r['tokens']:6d} {r['makespan_measured_us']:12.1f} {r['makespan_simulated_us']:13.1f} "
              f"{100 * r['makespan_error']:+12.1f}% {100 * r['median_kind_error']:15.1f}% "
              f"{100 * r['median_kind_quantile_error']:13.1f}% "
              f"{max(r['launch_skew_us']):15.1f} {100 * r['makespan_error_no_skew']:+12.1f}%  "
              f"{(r['kernel_build'] or 'not recorded')[:8]}")
    print()
    print(f"{'tokens':>6s} {'choice A':>22s} {'choice B':>22s} {'kernel us A/B':>18s} {'sim us A/B':>18s} {'same order':>10s}")
    for p in pairs:
        print(f"{p['tokens']:6d} {json.dumps(p['a']):>22s} {json.dumps(p['b']):>22s} "
              f"{p['kernel_us'][0]:8.0f}/{p['kernel_us'][1]:<8.0f} {p['simulated_us'][0]:8.0f}/{p['simulated_us'][1]:<8.0f} "
              f"{str(p['same_order']) + ('' if p['must_agree'] else ' (<5%)'):>10s}")
    out = os.path.join(HERE, "results", "compare_h200.json")
    ok = all(p["same_order"] for p in pairs if p["must_agree"])
    print(f"plan choices apart by more than 5% ordered like the kernel: {ok}")
    with open(out, "w") as f:
        builds: dict[str, set] = {}
        for x in rows:  # the kernel builds of the traces, from each trace's meta
            builds.setdefault(f"EP{x['ranks']}", set()).add(str(x["kernel_build"])[:8])
        json.dump({"kernel": "; ".join(f"{ep}: build {', '.join(sorted(b))}" for ep, b in sorted(builds.items())),
                   "plan_choices_kernel": "; ".join(sorted({f"build {str(p['kernel_build'])[:8]}" for p in pairs})),
                   "traces": rows, "plan_choices": pairs, "ranking_ok": ok}, f, indent=1)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
