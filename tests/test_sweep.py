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


def test_out_of_range_scale_refuses_the_sweep_before_anything_runs(tmp_path, capsys):
    """A scale factor that takes a figure out of its range (1e-6, 1e308, launch_ns x 1e9) used to
    crash the workers (OverflowError, MemoryError, BrokenProcessPool) and leave a partial
    points.jsonl behind: every point's scaled hardware is checked first, nothing is written."""
    out = tmp_path / "sw"
    for axis, vals, msg in (
            ("hbm_scale", [1.0, 1e-6], r"sweep.hbm_scale: expected a factor that keeps hbm_gbs in \[200, 100000\] "
                                       r"\(GB/s; B200 has 8000\), got 1e-06 \(hbm_gbs 0.008\)"),
            ("nvlink_scale", [1e308], r"sweep.nvlink_scale: expected a factor that keeps nvlink_gbs_per_direction "
                                      r"in \[100, 100000\] \(GB/s; B200 has 900\), got 1e\+308 "
                                      r"\(nvlink_gbs_per_direction inf\)"),
            ("launch_ns_scale", [1e9], r"sweep.launch_ns_scale: expected a factor that keeps launch_ns in "
                                       r"\[0.01, 1000000\] \(ns; B200 has 3000\), got 1000000000 "
                                       r"\(launch_ns 3000000000000\)")):
        with pytest.raises(InputError, match="^" + msg + "$"):
            sweep({"tokens": [4], axis: vals}, BASE, str(out), jobs=2, progress=False)
        assert not out.exists()
    # a scale valid on one hardware axis value and not on another refuses the sweep too
    with pytest.raises(InputError, match=r"^sweep.tc_scale: expected a factor that keeps fp8_dense_tflops in "
                                         r"\[200, 100000\] \(TFLOP/s; H20 has 296\), got 0.1 "):
        sweep({"hardware": ["b200", "h20"], "tc_scale": [0.1]}, BASE, str(out), jobs=1, progress=False)
    assert not out.exists()
    # an earlier sweep's log stays as it was
    sweep({"tokens": [4]}, BASE, str(out), jobs=1, progress=False)
    log = (out / "points.jsonl").read_text()
    with pytest.raises(InputError, match="^sweep.hbm_scale: "):
        sweep({"tokens": [4], "hbm_scale": [1e-300]}, BASE, str(out), jobs=1, resume=False, progress=False)
    assert (out / "points.jsonl").read_text() == log
    # the CLI: exit 2, one line, no folder
    out2 = tmp_path / "cli"
    assert main(["sweep", "--shape", "deepseek-v4-flash", "--ranks", "2", "--tokens", "4",
                 "--set", "hbm_scale=1e-6,1", "--out", str(out2), "--jobs", "2"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "megamoe: error: sweep.hbm_scale: expected a factor that keeps hbm_gbs in [200, 100000] "
        "(GB/s; B200 has 8000), got 1e-06 (hbm_gbs 0.008)"]
    assert not out2.exists()


def test_scale_axes_name_a_figure_and_finite_factors():
    with pytest.raises(InputError, match=r"^sweep axis: expected <hardware figure>_scale for a figure other than "
                                         r"num_sms \(or nvlink_scale, hbm_scale, tc_scale\), got foo_scale$"):
        parse_values("foo_scale", "2")
    with pytest.raises(InputError, match=r"^sweep axis: expected <hardware figure>_scale .*, got num_sms_scale$"):
        parse_values("num_sms_scale", "2")
    with pytest.raises(InputError, match=r"^sweep.hbm_scale: expected finite factors > 0, got 1,inf$"):
        parse_values("hbm_scale", "1,inf")
    with pytest.raises(InputError, match=r"^sweep: expected one scale axis per hardware figure, got hbm_scale and "
                                         r"hbm_gbs_scale both scale hbm_gbs$"):
        sweep({"hbm_scale": [1.0], "hbm_gbs_scale": [2.0]}, BASE, "unused-out", jobs=1, progress=False)


def test_sweep_at_the_range_ends_runs_and_plots(tmp_path):
    """Scales that take figures to the ends of their ranges run, and plot on a log axis (a
    factor ratio of 1e8 on launch_ns_scale)."""
    axes = {"hbm_scale": [200 / 8000, 1.0, 12.5], "launch_ns_scale": [0.01 / 3000, 1.0, 1e6 / 3000]}
    rows = sweep(axes, {**BASE, "num_ranks": 2, "tokens_per_rank": 4}, str(tmp_path), jobs=2, progress=False)
    assert len(rows) == 9 and all(r["error"] == "" for r in rows)
    assert (tmp_path / "time_us_vs_hbm_scale.png").exists() and (tmp_path / "time_us_vs_launch_ns_scale.png").exists()


def test_write_outputs_all_or_nothing(tmp_path):
    """The sweep's result files go through megamoe.outputs.Outputs: when one cannot be written
    (results.parquet is a folder) the earlier results.csv is left as it was and no temporary
    folder stays behind; otherwise all three kinds are written."""
    from sim.sweep import write_outputs

    rows = [{"tokens": 8, "time_us": 10.0}, {"tokens": 64, "time_us": 30.0}]
    (tmp_path / "results.csv").write_text("old\n")
    (tmp_path / "results.parquet").mkdir()
    with pytest.raises(InputError, match=r"^sweep --out: expected a file path \(not a folder\), got .*results.parquet"):
        write_outputs(rows, ["tokens"], str(tmp_path))
    assert (tmp_path / "results.csv").read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.csv", "results.parquet"]
    (tmp_path / "results.parquet").rmdir()
    write_outputs(rows, ["tokens"], str(tmp_path))
    assert (tmp_path / "results.csv").read_text().splitlines() == ["tokens,time_us", "8,10.0", "64,30.0"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.csv", "results.parquet", "time_us_vs_tokens.png"]
