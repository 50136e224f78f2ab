"""Hardware files: every figure sourced, bad figures rejected with the field named."""

import dataclasses
import tomllib

import pytest

from megamoe.errors import InputError
from sim.hardware import PRESET_DIR, load_hardware, parse_hardware, preset_names


def test_presets_load_with_a_source_per_figure():
    assert preset_names() == ["b200", "h100", "h20", "h200"]
    for n in preset_names():
        hw = load_hardware(n)
        assert hw.num_sms in (148, 132, 78)
        data = tomllib.loads((PRESET_DIR / f"{n}.toml").read_text())
        assert set(data["figures"]) == set(data["sources"])


def test_measured_h200_figures_match_anchors():
    hw = load_hardware("h200")
    # megamoe calibrate on the lent H200 (2026-11-30): copy 4181 GB/s, FP8 GEMM 1419 TFLOP/s;
    # shared/anchors: copy 4.24 TB/s, FP8 GEMM 1424 TFLOP/s, P2P 385 GB/s of 450
    assert hw.hbm_bytes_per_ns == pytest.approx(4181.0, rel=0.001)
    assert hw.hbm_bytes_per_ns == pytest.approx(4240.0, rel=0.02)
    assert hw.fp8_dense_tflops * hw.mma_efficiency == pytest.approx(1424.0, rel=0.01)
    assert hw.nvlink_bytes_per_ns == pytest.approx(385.0, rel=0.01)


def test_h100_is_the_h200_fit_with_its_own_memory_and_gemm_figures():
    """sim/hardware/h100.toml (base = "h200"): its HBM and GEMM efficiencies are the copy and FP8
    GEMM rates of the committed H100 benchmark over the datasheet figures; every figure it does
    not give is the H200's, its source marked an estimate that names the H200."""
    import json

    h100, h200 = load_hardware("h100"), load_hardware("h200")
    bench = json.loads((PRESET_DIR.parent.parent / "benchmarks/results/kernel_h100_ep1_bench.json").read_text())
    assert "H100" in bench["device"]
    assert h100.hbm_bytes_per_ns == pytest.approx(bench["copy_gbs"], rel=1e-3)
    assert h100.fp8_dense_tflops * h100.mma_efficiency == pytest.approx(bench["fp8_gemm_tflops"], rel=1e-3)
    own = set(tomllib.loads((PRESET_DIR / "h100.toml").read_text())["figures"])
    assert own == {"num_sms", "clock_ghz", "l2_cache_bytes", "fp8_dense_tflops", "mma_efficiency", "hbm_gbs",
                   "hbm_efficiency"}
    for f in dataclasses.fields(h200):
        if f.name in ("name", "sources", "path", "arch") or f.name in own:  # arch: inherited, no source
            continue
        assert getattr(h100, f.name) == getattr(h200, f.name), f.name
        assert h100.is_estimate(f.name) and h100.sources[f.name] == (
            f"estimate: H200's figure (h200): {h200.sources[f.name]}"), f.name
    assert not any(h100.is_estimate(k) for k in own)
    assert h100.arch == h200.arch == "sm90"


def test_an_unknown_preset_is_named_as_typed_with_its_spaces_shown():
    """``--hardware h100x`` names the value as it is; ``' h100'`` (a stray space) quoted, so the
    space that made it unknown shows (it printed "got  h100": fresh-user report, session 49)."""
    for spec, got in (("h100x", "h100x"), (" h100", "' h100'"), ("h100 ", "'h100 '")):
        with pytest.raises(InputError, match=rf"^hardware: expected a preset \(b200, h100, h20, h200\) or a \.toml "
                                             rf"path, got {got}$"):
            load_hardware(spec)


