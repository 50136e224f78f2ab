"""The three what-if studies of the docs tutorial (issue 8), as tables + JSON + PNGs.

Writes benchmarks/results/what_if.json and what_if_<study>.png into a folder given as the
first argument (default benchmarks/results).
"""

from __future__ import annotations

import json
import os
import sys
import time

from sim.studies import plot_study, study_experts_per_wave, study_pull_order, study_reserved_sms


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "results")
    os.makedirs(out, exist_ok=True)
    t0 = time.perf_counter()
    studies = {"experts_per_wave": study_experts_per_wave(), "reserved_sms": study_reserved_sms(),
               "pull_order": study_pull_order()}
    for name, rows in studies.items():
        print(f"== {name}")
        for r in rows:
            print("  " + ", ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))
        plot_study(name, rows, os.path.join(out, f"what_if_{name}.png"))
    with open(os.path.join(out, "what_if.json"), "w") as f:
        json.dump(studies, f, indent=1)
    print(f"{time.perf_counter() - t0:.1f} s -> {out}")


if __name__ == "__main__":
    main()
