"""A 200-point sweep of V4-Pro EP8 decode scenarios (issue 8 target: < 3 min on 2 cores).

Axes: tokens per rank (8 decode sizes) x experts per wave (5) x NVLink scale (5) = 200
points, all local cores.  Prints a table, writes benchmarks/results/sweep_speed.json.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time

from sim.sweep import sweep


def main() -> None:
    axes = {"tokens": [1, 2, 4, 8, 16, 32, 64, 128], "experts_per_wave": [1, 2, 4, 8, 16],
            "nvlink_scale": [0.25, 0.5, 1.0, 2.0, 4.0]}
    base = {"shape": "deepseek-v4-pro", "num_ranks": 8, "hardware": "b200"}
    out = tempfile.mkdtemp(prefix="sweep-bench-")
    t0 = time.perf_counter()
    rows = sweep(axes, base, out, jobs=os.cpu_count(), resume=False, progress=False)
    wall = time.perf_counter() - t0
    shutil.rmtree(out)
    best = {}
    for r in rows:
        key = r["tokens"]
        if r["nvlink_scale"] == 1.0 and (key not in best or r["time_us"] < best[key][1]):
            best[key] = (r["experts_per_wave"], r["time_us"])
    print(f"{len(rows)} points on {os.cpu_count()} cores: {wall:.1f} s (target < 180 s)")
    print(f"{'tokens':>7s} {'best epw':>9s} {'time us':>9s}")
    for t, (epw, us) in sorted(best.items()):
        print(f"{t:7d} {epw:9d} {us:9.1f}")
    res = {"points": len(rows), "cores": os.cpu_count(), "wall_s": wall, "target_s": 180,
           "best_experts_per_wave_at_nvlink_1x": {str(k): v for k, v in best.items()}}
    path = os.path.join(os.path.dirname(__file__), "results", "sweep_speed.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
