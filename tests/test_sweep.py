"""megamoe sweep: grid parsing, parallel run, resume, outputs, bad axes."""

import json
import os
import re

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
    with pytest.raises(InputError, match="sweep axis") as e:
        parse_values("colour", "1")
    assert e.value.got == "colour"  # nothing close: no hint
    with pytest.raises(InputError, match="sweep axis") as e:
        parse_values("tokns", "1,2")
    assert e.value.got == "tokns (did you mean tokens?)"
    with pytest.raises(InputError, match="sweep.tokens"):
        parse_values("tokens", "a,b")
    with pytest.raises(InputError, match="sweep.hbm_scale"):
        parse_values("hbm_scale", "-1")


def test_a_value_given_twice_is_refused():
    """A repeated value would be simulated twice and give two identical rows: refused, also where
    two spellings parse to the same number."""
    for axis, text, dup in (("tokens", "1,8,1", "1"), ("hbm_scale", "1,1.0", "1.0"),
                            ("routing", "uniform,zipf:1.2,uniform", "'uniform'"),
                            ("shape", "deepseek-v4-flash;deepseek-v4-flash", "'deepseek-v4-flash'")):
        with pytest.raises(InputError, match=rf"^sweep.{axis}: expected distinct values, got {dup} twice in "):
            parse_values(axis, text)
    assert parse_values("tokens", "1:3") == [1, 2, 3]
    # two spellings of one routing spec or shape give the same simulation: refused as well
    for axis, text, pair in (("routing", "uniform,UNIFORM", "'uniform' and 'UNIFORM'"),
                             ("routing", "zipf:1,zipf:1.0", "'zipf:1' and 'zipf:1.0'"),
                             ("routing", "masked:0.5,masked", "'masked:0.5' and 'masked'"),
                             ("shape", "deepseek-v4-flash;256,6,4096,2048", "'deepseek-v4-flash' and '256,6,4096,2048'"),
                             # presets are case-insensitive (fresh-user report, session 49)
                             ("hardware", "H100,h100", "'H100' and 'h100'")):
        with pytest.raises(InputError, match=rf"^sweep.{axis}: expected distinct values, got {pair} \(the same\) in "):
            parse_values(axis, text)
    assert parse_values("routing", "zipf:1,zipf:1.2") == ["zipf:1", "zipf:1.2"]
    assert parse_values("hardware", "h100,h200") == ["h100", "h200"]
    # a policy axis value is a set of policies joined by '+': the order does not make another point
    with pytest.raises(InputError, match=r"^sweep.policy: expected distinct values, got 'interleaved\+rank-by-rank' "
                                         r"and 'rank-by-rank\+interleaved' \(the same\)"):
        parse_values("policy", "interleaved+rank-by-rank,rank-by-rank+interleaved")
    assert parse_values("policy", "interleaved+rank-by-rank,interleaved") == ["interleaved+rank-by-rank", "interleaved"]


@pytest.mark.parametrize("axis,text,message", [
    ("shape", "384,6,7168,3072,deepseek-v4-flash", "'384' in '384,6,7168,3072,deepseek-v4-flash'"),
    ("shape", "bogus", "'bogus'"),
    ("routing", "zipf:x,uniform", "'zipf:x' in 'zipf:x,uniform' (routing.zipf_exponent: x)"),
    ("routing", "zipf:-1", "'zipf:-1' (routing.zipf_exponent: -1.0)"),
    ("policy", "interleaved,bogus", "'bogus' in 'interleaved,bogus'"),
    ("hardware", "h200,a100", "'a100' in 'h200,a100'"),
    ("design", "sm90", "'sm90'"),
    ("l2_wait", "k_block,x", "'x' in 'k_block,x'"),
    # an integer axis below its floor (the Scenario's lower bound) is invalid in every grid
    ("seed", "-3,1", "-3 in '-3,1'"),
    ("tokens", "-2:2", "-2 in '-2:2'"),
    ("ranks", "0,1", "0 in '0,1'"),
    ("num_stages", "0:2", "0 in '0:2'"),
    ("ctas_per_sm", "1,3", "3 in '1,3'"),  # ran every point before "no valid point" (fresh-user report, s48)
    ("wgmma_n_step", "8,12", "12 in '8,12'"),  # each an invalid row before (fresh-user report, s51)
    ("wgmma_n_step", "136", "136 in '136'"),
    ("tokens", "8,131073", "131073 in '8,131073'"),
    ("max_tokens", "131073", "131073 in '131073'"),
])
def test_a_value_wrong_in_every_point_is_refused_up_front(axis, text, message):
    """A name that no grid point can take (an unknown shape, routing spec, policy, preset, design or
    L2 wait) is refused before any point runs; it used to become an invalid row per point, and a
    comma-separated custom shape ran as four one-number shapes (fresh-user report, forty-sixth
    session). A value that fits some points and not others stays each point's error."""
    with pytest.raises(InputError) as e:
        parse_values(axis, text)
    assert e.value.field == f"sweep.{axis}" and str(e.value.got) == message  # a value alone is not repeated
    assert parse_values("block_m", "16,17") == [16, 17]  # 17 fails as its points (the design decides)
    assert parse_values("seed", "0,3") == [0, 3] and parse_values("reserved_sms", "0:1") == [0, 1]
    assert parse_values("wgmma_n_step", "8:128:8") == list(range(8, 129, 8))
    with pytest.raises(InputError, match=r"^sweep.wgmma_n_step: expected multiples of 8 from 8 to 128, got 4 in '4'$"):
        parse_values("wgmma_n_step", "4")


