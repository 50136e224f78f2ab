"""megamoe sweep: grid parsing, parallel run, resume, outputs, bad axes."""

import json

import pandas as pd
import pytest

from megamoe.cli import main
from megamoe.errors import InputError
from sim.sweep import grid, parse_values, sweep

BASE = {"shape": "deepseek-v4-flash", "num_ranks": 4, "tokens_per_rank": 16}


def test_parse_values():
    assert parse_values("tokens", "1:9:4") == [1, 5, 9]
    assert parse_values("experts_per_wave", "2,4") == [2, 4]
    assert parse_values("nvlink_scale", "0.5,1") == [0.5, 1.0]
    assert parse_values("routing", "uniform,zipf:1.2") == ["uniform", "zipf:1.2"]
    assert len(grid({"a": [1, 2], "b": ["x", "y", "z"]})) == 6
    with pytest.raises(InputError, match="sweep axis"):
        parse_values("colour", "1")
    with pytest.raises(InputError, match="sweep.tokens"):
        parse_values("tokens", "a,b")
    with pytest.raises(InputError, match="sweep.hbm_scale"):
        parse_values("hbm_scale", "-1")


def test_sweep_runs_resumes_and_writes(tmp_path):
    axes = {"tokens": [8, 64], "nvlink_scale": [0.25, 1.0]}
    rows = sweep(axes, BASE, str(tmp_path), jobs=2, progress=False)
    assert len(rows) == 4 and all(r["error"] == "" for r in rows)
    slow = {r["tokens"]: r["time_us"] for r in rows if r["nvlink_scale"] == 0.25}
    fast = {r["tokens"]: r["time_us"] for r in rows if r["nvlink_scale"] == 1.0}
    # 8 tokens: pulls are latency-bound, a slower link changes nothing; 64: bandwidth shows
    assert slow[8] >= fast[8] and slow[64] > fast[64]
    df = pd.read_parquet(tmp_path / "results.parquet")
    assert len(df) == 4 and set(axes) <= set(df.columns)
    assert (tmp_path / "time_us_vs_tokens.png").exists()
    # resume: drop one line, the rerun computes only that point
    lines = (tmp_path / "points.jsonl").read_text().splitlines()
    (tmp_path / "points.jsonl").write_text("\n".join(lines[:3]) + "\n")
    rows2 = sweep(axes, BASE, str(tmp_path), jobs=1, progress=False)
    assert len((tmp_path / "points.jsonl").read_text().splitlines()) == 4
    assert sorted(r["time_us"] for r in rows2) == sorted(r["time_us"] for r in rows)


def test_invalid_points_are_recorded_not_fatal(tmp_path):
    rows = sweep({"experts_per_wave": [1, 999]}, BASE, str(tmp_path), jobs=1, progress=False)
    assert rows[0]["error"] == "" and "experts_per_wave" in rows[1]["error"]


def test_cli_sweep_and_bad_set(tmp_path, capsys):
    assert main(["sweep", "--shape", "deepseek-v4-flash", "--ranks", "2", "--tokens", "4",
                 "--set", "reserved_sms=0,20", "--set", "policy=rank-by-rank,round-robin",
                 "--out", str(tmp_path), "--jobs", "1"]) == 0
    rows = [json.loads(x) for x in (tmp_path / "points.jsonl").read_text().splitlines()]
    assert len(rows) == 4
    assert "4 points (0 invalid) -> " in capsys.readouterr().out
    assert main(["sweep", "--shape", "deepseek-v4-flash", "--ranks", "2", "--set", "tokens=4",
                 "--out", str(tmp_path / "one"), "--jobs", "1"]) == 0
    assert "1 point (0 invalid) -> " in capsys.readouterr().out
    assert main(["sweep", "--set", "tokens"]) == 2
    assert "--set: expected AXIS=VALUES" in capsys.readouterr().err


def test_sweep_on_a_dask_cluster_address(tmp_path):
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as cluster:
        rows = sweep({"tokens": [4, 32]}, BASE, str(tmp_path), address=cluster.scheduler_address,
                     progress=False)
    local = sweep({"tokens": [4, 32]}, BASE, str(tmp_path / "local"), jobs=1, progress=False)
    assert [r["time_us"] for r in rows] == [r["time_us"] for r in local]


def test_missing_cluster_package_is_a_clear_error(tmp_path):
    try:
        import ray  # noqa: F401
        pytest.skip("ray is installed")
    except ImportError:
        pass
    with pytest.raises(InputError, match="sweep.address: expected the 'ray' package"):
        sweep({"tokens": [4]}, BASE, str(tmp_path), address="ray://127.0.0.1:1", progress=False)


