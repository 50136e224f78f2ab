"""Measure one SM90 K block of WGMMAs at each N (tokens), as candidates TN / TN8 would run it.

Usage::

    python3 benchmarks/device/wgmma_n_probe.py OUT.json [EXE]

Runs ``wgmma_n_probe.cu`` (compiled here with nvcc for sm_90a and the CUTLASS/CuTe headers, or
EXE: the probe built on another machine, e.g. ``out/probe/wgmma_n_probe`` carried to a device
that lacks the headers), prints a table and writes its JSON plus the date and the SM clocks that
``nvidia-smi`` reported before the run. Build it here with::

    nvcc -std=c++17 -gencode=arch=compute_90a,code=sm_90a -O3 -I csrc/megamoe \\
        -I "$(python -c 'from megamoe.kernel.build import find_cutlass_include as f; print(f())')" \\
        -o out/probe/wgmma_n_probe benchmarks/device/wgmma_n_probe.cu

Prediction and reading: ``benchmarks/NOTES_kernel.md``, fifty-first session.
"""
from __future__ import annotations

import datetime
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2):
        print("usage: wgmma_n_probe.py OUT.json [EXE]", file=sys.stderr)
        return 2
    out = Path(argv[0])
    with tempfile.TemporaryDirectory() as tmp:
        if len(argv) == 2:
            exe = Path(argv[1]).resolve()
        else:
            sys.path.insert(0, str(ROOT))
            from megamoe.kernel.build import find_cutlass_include

            exe = Path(tmp) / "wgmma_n_probe"
            subprocess.run(["nvcc", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", "-O3",
                            "-I", str(ROOT / "csrc/megamoe"), "-I", str(find_cutlass_include()), "-o", str(exe),
                            str(HERE / "wgmma_n_probe.cu")], check=True)
        clocks = subprocess.run(["nvidia-smi", "--query-gpu=name,clocks.sm,clocks.max.sm", "--format=csv,noheader"],
                                capture_output=True, text=True, check=False).stdout.strip()
        res = json.loads(subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout)
    res.update(date=datetime.date.today().isoformat(), nvidia_smi_before=clocks,
               source="benchmarks/device/wgmma_n_probe.cu")
    print(f"{res['device']}, {res['sms']} SMs, {res['iters']} K blocks per warpgroup; nvidia-smi before: {clocks}")
    print(f"{'N':>4} {'WGs':>3} {'promote':>7} {'split':>5} {'ns/K block':>10} {'p10':>7} {'p90':>7} {'cycles':>7} {'TFLOP/s':>8}")
    for r in res["rows"]:
        print(f"{r['n']:>4} {r['warpgroups']:>3} {str(r['promote']):>7} {str(r.get('split', False)):>5} {r['ns_per_k_block_p50']:>10.1f} "
              f"{r['ns_p10']:>7.1f} {r['ns_p90']:>7.1f} {r['cycles_per_k_block_p50']:>7.0f} {r['tflops']:>8.1f}"
              + (f"  {r['error']}" if r["error"] else ""))
    out.write_text(json.dumps(res, indent=1) + "\n")
    return 0 if not any(r["error"] for r in res["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