@pytest.mark.parametrize("axis,text", [("seed", "1_000"), ("tokens", "1:1_0"), ("seed", "\u0661"),
                                       ("nvlink_scale", "1_0"), ("launch_skew_us", "\u0661")])
def test_digit_group_underscores_and_non_ascii_digits_are_refused(axis, text):
    """Python's int() / float() read '1_000' and Arabic-Indic digits; a sweep value that is not
    plain ASCII is a typo, refused up front (fresh-user report, forty-seventh session)."""
    with pytest.raises(InputError) as e:
        parse_values(axis, text)
    assert e.value.field == f"sweep.{axis}" and text in str(e.value.got)


def test_an_empty_value_is_refused():
    for axis, text, sep in (("tokens", "1,,2", "commas"), ("routing", "uniform,", "commas"),
                            ("shape", "deepseek-v4-flash;;deepseek-v4-pro", "semicolons")):
        with pytest.raises(InputError, match=rf"^sweep.{axis}: expected values separated by single {sep} \(no empty "
                                             rf"value\), got "):
            parse_values(axis, text)


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


def test_combine_relay_axis_is_on_off_in_the_outputs(tmp_path):
    """The axis is spelled on / off as on the command line, in every output; each point is the
    same simulation as the Scenario with combine_relay True / False."""
    from megamoe.scenario import Scenario
    from sim.engine import simulate
    from sim.hardware import load_hardware

    base = {"shape": "deepseek-v4-flash", "num_ranks": 1, "tokens_per_rank": 4, "design": "megamoe-sm90",
            "hardware": "h200"}
    rows = sweep({"combine_relay": ["on", "off"]}, base, str(tmp_path), jobs=1, progress=False)
    assert [r["combine_relay"] for r in rows] == ["on", "off"] and all(r["error"] == "" for r in rows)
    hw = load_hardware("h200")
    for r, flag in zip(rows, (True, False)):
        assert r["time_us"] == simulate(Scenario(**base, combine_relay=flag), hw).summary["time_us"]
    assert rows[0]["time_us"] != rows[1]["time_us"]
    assert (tmp_path / "results.csv").read_text().splitlines()[1].startswith("on,")
    assert list(pd.read_parquet(tmp_path / "results.parquet")["combine_relay"]) == ["on", "off"]


def test_plot_draws_a_line_per_combination_of_the_other_axes(tmp_path, monkeypatch):
    """A numeric axis is drawn as lines through its points, one per value of the other axis (it used
    to draw their mean); a categorical one (on / off, routings, policies) as markers only, at its
    values' positions in the axis's order. With more than MAX_PLOT_LINES combinations the plot draws
    the fastest over them and shades their range. Every plot starts at 0 us."""
    import matplotlib.axes

    from sim.sweep import MAX_PLOT_LINES, plot_axes

    seen, bands, ylims = [], [], []
    real, real_fill, real_ylim = matplotlib.axes.Axes.plot, matplotlib.axes.Axes.fill_between, matplotlib.axes.Axes.set_ylim
    monkeypatch.setattr(matplotlib.axes.Axes, "plot",
                        lambda self, *a, **k: (seen.append((list(a[0]), list(a[1]), k.get("linestyle"))), real(self, *a, **k))[1])
    monkeypatch.setattr(matplotlib.axes.Axes, "fill_between",
                        lambda self, *a, **k: (bands.append((list(a[0]), list(a[1]), list(a[2]))), real_fill(self, *a, **k))[1])
    monkeypatch.setattr(matplotlib.axes.Axes, "set_ylim",
                        lambda self, *a, **k: (ylims.extend([k["bottom"]] if "bottom" in k else []), real_ylim(self, *a, **k))[1])
    rows = [{"tokens": t, "combine_relay": c, "time_us": float(t + (1 if c == "on" else 3))}
            for t in (1, 8) for c in ("on", "off")]
    plot_axes(rows, ["tokens", "combine_relay"], {"tokens": str(tmp_path / "t.png"), "combine_relay": str(tmp_path / "c.png")})
    assert seen == [([1, 8], [2.0, 9.0], "-"), ([1, 8], [4.0, 11.0], "-"),  # tokens, one line per on / off
                    ([0, 1], [2.0, 4.0], "none"), ([0, 1], [9.0, 11.0], "none")]  # on / off, one per token count
    assert bands == [] and ylims == [0, 0]
    assert (tmp_path / "t.png").exists() and (tmp_path / "c.png").exists()
    # nine seeds beside the tokens: the fastest per token count, the seeds' range shaded
    seen.clear()
    rows = [{"tokens": t, "seed": k, "time_us": float(10 * t + k)} for t in (1, 8) for k in range(MAX_PLOT_LINES + 1)]
    plot_axes(rows, ["tokens", "seed"], {"tokens": str(tmp_path / "t.png"), "seed": str(tmp_path / "s.png")})
    assert seen[0] == ([1, 8], [10.0, 80.0], "-") and bands[0] == ([1, 8], [10.0, 80.0], [18.0, 88.0])