def test_a_hardware_file_may_give_only_what_differs_from_a_preset(tmp_path):
    """``base = "h200"`` and one figure: the rest is the H200's (sources marked estimates); a source
    for a figure the file does not give is refused on ``hardware.sources``; a base that is no
    preset, not a string, or a chain that comes back on itself on ``hardware.base``."""
    p = tmp_path / "fast_hbm.toml"
    p.write_text('name = "H200, faster HBM"\nbase = "H200"\n[figures]\nhbm_gbs = 6000.0\n'
                 '[sources]\nhbm_gbs = "what-if"\n')
    hw, h200 = load_hardware(str(p)), load_hardware("h200")
    assert (hw.name, hw.hbm_gbs, hw.sources["hbm_gbs"]) == ("H200, faster HBM", 6000.0, "what-if")
    assert hw.hbm_efficiency == h200.hbm_efficiency and hw.is_estimate("hbm_efficiency")
    # docs/simulator/scenarios.md: this what-if leaves V4-Flash at 64 tokens (SM90 design) where the H200 has it
    from megamoe.scenario import Scenario
    from sim import simulate

    sc = dict(shape="deepseek-v4-flash", num_ranks=1, tokens_per_rank=64, design="megamoe-sm90")
    assert (simulate(Scenario(hardware=str(p), **sc)).summary["time_us"]
            == simulate(Scenario(hardware="h200", **sc)).summary["time_us"])
    # a source for an inherited figure would relabel it (fresh-user report, session 49)
    p.write_text('name = "x"\nbase = "h200"\n[figures]\nhbm_gbs = 6000.0\n[sources]\nhbm_gbs = "what-if"\n'
                 'sm90_pair_share = "fitted by me"\n')
    with pytest.raises(InputError, match=r"^hardware.sources: expected sources only for the figures this file gives "
                                         r"\(the others are H200's, sourced there\), got sm90_pair_share in "):
        load_hardware(str(p))
    for base, got in (('"nosuch"', "'nosuch'"), ("3", "3")):
        p.write_text(f'name = "x"\nbase = {base}\n[figures]\n[sources]\n')
        with pytest.raises(InputError, match=rf"^hardware.base: expected a preset name \(b200, h100, h20, h200\), "
                                             rf"got {got} in "):
            load_hardware(str(p))
    # a chain: h100 names h200; a document naming h100 whose base chain were to reach h100 again
    from sim.hardware import resolve_base
    with pytest.raises(InputError, match=r"^hardware.base: expected a chain of presets that does not come back "
                                         r"to one of them, got h100 -> h100$"):
        resolve_base({"name": "x", "base": "h100", "figures": {}, "sources": {}}, ("h100",))


def _data():
    return tomllib.loads((PRESET_DIR / "b200.toml").read_text())


def test_missing_figures_table_is_named():
    d = _data()
    del d["figures"]
    with pytest.raises(InputError, match=r"^hardware.figures: expected a \[figures\] table, got missing$"):
        parse_hardware(d)
    d["figures"] = 3
    with pytest.raises(InputError, match=r"^hardware.figures: expected a \[figures\] table, got int$"):
        parse_hardware(d)


def test_unknown_top_level_key_is_rejected():
    """A misspelt table ([figure] for [figures]) or a stray key was silently ignored."""
    d = _data()
    d["foo"] = 3
    with pytest.raises(InputError, match=r"^hardware: expected only name, arch, base, \[figures\] and \[sources\] at the "
                                         r"top level, got foo$"):
        parse_hardware(d)
    d = _data()
    d["figure"] = d["figures"]
    with pytest.raises(InputError, match=r"got figure$"):
        parse_hardware(d)


def test_negative_bandwidth_is_rejected():
    d = _data()
    d["figures"]["hbm_gbs"] = -1.0
    with pytest.raises(InputError, match=r"^hardware.figures.hbm_gbs: expected a number in \[200, 100000\] \(GB/s\), "
                                         r"got -1.0$"):
        parse_hardware(d)


def test_missing_source_is_rejected():
    d = _data()
    del d["sources"]["nvlink_gbs_per_direction"]
    with pytest.raises(InputError, match="hardware.sources.nvlink_gbs_per_direction"):
        parse_hardware(d)


def test_keys_of_no_figure_are_rejected_with_the_nearest_name():
    # a misspelt source key beside the right one would otherwise be carried silently
    d = _data()
    d["sources"]["hbm_gb_s"] = "a typo of hbm_gbs"
    d["sources"]["zz_extra"] = "another"
    with pytest.raises(InputError, match=r"^hardware.sources: expected figure names only \(sim.hardware.Hardware's "
                                         r"fields\), got hbm_gb_s \(did you mean hbm_gbs\?\), zz_extra$"):
        parse_hardware(d)
    # a misspelt figure is named as such, not reported as the right one missing (checked first)
    d = _data()
    d["figures"]["hbm_gsb"] = d["figures"].pop("hbm_gbs")
    with pytest.raises(InputError, match=r"^hardware.figures: expected figure names only \(sim.hardware.Hardware's "
                                         r"fields\), got hbm_gsb \(did you mean hbm_gbs\?\)$"):
        parse_hardware(d)


