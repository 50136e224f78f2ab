"""The model asked the calls of a ``benchmarks/device/sm_rounds_probe.py`` result (any CPU).

For every token count and entry of the probe's JSON, the simulator runs the same call: the
routing the probe saved (``topk_idx``), the V4-Flash shape on one rank, the SM90 design, and the
GPU's SMs less the entry's n reserved (``Scenario.reserved_sms``), on a hardware preset or TOML.
It prints the kernel's median time and ratio to the first entry beside the model's, with the SMs
the entry's CTAs ran on (``traced_call_smids``: an entry without a green context whose two-CTA
plan has more CTAs than SMs is spread over the whole GPU, and the model cannot say so; such rows
are marked), and writes the table as JSON.

RESULT is the probe's JSON, or a session's experiments file that holds it under
``sm_rounds_probe.measured`` (``benchmarks/results/kernel_experiments_s49.json``: an H100).
Usage: python benchmarks/sm_rounds_model.py RESULT.json [HARDWARE] [OUT.json]
(HARDWARE default ``h200``; OUT default RESULT with ``_model`` before ``.json``).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import numpy as np

from megamoe.scenario import Scenario
from sim import simulate


def model_rows(result: dict, hardware: str) -> dict:
    """``{tokens: {entry: {...}}}``: the probe's and the model's time (us) and ratio to the first
    entry of each token count, the CTAs, the SMs the kernel's CTAs ran on and whether the model
    describes the placement (``confined``: the entry ran on exactly its n SMs)."""
    gpu_sms = int(result["meta"]["sms_on_gpu"])
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for T, row in result["tokens"].items():
            path = os.path.join(tmp, f"route_{T}.npy")
            np.save(path, np.asarray(row["topk_idx"], dtype=np.int64))
            cells = {}
            for entry, k in row["sms"].items():
                n = int(entry.rstrip("g"))
                res = simulate(Scenario(shape="deepseek-v4-flash", num_ranks=1, tokens_per_rank=int(T),
                                        routing=f"file:{path}", hardware=hardware, design="megamoe-sm90",
                                        reserved_sms=gpu_sms - n))
                cells[entry] = {"kernel_us": k["us_median"], "model_us": res.summary["time_us"],
                                "kernel_ctas": k["ctas"], "model_ctas": res.plan.ranks[0].num_sms,
                                "smids": k.get("traced_call_smids"),
                                "confined": k.get("traced_call_smids") == n}
            first = next(iter(cells.values()))
            for c in cells.values():
                c["kernel_ratio"] = c["kernel_us"] / first["kernel_us"]
                c["model_ratio"] = c["model_us"] / first["model_us"]
                c["model_over_kernel"] = c["model_us"] / c["kernel_us"]
            out[T] = cells
    return out


def main(argv: list[str]) -> None:
    if not 1 <= len(argv) <= 3:
        sys.exit(__doc__.strip().splitlines()[-2])
    src, hardware = argv[0], argv[1] if len(argv) > 1 else "h200"
    dst = argv[2] if len(argv) > 2 else src.replace(".json", "_model.json")
    result = json.load(open(src))
    if isinstance(result, dict) and isinstance(result.get("sm_rounds_probe"), dict):
        result = result["sm_rounds_probe"].get("measured", result)  # a session's experiments file holds one
    if not (isinstance(result, dict) and isinstance(result.get("meta"), dict) and "sms_on_gpu" in result["meta"]
            and isinstance(result.get("tokens"), dict)):
        sys.exit(f"RESULT: expected an sm_rounds_probe.py result (meta.sms_on_gpu, tokens), got {src}")
    if old := [T for T, row in result["tokens"].items() if "topk_idx" not in row]:
        sys.exit(f"RESULT: expected each token count's routing (topk_idx, saved since session 49), got none at "
                 f"{', '.join(old)} tokens in {src}")
    rows = model_rows(result, hardware)
    print(f"{result['meta']['device']}, build {result['meta']['build']}; model on {hardware}")
    print(f"{'tokens':>6} {'entry':>6} {'CTAs':>5} {'on SMs':>6} {'kernel us':>10} {'x first':>8} "
          f"{'model us':>9} {'x first':>8} {'model/kernel':>12}")
    for T, cells in rows.items():
        for e, c in cells.items():
            mark = "" if c["confined"] else "  (not on its n SMs: the model describes another launch)"
            print(f"{T:>6} {e:>6} {c['kernel_ctas']:5d} {c['smids'] or 0:6d} {c['kernel_us']:10.1f} "
                  f"{c['kernel_ratio']:8.3f} {c['model_us']:9.1f} {c['model_ratio']:8.3f} "
                  f"{c['model_over_kernel']:12.3f}{mark}")
    with open(dst, "w") as f:
        json.dump({"source": src, "hardware": hardware, "tokens": rows}, f, indent=1)
    print(f"wrote {dst}")


if __name__ == "__main__":
    main(sys.argv[1:])