def test_cli_sweep_says_when_parquet_is_skipped(tmp_path, capsys, monkeypatch):
    """Without pyarrow (the analysis extra) the sweep writes results.csv and the plots, no
    results.parquet, and says so in one line."""
    import sys

    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow -> ImportError
    assert main(["sweep", "--shape", "deepseek-v4-flash", "--ranks", "2", "--set", "tokens=4,8",
                 "--out", str(tmp_path), "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    assert "no results.parquet: it needs pandas and pyarrow" in out
    assert (tmp_path / "results.csv").exists() and not (tmp_path / "results.parquet").exists()
    assert (tmp_path / "time_us_vs_tokens.png").exists()


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


@pytest.mark.parametrize("address", ["notaurl", "foo://x", "tcp://", "http://127.0.0.1:8786", "127.0.0.1"])
def test_malformed_cluster_address_is_refused_before_anything_runs(tmp_path, address):
    """An address that is neither a Dask nor a Ray address is a one-line error naming
    sweep.address, before any point runs or the output folder is made."""
    out = tmp_path / "out"
    with pytest.raises(InputError, match=r"^sweep.address: expected tcp://host:port or host:port \(Dask\), or "
                                         r"ray://host:port or ray \(Ray\), got "):
        sweep({"tokens": [4]}, BASE, str(out), address=address, progress=False)
    assert not out.exists()


@pytest.mark.parametrize("address", ["tcp://127.0.0.1:99999", "127.0.0.1:0", "ray://head:70000"])
def test_cluster_address_port_out_of_range_is_refused_before_anything_runs(tmp_path, address):
    """A port outside 1-65535 is refused by name before any connection is tried (it used to try,
    then report an unreachable scheduler; fresh-user report, session 51)."""
    out = tmp_path / "out"
    with pytest.raises(InputError, match=rf"^sweep.address: expected a port from 1 to 65535, got {re.escape(address)}$"):
        sweep({"tokens": [4]}, BASE, str(out), address=address, progress=False)
    assert not out.exists()


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
    assert parse_values("shape", "deepseek-v4-flash;256,6,4096,1024") == ["deepseek-v4-flash", "256,6,4096,1024"]
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
            f"megamoe: error: --out: expected a folder (existing or new), got '{out}' ({why})"]
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


def test_a_figure_that_may_be_0_scales_to_0(tmp_path):
    """block_jitter's range starts at 0, so its scale may be 0 (jitter off: each point equals the
    simulation at block_jitter 0, and differs from the preset's at 12 tokens, two CTAs per SM);
    hbm_gbs's does not, so 0 is refused by the same rule ("finite factors > 0")."""
    import dataclasses

    from megamoe.scenario import Scenario
    from sim import simulate
    from sim.hardware import load_hardware

    assert parse_values("block_jitter_scale", "0,1") == [0.0, 1.0]
    with pytest.raises(InputError, match=r"^sweep.block_jitter_scale: expected finite factors >= 0, got -1,1$"):
        parse_values("block_jitter_scale", "-1,1")
    with pytest.raises(InputError, match=r"^sweep.hbm_scale: expected finite factors > 0, got 0,1$"):
        parse_values("hbm_scale", "0,1")
    base = {"shape": "deepseek-v4-flash", "num_ranks": 1, "tokens_per_rank": 12, "design": "megamoe-sm90",
            "hardware": "h200"}
    rows = sweep({"block_jitter_scale": [0.0, 1.0]}, base, str(tmp_path), jobs=1, progress=False)
    sc = Scenario(**base)
    hw = load_hardware("h200")
    want = [simulate(sc, dataclasses.replace(hw, block_jitter=0.0)).summary["time_us"], simulate(sc).summary["time_us"]]
    assert want[0] != want[1]
    assert [r["time_us"] for r in sorted(rows, key=lambda r: r["block_jitter_scale"])] == pytest.approx(want, rel=1e-12)


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


def test_a_new_sweep_in_the_folder_removes_the_old_axis_plots(tmp_path):
    """A sweep over other axes into the same folder replaces results.csv, so the earlier
    sweep's plot of an axis it no longer has goes too; a folder of that name stays."""
    from sim.sweep import write_outputs

    write_outputs([{"tokens": 8, "time_us": 10.0}, {"tokens": 64, "time_us": 30.0}], ["tokens"], str(tmp_path))
    (tmp_path / "time_us_vs_notes.png").mkdir()
    write_outputs([{"routing": "uniform", "time_us": 10.0}, {"routing": "zipf", "time_us": 12.0}], ["routing"],
                  str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.csv", "results.parquet", "time_us_vs_notes.png",
                                                          "time_us_vs_routing.png"]
    assert (tmp_path / "results.csv").read_text().splitlines()[0] == "routing,time_us"


def test_jobs_is_bounded_and_no_idle_worker_is_started(tmp_path, monkeypatch, capsys):
    """`--jobs 100000` used to start one process per job (thousands, 23 GB): jobs above
    JOBS_PER_CPU x CPUs are refused before anything runs, and no more workers start than
    there are points to run."""
    import os

    from sim import sweep as S

    bound = S.max_jobs()
    assert bound == S.JOBS_PER_CPU * (os.cpu_count() or 1)
    out = tmp_path / "j"
    for jobs in (bound + 1, 0, -1, True, 2.0):
        with pytest.raises(InputError, match=rf"^sweep --jobs: expected an integer in \[1, {bound}\] "
                                             rf"\({S.JOBS_PER_CPU} x the {os.cpu_count() or 1} CPUs\), got "):
            sweep({"tokens": [4]}, BASE, str(out), jobs=jobs, progress=False)
    with pytest.raises(InputError, match=r"^sweep --jobs: expected no --jobs with --address \(the cluster's own "
                                         r"workers run the points\), got 2$"):
        sweep({"tokens": [4]}, BASE, str(out), jobs=2, address="tcp://127.0.0.1:1", progress=False)
    assert main(["sweep", "--shape", "deepseek-v4-flash", "--set", "tokens=4", "--out", str(out),
                 "--jobs", str(bound + 1)]) == 2
    assert capsys.readouterr().err.splitlines() == [(
        f"megamoe: error: sweep --jobs: expected an integer in [1, {bound}] ({S.JOBS_PER_CPU} x the "
        f"{os.cpu_count() or 1} CPUs), got {bound + 1}")]
    assert not out.exists()
    # at most one worker per point to run: two points with `bound` jobs start two workers; a
    # resumed sweep with one point left runs it in this process
    started = []
    real = S.ProcessPoolExecutor

    def recording(max_workers, **kw):
        started.append(max_workers)
        return real(max_workers=max_workers, **kw)

    monkeypatch.setattr(S, "ProcessPoolExecutor", recording)
    sweep({"tokens": [4, 8]}, BASE, str(out), jobs=bound, progress=False)
    lines = (out / "points.jsonl").read_text().splitlines()
    (out / "points.jsonl").write_text(lines[0] + "\n")
    sweep({"tokens": [4, 8]}, BASE, str(out), jobs=bound, progress=False)
    assert started == [2] if bound >= 2 else started == []


def _set_hbm(path, value):
    """The hardware TOML with its first ``hbm_gbs = ...`` line set to ``value``."""
    lines = path.read_text().splitlines()
    i = next(i for i, x in enumerate(lines) if x.startswith("hbm_gbs ="))
    lines[i] = f"hbm_gbs = {value}"
    path.write_text("\n".join(lines) + "\n")


def test_resume_key_holds_the_input_files_contents(tmp_path, capsys):
    """The resume key held only path strings: a hardware TOML edited between two runs gave the
    first run's times (137 us instead of 1213 us), and an invalid one was never read.  The key
    now holds each input file's SHA-256, and the base hardware is loaded before resuming."""
    from sim.hardware import PRESET_DIR

    hw = tmp_path / "my.toml"
    hw.write_bytes((PRESET_DIR / "h200.toml").read_bytes())
    base = {**BASE, "hardware": str(hw)}
    out = tmp_path / "sr"
    r1 = sweep({"tokens": [8, 64]}, base, str(out), jobs=1, progress=False)
    _set_hbm(hw, 400.0)
    r2 = sweep({"tokens": [8, 64]}, base, str(out), jobs=1, progress=False)
    fresh = sweep({"tokens": [8, 64]}, base, str(tmp_path / "fresh"), jobs=1, progress=False)
    assert [r["time_us"] for r in r2] == [r["time_us"] for r in fresh]
    assert all(b["time_us"] > 2 * a["time_us"] for a, b in zip(r1, r2))
    assert len((out / "points.jsonl").read_text().splitlines()) == 4
    # unchanged contents: every point is reused
    r3 = sweep({"tokens": [8, 64]}, base, str(out), jobs=1, progress=False)
    assert r3 == r2 and len((out / "points.jsonl").read_text().splitlines()) == 4
    # an invalid TOML refuses the resumed sweep (exit 2), the log stays as it was
    log = (out / "points.jsonl").read_bytes()
    hw.write_text("garbage\n")
    with pytest.raises(InputError, match=r"^hardware: expected valid TOML, got .*my.toml: "):
        sweep({"tokens": [8, 64]}, base, str(out), jobs=1, progress=False)
    assert main(["sweep", "--shape", "deepseek-v4-flash", "--ranks", "4", "--hardware", str(hw),
                 "--set", "tokens=8,64", "--out", str(out), "--jobs", "1"]) == 2
    assert capsys.readouterr().err.startswith(f"megamoe: error: hardware: expected valid TOML, got {hw}: ")
    assert (out / "points.jsonl").read_bytes() == log


def test_resume_key_holds_routing_and_policy_files(tmp_path):
    """A `file:` routing (each {rank} file too) and a policy .py file are in the key by content."""
    import numpy as np

    from sim.sweep import point_key

    rng = np.random.default_rng(0)

    def ids(hot):  # 16 tokens x top-6 distinct experts, `hot` experts in every token
        return np.stack([np.concatenate([np.arange(hot), rng.choice(np.arange(hot, 256), 6 - hot, replace=False)])
                         for _ in range(16)]).astype(np.int64)

    f = tmp_path / "ids.npy"
    np.save(f, np.stack([ids(0) for _ in range(4)]))
    base = {**BASE, "routing": f"file:{f}"}
    out = tmp_path / "sw"
    r1 = sweep({"reserved_sms": [0, 8]}, base, str(out), jobs=1, progress=False)
    np.save(f, np.stack([ids(6) for _ in range(4)]))  # every token on experts 0..5 (rank 0)
    r2 = sweep({"reserved_sms": [0, 8]}, base, str(out), jobs=1, progress=False)
    fresh = sweep({"reserved_sms": [0, 8]}, base, str(tmp_path / "fresh"), jobs=1, progress=False)
    assert [r["time_us"] for r in r2] == [r["time_us"] for r in fresh] != [r["time_us"] for r in r1]
    # {rank}: every rank's file counts
    for r in range(4):
        np.save(tmp_path / f"ids{r}.npy", ids(0))
    rb = {**BASE, "routing": f"file:{tmp_path}/ids{{rank}}.npy"}
    k1 = point_key({"tokens": 16}, rb)
    np.save(tmp_path / "ids3.npy", ids(6))
    assert point_key({"tokens": 16}, rb) != k1
    (tmp_path / "ids3.npy").unlink()
    assert point_key({"tokens": 16}, rb) != k1
    # a policy .py file, on the base or the policy axis
    pol = tmp_path / "pol.py"
    pol.write_text("class P:\n    def experts_per_wave(self, ctx):\n        return 2\n")
    k_axis, k_base = point_key({"policy": f"{pol}:P"}, BASE), point_key({"tokens": 4}, {**BASE, "policies": [f"{pol}:P"]})
    pol.write_text("class P:\n    def experts_per_wave(self, ctx):\n        return 4\n")
    assert point_key({"policy": f"{pol}:P"}, BASE) != k_axis
    assert point_key({"tokens": 4}, {**BASE, "policies": [f"{pol}:P"]}) != k_base
    # built-in names and presets: stable keys
    assert point_key({"policy": "fixed-waves:2"}, BASE) == point_key({"policy": "fixed-waves:2"}, BASE)


def _corrupt(lines):
    """Corruptions of a two-point log: (bytes, the message's end)."""
    row0 = json.loads(lines[0])
    no_time = {k: v for k, v in row0.items() if k != "time_us"}
    good = "\n".join(lines).encode() + b"\n"
    return [
        (good[:100], "line 1: not JSON, e.g. cut off (Unterminated string starting at, column "),
        (good + b'{"a": 1}\n', "line 3: no _key"),
        (good + b"[1, 2]\n", "line 3: a JSON array, not an object"),
        (good + b"\xff\n", "line 3: byte 0xff at column 1 is not UTF-8"),
        ((json.dumps(no_time) + "\n" + lines[1] + "\n").encode(), "line 1: no time_us"),
        ((lines[0] + "\n" + json.dumps({**json.loads(lines[1]), "time_us": "x"}) + "\n").encode(),
         'line 2: time_us "x" is not a number'),
        ((lines[0] + "\n" + json.dumps({**json.loads(lines[1]), "time_us": float("nan")}) + "\n").encode(),
         "line 2: time_us NaN is not a finite number >= 0"),
        ((lines[0] + "\n" + json.dumps({**json.loads(lines[1]), "time_us": -5}) + "\n").encode(),
         "line 2: time_us -5 is not a finite number >= 0"),
    ]


def test_corrupt_log_is_one_error_naming_the_line(tmp_path, capsys):
    """A cut-off, non-object, non-UTF-8 or incomplete line in points.jsonl used to crash with a
    traceback (JSONDecodeError, KeyError, TypeError, UnicodeDecodeError): now one InputError
    naming the file and the line, exit 2, nothing changed; --no-resume starts over."""
    out = tmp_path / "c"
    cmd = ["sweep", "--shape", "deepseek-v4-flash", "--ranks", "4", "--set", "tokens=4,8", "--out", str(out),
           "--jobs", "1"]
    assert main(cmd) == 0
    lines = (out / "points.jsonl").read_text().splitlines()
    csv_before = (out / "results.csv").read_bytes()
    capsys.readouterr()
    log = out / "points.jsonl"
    prefix = (f"{log}: expected one JSON object per line as megamoe sweep writes it (delete or fix the line, "
              "or rerun with --no-resume to start the log over), got ")
    for data, what in _corrupt(lines):
        log.write_bytes(data)
        assert main(cmd) == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and err[0].startswith("megamoe: error: " + prefix + what), err
        assert log.read_bytes() == data and (out / "results.csv").read_bytes() == csv_before
        with pytest.raises(InputError, match="^" + re.escape(prefix + what)):
            sweep({"tokens": [4, 8]}, {**BASE}, str(out), jobs=1, progress=False)
    assert main([*cmd, "--no-resume"]) == 0
    assert len(log.read_text().splitlines()) == 2


def test_failed_sweep_leaves_the_log_byte_for_byte(tmp_path):
    """A sweep with no valid point (fixed-waves:1000) appended its error row to an existing
    points.jsonl: invalid points are not journaled now (recomputed on each run)."""
    out = tmp_path / "sr"
    sweep({"tokens": [4, 8]}, BASE, str(out), jobs=1, progress=False)
    log = (out / "points.jsonl").read_bytes()
    csv_before = (out / "results.csv").read_bytes()
    with pytest.raises(InputError, match=r"^sweep: expected at least one valid point, got none \(policy "
                                         r"fixed-waves:1000: expected N in \[1, "):
        sweep({"tokens": [4, 8], "policy": ["fixed-waves:1000"]}, BASE, str(out), jobs=1, progress=False)
    assert (out / "points.jsonl").read_bytes() == log and (out / "results.csv").read_bytes() == csv_before
    # a sweep with valid and invalid points journals only the valid ones, and returns both
    rows = sweep({"tokens": [4], "experts_per_wave": [1, 999]}, BASE, str(out), jobs=1, progress=False)
    assert [bool(r["error"]) for r in rows] == [False, True]
    logged = [json.loads(x) for x in (out / "points.jsonl").read_text().splitlines()]
    assert len(logged) == 3 and all(r["error"] == "" for r in logged)
    again = sweep({"tokens": [4], "experts_per_wave": [1, 999]}, BASE, str(out), jobs=1, progress=False)
    assert again == rows and len((out / "points.jsonl").read_text().splitlines()) == 3


def test_log_without_its_last_newline_fifo_log_and_bad_out_names(tmp_path, capsys):
    """A log cut short of its last newline gets one before the next row (rows used to be glued
    into one line); a FIFO as the log is refused (it blocked forever); an empty or over-long
    --out name is refused before any point runs."""
    out = tmp_path / "e"
    assert main(["sweep", "--shape", "deepseek-v4-flash", "--set", "tokens=4", "--out", str(out), "--jobs", "1"]) == 0
    log = out / "points.jsonl"
    log.write_bytes(log.read_bytes()[:-1])
    assert main(["sweep", "--shape", "deepseek-v4-flash", "--set", "tokens=4,8", "--out", str(out), "--jobs", "1"]) == 0
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["tokens"] for r in rows] == [4, 8]
    fifo_dir = tmp_path / "f"
    fifo_dir.mkdir()
    os.mkfifo(fifo_dir / "points.jsonl")
    capsys.readouterr()
    assert main(["sweep", "--shape", "deepseek-v4-flash", "--set", "tokens=4", "--out", str(fifo_dir), "--jobs", "1"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"megamoe: error: {fifo_dir / 'points.jsonl'}: expected a regular file as the resume log (or rerun with "
        "--no-resume), got not a regular file"]
    for name, msg in (("", "expected a folder (existing or new), got an empty path"),
                      (str(tmp_path / ("d" * 300)), "expected folder names of at most 255 bytes, got one of 300 bytes")):
        with pytest.raises(SystemExit) as e:
            main(["sweep", "--shape", "deepseek-v4-flash", "--set", "tokens=4", "--out", name])
        assert e.value.code == 2 and capsys.readouterr().err.splitlines()[-1] == f"megamoe: error: --out: {msg}"


def test_ctrl_c_on_a_multi_worker_sweep_is_one_line(tmp_path):
    """Ctrl-C (SIGINT to the process group) during a 2-worker sweep: exit 130, one line, no
    worker traceback, and the parent does not wait for the queued points (workers used to
    print a KeyboardInterrupt traceback each)."""
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "s"
    code = ("import signal; signal.signal(signal.SIGINT, signal.default_int_handler); from megamoe.cli import main; "
            f"raise SystemExit(main(['sweep', '--shape', 'deepseek-v4-flash', '--set', 'seed=0:3000', '--jobs', '2', "
            f"'--out', {str(out)!r}]))")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         start_new_session=True)
    log = out / "points.jsonl"
    t0 = time.time()
    while not (log.exists() and log.read_text().count("\n") >= 1) and time.time() - t0 < 120:
        time.sleep(0.2)
    os.killpg(p.pid, signal.SIGINT)
    err = p.communicate(timeout=60)[1].decode()
    assert p.returncode == 130 and err.splitlines() == ["megamoe: interrupted"], err
    assert 1 <= log.read_text().count("\n") < 3001