def test_a_figure_of_another_type_is_shown_as_the_file_spells_it():
    for v, got in ((True, "true"), ("4800", "'4800'")):
        d = _data()
        d["figures"]["hbm_gbs"] = v
        with pytest.raises(InputError, match=rf"^hardware.figures.hbm_gbs: expected a number, got {got}$"):
            parse_hardware(d)


def test_is_estimate_reads_the_source_in_any_case():
    hw = load_hardware("h200")
    for src, est in (("estimate: a guess", True), ("  Estimate, rounded", True), ("fitted to traces", False),
                     ("measured; an estimate before", False)):
        assert dataclasses.replace(hw, sources={**hw.sources, "hbm_gbs": src}).is_estimate("hbm_gbs") is est
    assert not hw.is_estimate("no_such_figure")


def test_empty_name_and_empty_source_are_rejected_and_shown():
    d = _data()
    d["name"] = " "
    with pytest.raises(InputError, match=r"^hardware.name: expected a non-empty string, got ' '$"):
        parse_hardware(d)
    d = _data()
    d["sources"]["hbm_gbs"] = ""
    with pytest.raises(InputError, match=r"^hardware.sources.hbm_gbs: expected a non-empty source string, got ''$"):
        parse_hardware(d)


def test_unknown_preset_and_bad_path(tmp_path):
    with pytest.raises(InputError, match="^hardware"):
        load_hardware("a100")
    p = tmp_path / "x.toml"
    p.write_text("name = 3\n")
    with pytest.raises(InputError, match=r"^hardware.name: expected a non-empty string, got 3 in .*x\.toml$"):
        load_hardware(str(p))
    p.write_text("")  # an empty file parses as an empty table: the message names the file too
    with pytest.raises(InputError, match=r"^hardware.name: expected a non-empty string, got missing in .*x\.toml$"):
        load_hardware(str(p))


def test_sm_count_is_bounded():
    """A hardware file's num_sms above MAX_SMS is refused up front (100 M SMs once took
    23 GB and 5 minutes before it was cut off); the plan refuses it too."""
    from megamoe.plan import MAX_SMS

    d = _data()
    d["figures"]["num_sms"] = MAX_SMS
    assert parse_hardware(d).num_sms == MAX_SMS
    d["figures"]["num_sms"] = MAX_SMS + 1
    with pytest.raises(InputError, match=rf"^hardware.figures.num_sms: expected an integer in \[2, {MAX_SMS}\], "
                                         rf"got {MAX_SMS + 1}"):
        parse_hardware(d)


@pytest.mark.parametrize("key,value,msg", [
    ("hbm_gbs", float("inf"), r"hardware.figures.hbm_gbs: expected a number in \[200, 100000\] \(GB/s\), got inf"),
    ("clock_ghz", float("inf"), r"hardware.figures.clock_ghz: expected a number in \[0.1, 10\] \(GHz\), got inf"),
    ("hbm_efficiency", float("nan"), r"hardware.figures.hbm_efficiency: expected a fraction in \[0.05, 1\], got nan"),
    ("smem_per_block_bytes", 1e30,
     r"hardware.figures.smem_per_block_bytes: expected an integer in \[16384, 4194304\] \(bytes\), got 1e\+30"),
    ("launch_ns", 1e300, r"hardware.figures.launch_ns: expected a number in \[0.01, 1000000\] \(ns\), got 1e\+300"),
    ("launch_ns", 1e12, r"hardware.figures.launch_ns: expected a number in \[0.01, 1000000\] \(ns\), got 1000000000000.0"),
    ("nvlink_gbs_per_direction", 1e-300,
     r"hardware.figures.nvlink_gbs_per_direction: expected a number in \[100, 100000\] \(GB/s\), got 1e-300"),
    ("hbm_gbs", 0.01, r"hardware.figures.hbm_gbs: expected a number in \[200, 100000\] \(GB/s\), got 0.01"),
    ("mma_efficiency", 1.5, r"hardware.figures.mma_efficiency: expected a fraction in \[0.05, 1\], got 1.5"),
    ("tma_latency_ns", 0, r"hardware.figures.tma_latency_ns: expected a number in \[0.01, 5000\] \(ns\), got 0"),
])
def test_figure_outside_its_range_is_one_line(key, value, msg):
    """Infinite, absurd or tiny figures used to pass (> 0 was the only check) and then print
    nonsense, overflow, or eat > 7 GB in the simulator: each is refused with its range."""
    d = _data()
    d["figures"][key] = value
    with pytest.raises(InputError, match="^" + msg + "$"):
        parse_hardware(d)


