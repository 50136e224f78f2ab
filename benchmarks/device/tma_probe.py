"""Measure the bulk-copy engine on the GPU: copy latency and streaming rates (benchmarks/device/tma_probe.cu).

Usage (on the GPU machine)::

    python3 benchmarks/device/tma_probe.py OUT.json

Compiles ``tma_probe.cu`` with nvcc for sm_90a, runs it, prints two tables and writes its JSON
plus the date, nvcc version and the SM clocks that ``nvidia-smi`` reported before the run. The
simulator's ``tma_latency_ns`` and ``sm_load_gbs`` for the H200 are read from the committed copy
(``benchmarks/results/tma_probe_h200.json``) by ``sim.calibrate.fit_tma_probe``.
"""
from __future__ import annotations

import datetime
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: tma_probe.py OUT.json", file=sys.stderr)
        return 2
    out = Path(argv[0])
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "tma_probe"
        subprocess.run(["nvcc", "-gencode=arch=compute_90a,code=sm_90a", "-O3", "-o", str(exe),
                        str(HERE / "tma_probe.cu")], check=True)
        clocks = subprocess.run(["nvidia-smi", "--query-gpu=name,clocks.sm,clocks.max.sm", "--format=csv,noheader"],
                                capture_output=True, text=True, check=False).stdout.strip()
        res = json.loads(subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout)
    nvcc = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
    res.update(date=datetime.date.today().isoformat(), nvcc=nvcc, nvidia_smi_before=clocks,
               source="benchmarks/device/tma_probe.cu")
    print(f"{res['device']}, {res['sms']} SMs; nvidia-smi before: {clocks}")
    print(f"{'bytes':>6} {'source':>6} {'CTAs':>5} {'p10 ns':>8} {'p50 ns':>8} {'p90 ns':>8} {'p50 cycles':>10}")
    for r in res["latency"]:
        print(f"{r['bytes']:>6} {r['source']:>6} {r['ctas']:>5} {r['ns_p10']:>8.0f} {r['ns_p50']:>8.0f} "
              f"{r['ns_p90']:>8.0f} {r['cycles_p50']:>10.0f}")
    print(f"{'CTAs':>5} {'warps':>5} {'stages/warp':>11} {'bytes':>6} {'source':>6} {'GB/s p50':>9} {'GB/s max':>9}")
    for r in res["stream"]:
        print(f"{r['ctas']:>5} {r['warps']:>5} {r['stages_per_warp']:>11} {r['bytes']:>6} {r['source']:>6} "
              f"{r['gbs_p50']:>9.1f} {r['gbs_max']:>9.1f}")
    out.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