def test_the_integer_axes_ranges_are_the_scenarios():
    """Each integer axis's up-front range (INT_AXIS_FLOOR / CEILING / CHOICES) against Scenario
    itself: the floor is accepted and one below it refused by the Scenario (so the sweep refuses
    only what no grid point could take), on a small SM90 one-rank call where every axis applies."""
    from megamoe.scenario import Scenario
    from sim.sweep import INT_AXES, INT_AXIS_CEILING, INT_AXIS_CHOICES, INT_AXIS_FLOOR, SCENARIO_AXES

    base = dict(shape="deepseek-v4-flash", num_ranks=1, tokens_per_rank=16, design="megamoe-sm90", hardware="h200")
    field = {**SCENARIO_AXES, "max_tokens": "max_tokens_per_rank"}
    for axis in sorted(INT_AXES):
        lo = INT_AXIS_FLOOR.get(axis, 1)
        if axis == "ranks":
            continue  # one rank fixed here; >= 1 is checked alone below
        ok = INT_AXIS_CHOICES.get(axis, (lo,))[0]
        kw = {**base, field[axis]: ok}
        if axis == "max_tokens":
            kw["tokens_per_rank"] = 1  # tokens <= max_tokens
        Scenario(**kw)  # the floor (or first choice) is a valid scenario field value (the design
        # may still refuse it at some points: block_m 1, say, is each point's own error)
        with pytest.raises(InputError):
            Scenario(**{**base, field[axis]: lo - 1})
        if axis in INT_AXIS_CEILING:
            hi = INT_AXIS_CEILING[axis]
            with pytest.raises(InputError):
                Scenario(**{**base, field[axis]: hi + 1, **({"max_tokens_per_rank": hi + 1} if axis == "tokens" else {})})
    with pytest.raises(InputError):
        Scenario(**{**base, "num_ranks": 0})