def test_every_preset_is_inside_the_ranges_and_valid_at_each_bound():
    """Every shipped preset loads; each of its figures (a derived preset's with its base's filled
    in) may sit at either end of its range (the file still loads) and just outside it is refused,
    naming the figure."""
    from sim.hardware import FIGURE_RANGES, resolve_base

    def read(n):
        return resolve_base(tomllib.loads((PRESET_DIR / f"{n}.toml").read_text()))

    for n in preset_names():
        base = read(n)
        assert parse_hardware(base).name == base["name"]
        for k, (lo, hi, _unit) in FIGURE_RANGES.items():
            assert lo <= base["figures"][k] <= hi, (n, k)
            for v in (lo, hi):
                d = read(n)
                d["figures"][k] = v
                assert getattr(parse_hardware(d), k) == v
            for v in (lo * 0.999 if lo > 0 else -1, hi * 1.001):
                d = read(n)
                d["figures"][k] = v
                with pytest.raises(InputError, match=rf"^hardware.figures.{k}: expected "):
                    parse_hardware(d)


def test_not_a_table_and_bad_sources_table():
    with pytest.raises(InputError, match=r"^hardware: expected a table \(name, \[figures\], \[sources\]\), got list$"):
        parse_hardware([])
    d = _data()
    d["sources"] = "datasheet"
    with pytest.raises(InputError, match=r"^hardware.sources: expected a \[sources\] table, got str$"):
        parse_hardware(d)


def test_non_utf8_file_is_one_line(tmp_path, capsys):
    from megamoe.cli import main

    bad = tmp_path / "b.toml"
    bad.write_bytes(b"\xff\xfe")
    with pytest.raises(InputError, match=rf"^hardware: expected a UTF-8 TOML file, got {bad} "
                                         r"\(byte 0xff at offset 0 is not UTF-8\)$"):
        load_hardware(str(bad))
    assert main(["simulate", "--hardware", str(bad)]) == 2
    out = capsys.readouterr()
    assert out.err.splitlines() == [f"megamoe: error: hardware: expected a UTF-8 TOML file, got {bad} "
                                    "(byte 0xff at offset 0 is not UTF-8)"]


def test_cli_simulate_with_an_out_of_range_figure_exits_2_with_one_line(tmp_path, capsys):
    from megamoe.cli import main

    bad = tmp_path / "bad.toml"
    bad.write_text((PRESET_DIR / "b200.toml").read_text().replace("hbm_gbs = 8000.0", "hbm_gbs = inf"))
    js = tmp_path / "out.json"
    assert main(["simulate", "--hardware", str(bad), "--tokens", "1", "--json", str(js)]) == 2
    out = capsys.readouterr()
    assert out.err.splitlines() == [
        f"megamoe: error: hardware.figures.hbm_gbs: expected a number in [200, 100000] (GB/s), got inf in {bad}"]
    assert not js.exists()


