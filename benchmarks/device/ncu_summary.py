"""Summarize ncu_x2.sh's output (run here, on its unpacked ncu.tgz): per token count, the warp
stall samples of the whole kernel and of the consumer K loop (the smallest backward branch
around two or more QGMMAs), the K loop's warp instructions per K block, its most-stalled
instructions, and the scheduler statistics. Prints a table and writes JSON.

Usage: python benchmarks/device/ncu_summary.py DIR OUT.json [build-hash]
(DIR holds sass_t<T>.csv and details_t<T>.txt.)"""

import collections
import csv
import json
import re
import sys
from pathlib import Path

from megamoe.errors import OneLineArgumentParser


def k_loop(ins):
    """Index range of the smallest backward-branch span that holds two QGMMAs or more."""
    at = {a: i for i, (a, *_) in enumerate(ins)}
    best = None
    for i, (a, src, *_) in enumerate(ins):
        m = re.search(r"BRA (0x[0-9a-f]+)", src)
        if m and int(m.group(1), 16) < a and int(m.group(1), 16) in at:
            s = at[int(m.group(1), 16)]
            if sum("QGMMA" in x[1] for x in ins[s:i + 1]) >= 2 and (best is None or i - s < best[1] - best[0]):
                best = (s, i)
    return best


def summarize(csv_path: Path, details: Path) -> dict:
    rows = list(csv.reader(csv_path.open()))
    hdr, data = rows[1], rows[2:]
    ia, isrc = hdr.index("Address"), hdr.index("Source")
    iss, iex = hdr.index("Warp Stall Sampling (All Samples)"), hdr.index("Instructions Executed")
    reasons = [(i, h[len("stall_"):]) for i, h in enumerate(hdr) if h.startswith("stall_") and "Not Issued" not in h]
    ins = [(int(r[ia], 16), r[isrc].strip(), int(r[iss] or 0), int(r[iex] or 0), r) for r in data if r[ia].startswith("0x")]
    s, e = k_loop(ins)
    loop = ins[s:e + 1]

    def by_reason(xs):
        c = collections.Counter()
        for x in xs:
            for i, h in reasons:
                c[h] += int(x[4][i] or 0)
        n = sum(x[2] for x in xs)
        return {h: round(v / n, 4) for h, v in c.most_common() if v}

    total, in_loop = sum(x[2] for x in ins), sum(x[2] for x in loop)
    # each QGMMA of the loop runs once per K block and warp: its executions = K blocks x warps
    k_block_warps = max(x[3] for x in loop if "QGMMA" in x[1])
    top = sorted(loop, key=lambda x: -x[2])[:8]
    sched = {}
    for line in details.read_text().splitlines():
        m = re.match(r"\s+(Issued Warp Per Scheduler|No Eligible|Eligible Warps Per Scheduler|"
                     r"Warp Cycles Per Issued Instruction)\s+(?:\S+\s+)?([\d.]+)\s*$", line)
        if m:
            sched[m.group(1)] = float(m.group(2))
    return {
        "samples": total, "k_loop_sample_fraction": round(in_loop / total, 4),
        # (the wait loops' retries included: more than the hot path's count in SASS)
        "k_loop_warp_instructions_per_k_block": round(sum(x[3] for x in loop) / k_block_warps, 1),
        "k_loop_stalls": by_reason(loop), "kernel_stalls": by_reason(ins), "scheduler": sched,
        "k_loop_top": [{"sass": x[1][:70], "fraction": round(x[2] / in_loop, 4),
                        "reason": max(reasons, key=lambda r: int(x[4][r[0]] or 0))[1]} for x in top],
    }


def main() -> int:
    ap = OneLineArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", type=Path, help="unpacked ncu.tgz (sass_t<T>.csv, details_t<T>.txt)")
    ap.add_argument("out", type=Path, help="JSON file to write")
    ap.add_argument("build", nargs="?", help="the kernel build the profile ran (recorded in the JSON)")
    a = ap.parse_args()
    files = sorted(a.dir.glob("sass_t*.csv"), key=lambda p: int(p.stem[6:])) if a.dir.is_dir() else []
    if not files:
        print(f"ncu_summary: error: dir: expected a folder holding sass_t<T>.csv files (ncu_x2.sh's "
              f"unpacked output), got {str(a.dir)!r}", file=sys.stderr)
        return 2
    res = {"build": a.build, "tokens": {}}
    for f in files:
        T = int(f.stem[6:])
        r = res["tokens"][T] = summarize(f, a.dir / f"details_t{T}.txt")
        print(f"T={T}: K loop {r['k_loop_sample_fraction']:.0%} of {r['samples']} samples, "
              f"{r['k_loop_warp_instructions_per_k_block']:.0f} warp instructions per K block; "
              f"issued {r['scheduler'].get('Issued Warp Per Scheduler')} warps/scheduler/cycle")
        print("  K loop:", ", ".join(f"{k} {v:.0%}" for k, v in list(r["k_loop_stalls"].items())[:7]))
        print("  kernel:", ", ".join(f"{k} {v:.0%}" for k, v in list(r["kernel_stalls"].items())[:7]))
        for t in r["k_loop_top"][:4]:
            print(f"    {t['fraction']:5.1%} {t['reason']:16s} {t['sass']}")
    a.out.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