def test_a_block_m_no_design_of_the_sweep_takes_is_refused_up_front(tmp_path):
    """block_m=17 made every point invalid, one simulation after another (session 48's left-alone
    list): a value no design of the sweep takes is refused before anything runs or is written; one
    that only some designs take stays each point's own error. The designs' choices: the SM100 block
    table (16, 32, 64, 96, 128, 192) and the SM90 kernel's instances (16, 32, 64, 128)."""
    from megamoe.errors import InputError
    from megamoe.plan import block_m_choices

    assert block_m_choices("deepgemm-sm100") == (16, 32, 64, 96, 128, 192)
    assert block_m_choices("megamoe-sm90") == (16, 32, 64, 128)
    base = {"shape": "deepseek-v4-flash", "num_ranks": 1, "tokens_per_rank": 4}
    out = tmp_path / "s"
    with pytest.raises(InputError, match=r"^sweep.block_m: expected values a design of the sweep takes "
                                         r"\(deepgemm-sm100: 16, 32, 64, 96, 128, 192\), got 17$"):
        sweep({"block_m": [16, 17]}, base, str(out), jobs=1, progress=False)
    with pytest.raises(InputError, match=r"^sweep.block_m: expected values a design of the sweep takes "
                                         r"\(megamoe-sm90: 16, 32, 64, 128\), got 96, 192$"):
        sweep({"block_m": [16, 96, 192]}, {**base, "design": "megamoe-sm90"}, str(out), jobs=1, progress=False)
    assert not out.exists()
    rows = sweep({"design": ["megamoe-sm90", "deepgemm-sm100"], "block_m": [16, 96]}, base, str(out), jobs=1,
                 progress=False)
    assert [(r["design"], r["block_m"], r["time_us"] is None) for r in rows] == [
        ("megamoe-sm90", 16, False), ("megamoe-sm90", 96, True), ("deepgemm-sm100", 16, False),
        ("deepgemm-sm100", 96, False)]