@pytest.mark.parametrize("factors,msg", [
    ({"hbm_gbs": 1e-6}, r"hardware.hbm_gbs scale: expected a factor that keeps hbm_gbs in \[200, 100000\] "
                        r"\(GB/s; B200 has 8000\), got 1e-06 \(hbm_gbs 0.008\)"),
    ({"hbm_gbs": 1e308}, r"hardware.hbm_gbs scale: expected a factor that keeps hbm_gbs in \[200, 100000\] "
                         r"\(GB/s; B200 has 8000\), got 1e\+308 \(hbm_gbs inf\)"),
    ({"launch_ns": 1e9}, r"hardware.launch_ns scale: expected a factor that keeps launch_ns in \[0.01, 1000000\] "
                         r"\(ns; B200 has 3000\), got 1000000000 \(launch_ns 3000000000000\)"),
    ({"smem_per_block_bytes": 1e-300}, r"hardware.smem_per_block_bytes scale: expected a factor that keeps "
                                       r"smem_per_block_bytes in \[16384, 4194304\] \(bytes; B200 has 232448\), "
                                       r"got 1e-300 \(smem_per_block_bytes 2.32448e-295\)"),
    ({"hbm_efficiency": 2}, r"hardware.hbm_efficiency scale: expected a factor that keeps hbm_efficiency in "
                            r"\[0.05, 1\] \(B200 has 0.85\), got 2 \(hbm_efficiency 1.7\)"),
    ({"hbm_gbs": float("inf")}, r"hardware.hbm_gbs scale: expected a finite number > 0, got inf"),
    ({"hbm_gbs": 0}, r"hardware.hbm_gbs scale: expected a finite number > 0, got 0"),
    ({"block_jitter": -1}, r"hardware.block_jitter scale: expected a finite number >= 0, got -1"),
    ({"num_sms": 2}, r"hardware.num_sms scale: expected a hardware figure other than num_sms, got num_sms"),
])
def test_scaled_figure_must_stay_in_range(factors, msg):
    hw = load_hardware("b200")
    with pytest.raises(InputError, match="^" + msg + "$"):
        hw.scaled(**factors)


def test_scaled_names_the_users_axis_and_keeps_types():
    hw = load_hardware("b200")
    with pytest.raises(InputError, match=r"^sweep.hbm_scale: expected a factor that keeps hbm_gbs in "):
        hw.scaled({"hbm_gbs": "sweep.hbm_scale"}, hbm_gbs=1e-6)
    s = hw.scaled(hbm_gbs=0.5, smem_per_block_bytes=0.5)
    assert s.hbm_gbs == 4000.0 and s.smem_per_block_bytes == 116224 and isinstance(s.smem_per_block_bytes, int)
    assert hw.block_jitter > 0 and hw.scaled(block_jitter=0).block_jitter == 0.0  # a figure that may be 0


def test_toml_suffix_is_case_blind(tmp_path, monkeypatch):
    """A hardware file named X.TOML (relative, no folder) loads like x.toml (output suffixes
    are case-blind too)."""
    (tmp_path / "MY.TOML").write_text((PRESET_DIR / "h200.toml").read_text())
    monkeypatch.chdir(tmp_path)
    assert load_hardware("MY.TOML").num_sms == load_hardware("h200").num_sms == 132


def test_arch_is_the_presets_family_inherited_and_checked(tmp_path):
    """``arch``: the Hopper presets are sm90 and the B200 sm100 (the H100 through its h200 base); a
    file on a base takes the base's unless it says its own; a value outside ARCHS (an empty string
    included) is refused naming the field; a file without one has ``arch`` "" and no base."""
    assert {n: load_hardware(n).arch for n in preset_names()} == {"b200": "sm100", "h100": "sm90", "h20": "sm90",
                                                                  "h200": "sm90"}
    d = _data()  # the b200 preset's document
    assert parse_hardware({k: v for k, v in d.items() if k != "arch"}).arch == ""
    for bad, got in (("sm80", "'sm80'"), ("", "''"), (90, "90"), ("SM90", "'SM90'")):
        with pytest.raises(InputError, match=rf"^hardware.arch: expected 'sm90' or 'sm100', got {got}$"):
            parse_hardware({**d, "arch": bad})
    f = tmp_path / "x.toml"
    f.write_text('name = "X"\nbase = "h200"\n[figures]\nhbm_gbs = 6000.0\n[sources]\nhbm_gbs = "what-if"\n')
    assert load_hardware(str(f)).arch == "sm90"
    f.write_text('name = "X"\nbase = "h200"\narch = "sm100"\n[figures]\nhbm_gbs = 6000.0\n[sources]\nhbm_gbs = "w"\n')
    assert load_hardware(str(f)).arch == "sm100"


def test_inherited_from_reads_back_resolve_bases_prefix():
    """inherited_from: for each figure the h100 preset takes from h200, the preset and the h200
    file's own source text; None for the h100's own figures and for a plain estimate."""
    from sim.hardware import inherited_from

    h100, h200 = load_hardware("h100"), load_hardware("h200")
    own = set(tomllib.loads((PRESET_DIR / "h100.toml").read_text())["figures"])
    for k, src in h100.sources.items():
        assert inherited_from(src) == (None if k in own else ("h200", h200.sources[k])), k
    assert inherited_from("estimate (same as B200)") is None