def test_resume_recomputes_points_of_another_base(tmp_path):
    """A finished point is reused only for the same base scenario: the same grid resumed with
    another hardware preset must give that preset's numbers, not the first run's."""
    from sim.sweep import sweep
    base = dict(shape="deepseek-v4-flash", num_ranks=2, tokens_per_rank=8, hardware="b200")
    r1 = sweep({"tokens": [1, 2]}, base, str(tmp_path), jobs=1, progress=False)
    r2 = sweep({"tokens": [1, 2]}, {**base, "hardware": "h200"}, str(tmp_path), jobs=1, progress=False)
    r3 = sweep({"tokens": [1, 2]}, {**base, "hardware": "h200"}, str(tmp_path / "fresh"), jobs=1, progress=False)
    assert [r["time_us"] for r in r2] == [r["time_us"] for r in r3]
    assert all(a["time_us"] != b["time_us"] for a, b in zip(r1, r2))


def test_shape_axis_takes_custom_shapes():
    from sim.sweep import parse_values
    assert parse_values("shape", "256,6,4096,2048") == ["256,6,4096,2048"]
    assert parse_values("shape", "deepseek-v4-flash;256,6,4096,2048") == ["deepseek-v4-flash", "256,6,4096,2048"]
    assert parse_values("shape", "deepseek-v4-flash,deepseek-v4-pro") == ["deepseek-v4-flash", "deepseek-v4-pro"]


def test_empty_point_has_no_overlap_efficiency(tmp_path):
    """A point with no routed token has nothing to overlap with: overlap efficiency is None in
    the rows and null / NaN in the files (as `megamoe simulate` shows n/a), not 0."""
    rows = sweep({"tokens": [0, 8]}, BASE, str(tmp_path), jobs=1, progress=False)
    by_t = {r["tokens"]: r for r in rows}
    assert by_t[0]["error"] == "" and by_t[0]["overlap_efficiency"] is None
    assert 0 < by_t[8]["overlap_efficiency"] <= 1
    df = pd.read_parquet(tmp_path / "results.parquet").set_index("tokens")
    assert pd.isna(df.loc[0, "overlap_efficiency"]) and df.loc[8, "overlap_efficiency"] > 0


def test_out_that_is_a_file_is_one_line_naming_out(tmp_path, capsys):
    """`--out` on an existing regular file (or under one) used to give an unnamed OS error
    ("README.md: File exists")."""
    f = tmp_path / "f.txt"
    f.write_text("keep")
    for out, why in ((f, "an existing file"), (f / "sub", f"{f} is a file")):
        with pytest.raises(SystemExit) as e:
            main(["sweep", "--set", "tokens=1,2", "--out", str(out)])
        assert e.value.code == 2
        assert capsys.readouterr().err.strip().splitlines() == [
            f"megamoe: error: argument --out: expected a folder (existing or new), got '{out}' ({why})"]
    assert f.read_text() == "keep"


def test_sweep_with_no_valid_point_writes_nothing(tmp_path, capsys):
    """A sweep whose points are all invalid (or whose grid is refused) exits 2 and leaves no
    --out folder behind; an earlier sweep's log in an existing folder stays as it was."""
    out = tmp_path / "sw"
    assert main(["sweep", "--shape", "deepseek-v4-flash", "--ranks", "2", "--tokens", "4",
                 "--set", "experts_per_wave=500,600", "--out", str(out), "--jobs", "1"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [(
        "megamoe: error: sweep: expected at least one valid point, got none (experts_per_wave: expected in "
        "[1, 128] (local experts), got 500)")]
    assert not out.exists()
    assert main(["sweep", "--set", "tokens=1:400", "--set", "seed=0:400", "--out", str(out)]) == 2
    assert not out.exists()
    with pytest.raises(InputError, match="^sweep: expected at least one valid point"):
        sweep({"experts_per_wave": [999]}, BASE, str(out), jobs=1, progress=False)
    assert not out.exists()
    rows = sweep({"tokens": [4]}, BASE, str(out), jobs=1, progress=False)
    log = (out / "points.jsonl").read_text()
    with pytest.raises(InputError, match="^sweep: expected at least one valid point"):
        sweep({"experts_per_wave": [999]}, BASE, str(out), jobs=1, resume=False, progress=False)
    assert (out / "points.jsonl").read_text() == log and rows[0]["error"] == ""