def test_cli_sweep_prints_the_fastest_points_and_the_plans_own_choice(tmp_path, capsys):
    """A sweep of plan decisions prints its points fastest first and the plan's own choice of the same
    call, simulated once (the same time as ``simulate`` gives), with how many points beat it; a sweep
    over the work itself (tokens) lists its points in the grid's order, unranked, with no such line.
    A second sweep into the same folder says it replaced the first one's results."""
    from megamoe.scenario import Scenario
    from sim import simulate
    from sim.sweep import fastest

    args = ["--shape", "deepseek-v4-flash", "--ranks", "1", "--tokens", "16", "--hardware", "h200",
            "--design", "megamoe-sm90", "--jobs", "1"]
    assert main(["sweep", *args, "--set", "block_m=16,32,64", "--out", str(tmp_path / "a")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    rows = [json.loads(x) for x in (tmp_path / "a" / "points.jsonl").read_text().splitlines()]
    times = sorted(r["time_us"] for r in rows)
    assert [r["time_us"] for r in fastest(rows)] == times and "the fastest 3 of 3 points" in out
    assert out.index(f"{times[0]:.1f}") < out.index(f"{times[1]:.1f}") < out.index(f"{times[2]:.1f}")
    own = simulate(Scenario(shape="deepseek-v4-flash", num_ranks=1, tokens_per_rank=16, hardware="h200",
                            design="megamoe-sm90"))
    n = sum(t < own.summary["time_us"] for t in times)
    assert (f"the plan's own choice (block_m {own.plan.ranks[0].config.block_m}, experts_per_wave "
            f"{own.plan.ranks[0].experts_per_wave} on rank 0): {own.summary['time_us']:.1f} us; {n} of the 3 valid "
            f"points {'is' if n == 1 else 'are'} faster") in out
    assert "an earlier sweep's replaced" not in out
    assert main(["sweep", *args[:4], *args[6:], "--set", "tokens=64,4", "--out", str(tmp_path / "a")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "the first 2 valid of 2 points (grid order)" in out and "plan's own choice" not in out
    assert out.index("│ 64 │") < out.index("│ 4 │")
    assert "results.csv and the plots there now hold this grid's points, an earlier sweep's replaced" in out


def test_plot_titles_name_what_the_sweep_held_fixed():
    """fixed_title: the shape, ranks, tokens per rank, hardware and design no axis varies (the
    Scenario's defaults where the base leaves them out; no tokens where a routing file decides)."""
    from sim.sweep import fixed_title

    base = {"shape": "deepseek-v4-flash", "num_ranks": 1, "tokens_per_rank": 64, "hardware": "h200",
            "design": "megamoe-sm90"}
    assert fixed_title(base, ["block_m"]) == "deepseek-v4-flash, EP1, 64 tokens/rank, h200, megamoe-sm90"
    assert fixed_title(base, ["tokens", "hardware"]) == "deepseek-v4-flash, EP1, megamoe-sm90"
    assert fixed_title({"tokens_per_rank": None}, ["seed"]) == "deepseek-v4-pro, EP8, b200, deepgemm-sm100"


def test_an_sm90_only_axis_without_that_design_is_refused_up_front(tmp_path):
    """wgmma_n_step, and k_split above 1, are modelled for design megamoe-sm90 only: in a sweep none of
    whose designs is it, every point would be invalid (each ran to its error, then the sweep refused
    with two lines of output; fresh-user report, session 51). Refused before any point runs or the
    folder is made; with megamoe-sm90 among the designs each point decides."""
    from sim.sweep import check_design_only_axes

    out = tmp_path / "out"
    with pytest.raises(InputError, match=r"^sweep.wgmma_n_step: expected design megamoe-sm90 among the sweep's "
                                         r"designs \(it is modelled for that design only; the sweep's: "
                                         r"deepgemm-sm100\), got 8, 16$"):
        sweep({"wgmma_n_step": [8, 16]}, BASE, str(out), progress=False)
    with pytest.raises(InputError, match=r"^sweep.k_split: expected design megamoe-sm90 .* got 2$"):
        sweep({"k_split": [1, 2]}, BASE, str(out), progress=False)
    assert not out.exists()
    check_design_only_axes({"k_split": [1]}, BASE)  # no split: every design takes it
    check_design_only_axes({"wgmma_n_step": [8], "design": ["deepgemm-sm100", "megamoe-sm90"]}, BASE)
    check_design_only_axes({"wgmma_n_step": [8]}, {**BASE, "design": "megamoe-sm90"})


def test_a_row_records_the_effective_wgmma_n_step():
    """A point's row holds the step the plan ran (``wgmma_n_step_r0``): the asked one capped at the
    block's block_m, so a sweep's CSV does not claim a step no block could take (left alone in
    session 51, mended in 52). One rank at 8 tokens plans block_m 16 (the SM90 table's smallest)."""
    from sim.sweep import run_point

    base = {"shape": "deepseek-v4-flash", "num_ranks": 1, "tokens_per_rank": 8, "design": "megamoe-sm90",
            "hardware": "h200"}
    asked_64 = run_point({"wgmma_n_step": 64}, base)
    asked_8 = run_point({"wgmma_n_step": 8}, base)
    unset = run_point({}, base)
    assert asked_64["error"] == asked_8["error"] == unset["error"] == ""
    assert asked_64["block_m_r0"] == 16
    assert (asked_64["wgmma_n_step_r0"], asked_8["wgmma_n_step_r0"], unset["wgmma_n_step_r0"]) == (16, 8, 16)
    # the capped step is the whole block: the same time as the kernel's own whole-block step
    assert asked_64["time_us"] == unset["time_us"]
