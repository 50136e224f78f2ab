"""Launch skew between ranks (host jitter): the simulator's input, and its estimate from an
EP trace (``sim.compare.launch_skew_from_trace``).

Hand-derived facts: two ranks with the same token count and unmasked routing reach the
first NVLink barrier at the same time ``a``; if rank 1 starts ``X`` later, the barrier
completes ``X`` later and everything after it shifts by ``X``. So rank 0's call gets exactly
``X`` longer, rank 1's (timed from its own launch) is unchanged, and the trace's makespan
grows by ``X``.
"""

import dataclasses
import subprocess
import sys

import numpy as np
import pytest

from megamoe.errors import InputError
from megamoe.scenario import Scenario
from megamoe.trace import Trace
from sim import simulate
from sim.compare import launch_skew_from_trace

BASE = dict(shape="64,4,512,256", num_ranks=2, tokens_per_rank=24, max_tokens_per_rank=64, seed=3,
            hardware="h200", design="megamoe-sm90")


@pytest.mark.parametrize("x_us", [5.0, 120.0])
def test_late_rank_delays_the_other_by_exactly_the_skew(x_us):
    r0 = simulate(Scenario(**BASE))
    r1 = simulate(Scenario(**BASE, launch_skew_us=x_us))  # one number: the last rank is late
    t0 = [m["time_us"] for m in r0.summary["per_rank"]]
    t1 = [m["time_us"] for m in r1.summary["per_rank"]]
    assert t1[0] == pytest.approx(t0[0] + x_us, rel=1e-9, abs=1e-6)
    assert t1[1] == pytest.approx(t0[1], rel=1e-9, abs=1e-6)
    assert r1.trace.makespan_ns == pytest.approx(r0.trace.makespan_ns + 1e3 * x_us, rel=1e-9, abs=1e-3)
    assert r1.trace.meta["launch_skew_us"] == [0.0, x_us]


def test_skew_read_back_from_per_rank_clocks():
    """Simulate with offsets [40, 0, 150, 10] us, re-time each rank from its own first record
    (what the kernel's per-GPU clocks give), and read the offsets back from the barrier."""
    sc = Scenario(**{**BASE, "num_ranks": 4}, launch_skew_us=[40.0, 0.0, 150.0, 10.0])
    tr = simulate(sc).trace
    cols = {k: v.copy() for k, v in tr.cols.items()}
    for r in range(4):
        sel = cols["rank"] == r
        t0 = cols["t_start_ns"][sel].min()
        cols["t_start_ns"][sel] -= t0
        cols["t_end_ns"][sel] -= t0
    local = Trace(cols)
    local.meta = {"num_ranks": 4}
    assert launch_skew_from_trace(local) == pytest.approx([40.0, 0.0, 150.0, 10.0], abs=1e-6)


def test_offsets_spelling():
    assert Scenario(**BASE, launch_skew_us=7.5).launch_offsets_us() == [0.0, 7.5]
    assert Scenario(**BASE, launch_skew_us=np.array(7.5)).launch_offsets_us() == [0.0, 7.5]
    assert Scenario(**BASE, launch_skew_us=[3, 0]).launch_offsets_us() == [3.0, 0.0]
    assert Scenario(**BASE, launch_skew_us=[103, 100]).launch_offsets_us() == [3.0, 0.0]  # differences only
    assert Scenario(**BASE, launch_skew_us=[100, 100]).launch_offsets_us() == [0.0, 0.0]
    assert Scenario(**BASE).to_dict()["launch_skew_us"] == [0.0, 0.0]
    sc = dataclasses.replace(Scenario(**BASE), launch_skew_us=[1.0, 2.0])
    assert sc.to_dict()["launch_skew_us"] == [0.0, 1.0]


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), 1e9, [0.0, 100_001.0], [1.0, 2.0, 3.0], [1.0],
                                 "5", True])
def test_bad_skew_is_a_one_line_error(bad):
    with pytest.raises(InputError, match="^launch_skew_us: expected"):
        Scenario(**BASE, launch_skew_us=bad)


def test_skew_needs_two_ranks():
    with pytest.raises(InputError, match="^launch_skew_us: expected 0 with one rank"):
        Scenario(**{**BASE, "num_ranks": 1}, launch_skew_us=3.0)
    assert Scenario(**{**BASE, "num_ranks": 1}, launch_skew_us=0.0).launch_offsets_us() == [0.0]


@pytest.mark.parametrize("arg", ["-3", "abc", "1,,2", "nan", "1e9"])
def test_cli_bad_skew_exit_2(arg):
    p = subprocess.run([sys.executable, "-m", "megamoe.cli", "simulate", "--shape", "64,4,512,256", "--ranks", "2",
                        "--tokens", "8", f"--launch-skew-us={arg}"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert "launch-skew-us" in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) <= 2  # argparse: usage line + the error line


def test_cli_skew_runs(tmp_path):
    import json

    j = tmp_path / "s.json"
    p = subprocess.run([sys.executable, "-m", "megamoe.cli", "simulate", "--shape", "64,4,512,256", "--ranks", "2",
                        "--tokens", "24", "--max-tokens", "64", "--seed", "3", "--hardware", "h200", "--design",
                        "megamoe-sm90", "--launch-skew-us", "0,80", "--json", str(j)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    d = json.loads(j.read_text())
    assert d["scenario"]["launch_skew_us"] == [0.0, 80.0]
    base = simulate(Scenario(**BASE)).summary["per_rank"]
    assert np.isclose(d["per_rank"][0]["time_us"], base[0]["time_us"] + 80.0)


def test_sweep_skew_axis_and_all_invalid(tmp_path):
    """The sweep axis runs (time grows with the skew: rank 0 waits for the late rank); a sweep
    whose every point is invalid exits 2 with one line and writes no plot."""
    out = tmp_path / "sw"
    base = ["--shape", "64,4,512,256", "--tokens", "24", "--max-tokens", "64", "--hardware", "h200",
            "--design", "megamoe-sm90", "--out", str(out)]
    p = subprocess.run([sys.executable, "-m", "megamoe.cli", "sweep", "--ranks", "2", "--set", "launch_skew_us=0,40",
                        *base], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    import csv

    rows = list(csv.DictReader(open(out / "results.csv")))
    t = {float(r["launch_skew_us"]): float(r["time_us"]) for r in rows}
    assert t[40.0] == pytest.approx(t[0.0] + 40.0 / 2, rel=1e-9)  # mean over 2 ranks: rank 0 +40, rank 1 +0
    out2 = tmp_path / "bad"
    p = subprocess.run([sys.executable, "-m", "megamoe.cli", "sweep", "--ranks", "1", "--set", "launch_skew_us=10",
                        *base[:-1], str(out2)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "launch_skew_us" in p.stderr and "Traceback" not in p.stderr
    assert not list(out2.glob("*.png"))
