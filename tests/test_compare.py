"""megamoe compare: a trace against its own simulation, and a perturbed one."""

import json

import numpy as np
import pytest

from megamoe.cli import main
from megamoe.errors import InputError
from megamoe.scenario import Scenario
from megamoe.trace import COLUMNS, KIND, Trace
from sim import simulate
from sim.compare import compare_file, compare_traces
from sim.hardware import load_hardware


def _saved(tmp_path, **kw):
    sc = Scenario(shape="deepseek-v4-flash", num_ranks=2, tokens_per_rank=[96, 40], routing="zipf:0.8", **kw)
    res = simulate(sc)
    p = tmp_path / "t.npz"
    res.trace.save_npz(str(p))
    return p, res


def test_trace_roundtrip_keeps_meta_and_routing(tmp_path):
    p, res = _saved(tmp_path)
    t = Trace.load(str(p))
    assert t.meta["tokens_per_rank"] == [96, 40] and t.meta["source"] == "simulator"
    assert all((a == b).all() for a, b in zip(t.topk_idx, res.scenario.routing_ids()))
    assert all((t[c] == res.trace[c]).all() for c in t.cols)


def test_self_comparison_is_exact(tmp_path):
    p, res = _saved(tmp_path)
    report, _, _ = compare_file(str(p), load_hardware("b200"))
    assert report["makespan_error"] == pytest.approx(0.0, abs=1e-12)
    assert report["median_kind_error"] == pytest.approx(0.0, abs=1e-12)
    assert report["unmatched_measured"] == report["unmatched_simulated"] == 0


@pytest.mark.parametrize("kw", [
    dict(design="megamoe-sm90", hardware="h200", num_ranks=1, tokens_per_rank=64),  # two CTAs per SM (the plan's)
    dict(design="megamoe-sm90", hardware="h200", num_ranks=1, tokens_per_rank=64, routing="masked:1"),  # empty
    dict(design="megamoe-sm90", hardware="h200", num_ranks=1, tokens_per_rank=1, k_split=2),
    dict(design="megamoe-sm90", hardware="h200", num_ranks=1, tokens_per_rank=64, combine_relay=True),
    dict(num_ranks=2, tokens_per_rank=128, reserved_sms=100, l2_wait="pool_block"),
    dict(num_ranks=2, tokens_per_rank=128, num_stages=2),
    dict(num_ranks=2, tokens_per_rank=128, policies=["interleaved"]),
    dict(num_ranks=2, tokens_per_rank=128, policies=["block-m:64"]),
])
def test_a_what_if_trace_is_compared_with_its_own_scenario(tmp_path, kw):
    """A simulator trace of a call other than the default one (the plan's two CTAs per SM, reserved
    SMs, a stage count, a policy, split-K, the relay) is re-simulated as its meta records it, so
    the comparison with itself is exact; each of these read -67% to +67% when compare dropped the
    field (forty-sixth session)."""
    sc = Scenario(shape="deepseek-v4-flash", **kw)
    res = simulate(sc)
    p = tmp_path / "w.npz"
    res.trace.save_npz(str(p))
    report, _, again = compare_file(str(p))
    mine, theirs = sc.to_dict(), again.scenario.to_dict()
    assert all(theirs[k] == mine[k] for k in kw if k not in ("routing", "tokens_per_rank"))
    assert report["makespan_error"] == pytest.approx(0.0, abs=1e-12)


def test_a_trace_of_a_policy_of_ones_own_is_refused_by_name(tmp_path):
    from pathlib import Path

    spec = str(Path(__file__).resolve().parent.parent / "examples" / "my_policies.py") + ":MyWaves"
    res = simulate(Scenario(shape="deepseek-v4-flash", num_ranks=2, tokens_per_rank=64, policies=[spec]))
    p = tmp_path / "u.npz"
    res.trace.save_npz(str(p))
    with pytest.raises(InputError) as e:
        compare_file(str(p))
    assert e.value.field == "trace.meta.policies.wave" and e.value.got == "my-waves"
    # given back (compare --policy), the policy re-creates the call exactly
    report, _, again = compare_file(str(p), policies=[spec])
    assert report["makespan_error"] == pytest.approx(0.0, abs=1e-12)
    assert again.scenario.to_dict()["policies"] == {"wave": "my-waves"}


def test_simulate_says_a_trace_records_ones_own_policy_by_name(tmp_path, capsys):
    from pathlib import Path

    spec = str(Path(__file__).resolve().parent.parent / "examples" / "my_policies.py") + ":MyWaves"
    assert main(["simulate", "--shape", "deepseek-v4-flash", "--tokens", "64", "--ranks", "2", "--policy", spec,
                 "--trace-npz", str(tmp_path / "o.npz")]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (f"note: the trace records {spec} by name only: compare it "
                                                        f"with --policy {spec}")


def test_a_simulator_trace_keeps_its_hardware_figures(tmp_path):
    """A trace made on a hardware file records the figures, so moving or editing the file later
    changes nothing in its comparison (it read -21% after an edit of hbm_gbs, and could not be
    compared from another folder: fresh-user report)."""
    import shutil

    toml = tmp_path / "my.toml"
    shutil.copy(load_hardware("h200").path, toml)
    res = simulate(Scenario(shape="deepseek-v4-flash", num_ranks=1, tokens_per_rank=8, design="megamoe-sm90",
                            hardware=str(toml)))
    p = tmp_path / "h.npz"
    res.trace.save_npz(str(p))
    toml.write_text(toml.read_text().replace("\nhbm_gbs = ", "\nhbm_gbs = 1", 1))  # 4800 -> 14800
    assert load_hardware(str(toml)).hbm_gbs != res.hardware.hbm_gbs
    report, _, _ = compare_file(str(p))
    assert report["makespan_error"] == pytest.approx(0.0, abs=1e-12)
    toml.unlink()
    report, _, _ = compare_file(str(p))
    assert report["makespan_error"] == pytest.approx(0.0, abs=1e-12)


def test_a_simulator_trace_of_another_seed_is_remade_with_its_seed(tmp_path):
    """The seed draws the block jitter (and the routing, which the trace stores): a trace made with
    seed 5 is re-made exactly (it read -1.4% when compare simulated every trace at seed 0:
    fresh-user report), and a seed in meta that is not an integer >= 0 is refused by its key."""
    import dataclasses

    sc = Scenario(shape="deepseek-v4-flash", num_ranks=1, tokens_per_rank=12, design="megamoe-sm90", hardware="h200",
                  seed=5)
    res = simulate(sc)
    assert res.trace.makespan_ns != simulate(dataclasses.replace(sc, seed=0, topk_idx=sc.routing_ids())).trace.makespan_ns
    p = tmp_path / "s5.npz"
    res.trace.save_npz(str(p))
    report, _, sim_res = compare_file(str(p))
    assert sim_res.scenario.seed == 5 and report["makespan_error"] == pytest.approx(0.0, abs=1e-12)
    t = Trace.load(str(p))
    for bad in (-1, "5", 1.5):
        t.meta = {**t.meta, "seed": bad}
        t.save_npz(str(tmp_path / "bad.npz"))
        assert json.loads(str(np.load(tmp_path / "bad.npz")["meta_json"]))["seed"] == bad
        with pytest.raises(InputError, match=r"^trace\.meta\.seed: expected an integer >= 0"):
            compare_file(str(tmp_path / "bad.npz"))


def test_a_simulator_trace_of_an_older_model_is_refused_by_the_figure_it_lacks(tmp_path):
    """A simulator trace whose recorded figures lack one the model has since gained (block_jitter and
    sm90_pull_pair_ns came on 2026-12-05) was made by a model that no figure value re-makes: compare
    refuses it in one line naming the figure."""
    res = simulate(Scenario(shape="deepseek-v4-flash", num_ranks=1, tokens_per_rank=12, design="megamoe-sm90",
                            hardware="h200"))
    meta = res.trace.meta
    for gone in ("block_jitter", "sm90_pull_pair_ns"):
        figs = dict(meta["hardware_figures"])
        del figs[gone]
        res.trace.meta = {**meta, "hardware_figures": figs}
        p = tmp_path / f"old_{gone}.npz"
        res.trace.save_npz(str(p))
        with pytest.raises(InputError) as e:
            compare_file(str(p))
        assert str(e.value) == (f"trace.meta.hardware_figures.{gone}: expected a number (a trace of an older simulator, "
                                "made before this figure existed, cannot be re-made: simulate it again), got missing")


def test_a_policy_of_ones_own_named_like_a_built_in_is_caught_by_the_plan(tmp_path):
    """A policy class of one's own that calls itself "fixed-waves:4" but makes waves of one expert:
    compare would re-create the built-in and compare another call; the plan it makes differs from
    the recorded one, so it is refused, naming the plan's field; given with --policy it compares."""
    (tmp_path / "sneaky.py").write_text(
        "class Sneaky:\n    name = 'fixed-waves:4'\n    def experts_per_wave(self, ctx):\n        return 1\n")
    spec = f"{tmp_path / 'sneaky.py'}:Sneaky"
    res = simulate(Scenario(shape="deepseek-v4-flash", num_ranks=2, tokens_per_rank=64, policies=[spec]))
    p = tmp_path / "s.npz"
    res.trace.save_npz(str(p))
    with pytest.raises(InputError) as e:
        compare_file(str(p))
    assert e.value.field == "trace.meta.plan.experts_per_wave" and e.value.got == 1
    report, _, _ = compare_file(str(p), policies=[spec])
    assert report["makespan_error"] == pytest.approx(0.0, abs=1e-12)


def test_cli_compare_policy_in_place_of_the_traces_says_so(tmp_path, capsys):
    res = simulate(Scenario(shape="deepseek-v4-flash", num_ranks=2, tokens_per_rank=64))
    p = tmp_path / "d.npz"
    res.trace.save_npz(str(p))
    assert main(["compare", str(p), "--policy", "interleaved"]) == 0
    out = capsys.readouterr().out
    assert ("note: the trace records the policies none (the defaults); this run simulated it with "
            "{'scheduler': 'interleaved'}") in out


def test_faster_loads_show_up_as_negative_errors(tmp_path):
    p, res = _saved(tmp_path)
    hw = load_hardware("b200")
    # these small blocks (block_m 16) are load-bound: halve the TMA latency (Little's law)
    report, _, fast = compare_file(str(p), hw.scaled(tma_latency_ns=0.5))
    assert report["makespan_error"] < 0
    mma = report["kind_errors"]["l1_mma"]
    # the error is the median |d_sim/d_meas - 1| over matched K loops, computed
    # independently here from the two traces
    m, s = res.trace.where(kind="l1_mma", role="mma"), fast.trace.where(kind="l1_mma", role="mma")
    km = {(a, b, c, d, e): x for a, b, c, d, e, x in zip(m["rank"], m["sm"], m["expert"], m["m_block"], m["n_block"],
                                                        m["t_end_ns"] - m["t_start_ns"])}
    errs = [abs(y / km[(a, b, c, d, e)] - 1) for a, b, c, d, e, y in
            zip(s["rank"], s["sm"], s["expert"], s["m_block"], s["n_block"], s["t_end_ns"] - s["t_start_ns"])]
    assert mma["median"] == pytest.approx(float(np.median(errs))) and mma["median"] > 0.01


def test_cli_compare(tmp_path):
    p, _ = _saved(tmp_path)
    out, png = tmp_path / "r.json", tmp_path / "o.png"
    assert main(["compare", str(p), "--hardware", "b200", "--json", str(out), "--plot", str(png)]) == 0
    d = json.loads(out.read_text())
    assert "makespan_error" in d and "median_kind_error" in d and png.exists()


def test_bad_trace_files(tmp_path):
    bad = tmp_path / "x.npz"
    np.savez(bad, rank=np.zeros(1))
    with pytest.raises(InputError, match="^trace: expected columns"):
        Trace.load(str(bad))
    (tmp_path / "y.npz").write_text("not a zip")
    with pytest.raises(InputError, match=r"^trace: expected an \.npz trace file, got .*y\.npz \(ValueError: not a zip "
                                         r"archive, which an \.npz is\)$"):
        Trace.load(str(tmp_path / "y.npz"))
    assert main(["compare", str(tmp_path / "y.npz")]) == 2


def test_corrupt_trace_contents_are_refused(tmp_path):
    """A trace whose meta is not JSON, whose role / kind codes are outside the schema, or whose
    records end before they start is refused on load with the field named (compare would
    otherwise print NaN errors and exit 0)."""
    p, _ = _saved(tmp_path)
    z = dict(np.load(p, allow_pickle=False))

    def variant(name, **over):
        q = tmp_path / f"{name}.npz"
        np.savez(q, **{**z, **over})
        return str(q)

    with pytest.raises(InputError, match=r"^trace\.meta_json: expected a JSON object"):
        Trace.load(variant("meta", meta_json=np.array("not json")))
    with pytest.raises(InputError, match=r"^trace\.kind: expected codes 0\.\.\d+, got 99"):
        Trace.load(variant("kind", kind=np.full_like(z["kind"], 99)))
    with pytest.raises(InputError, match=r"^trace\.role: expected codes"):
        Trace.load(variant("role", role=np.full_like(z["role"], -1)))
    back = z["t_start_ns"] - 1.0
    with pytest.raises(InputError, match=r"^trace\.t_end_ns: expected t_end_ns >= t_start_ns .*record 0"):
        Trace.load(variant("back", t_end_ns=back))
    assert main(["compare", variant("meta2", meta_json=np.array("not json"))]) == 2


def test_compare_traces_counts_unmatched():
    res = simulate(Scenario(shape="deepseek-v4-flash", num_ranks=1, tokens_per_rank=8))
    t = res.trace
    half = t.select(np.arange(len(t)) % 2 == 0)
    r = compare_traces(t, half, res.plan.num_sms)
    assert r["unmatched_measured"] > 0 and r["unmatched_simulated"] == 0


def test_milestones_by_hand():
    """Phase milestones on two hand-made traces (us from each one's first record): the last pull's
    end over every record, rank-level ones included; the median over units (rank, SM >= 0) of
    each unit's first L1 MMA; the last L1 MMA and L2 epilogue ends; the end."""
    # (rank, sm, role, kind, expert, m, n, wave, start, end, bytes, tokens); times in ns
    m = Trace.from_rows([
        (0, 0, "dispatch", "pull", -1, -1, -1, -1, 1000.0, 3000.0, 0, 0),
        (0, 1, "dispatch", "pull", -1, -1, -1, -1, 1000.0, 7000.0, 0, 0),
        (0, 0, "consumer", "l1_mma", 0, 0, 0, 0, 8000.0, 9000.0, 0, 0),
        (0, 0, "consumer", "l1_mma", 0, 0, 1, 0, 9500.0, 12000.0, 0, 0),   # not SM 0's first
        (0, 1, "consumer", "l1_mma", 1, 0, 0, 0, 10000.0, 11000.0, 0, 0),
        (0, 2, "consumer", "l1_mma", 2, 0, 0, 0, 15000.0, 16000.0, 0, 0),
        (0, 2, "consumer", "l2_epilogue", 2, 0, 0, 0, 20000.0, 21000.0, 0, 0),
        (0, 0, "dispatch", "combine", -1, -1, -1, -1, 22000.0, 23000.0, 0, 0),
    ])
    s = Trace.from_rows([
        (0, -1, "dispatch", "count", -1, -1, -1, -1, 0.0, 500.0, 0, 0),
        (0, -1, "dispatch", "pull", -1, -1, -1, -1, 500.0, 4500.0, 0, 0),        # rank-level
        (0, 0, "consumer", "l1_mma", 0, 0, 0, 0, 6000.0, 7000.0, 0, 0),
        (0, 1, "consumer", "l1_mma", 1, 0, 0, 0, 6500.0, 8000.0, 0, 0),
        (0, 1, "consumer", "l2_mma", 1, 0, 0, 0, 8000.0, 9000.0, 0, 0),
    ])
    r = compare_traces(m, s, 4)["milestones"]
    # measured: origin 1000 ns; first L1 MMAs per unit 8000, 10000, 15000 -> median 10000
    assert r["pulls_end"] == {"measured_us": 6.0, "simulated_us": 4.5}
    assert r["first_l1_mma"] == {"measured_us": 9.0, "simulated_us": 6.25}   # median of 6000, 6500
    assert r["l1_mma_end"] == {"measured_us": 15.0, "simulated_us": 8.0}
    assert r["l2_epilogue_end"] == {"measured_us": 20.0, "simulated_us": None}  # no L2 epilogue simulated
    assert r["end"] == {"measured_us": 22.0, "simulated_us": 9.0}


def _variant(tmp_path, z, name, drop=(), **over):
    q = tmp_path / f"{name}.npz"
    np.savez(q, **{k: v for k, v in {**z, **over}.items() if k not in drop})
    return str(q)


def _compare_line(path, capsys):
    rc = main(["compare", path])
    return rc, capsys.readouterr().err.strip().splitlines()


def test_nonfinite_empty_and_out_of_range_traces_are_refused(tmp_path, capsys):
    """NaN / inf times (NaN passed the t_end < t_start check), no records, ranks outside meta's
    num_ranks, SMs below -1 or beyond the device's: one line naming the column, exit 2 (compare
    used to exit 0 printing NaN or a nonsense report)."""
    p, _ = _saved(tmp_path)
    z = dict(np.load(p, allow_pickle=False))
    t = z["t_start_ns"].copy()
    t[3] = np.nan
    nan = _variant(tmp_path, z, "nan", t_start_ns=t)
    t = z["t_end_ns"].copy()
    t[5] = np.inf
    inf = _variant(tmp_path, z, "inf", t_end_ns=t)
    empty = _variant(tmp_path, z, "empty", **{c: z[c][:0] for c in COLUMNS})
    r = z["rank"].copy()
    r[2] = 7
    rank = _variant(tmp_path, z, "rank", rank=r)
    s = z["sm"].copy()
    s[4] = -3
    sm_neg = _variant(tmp_path, z, "smneg", sm=s)
    s = z["sm"].copy()
    s[4] = 500
    sm_big = _variant(tmp_path, z, "smbig", sm=s)
    meta = json.loads(str(z["meta_json"]))
    sm_meta = _variant(tmp_path, z, "smmeta", sm=s, meta_json=np.array(json.dumps({**meta, "num_sms": 132})))
    flat = _variant(tmp_path, z, "flat", t_start_ns=np.zeros_like(t), t_end_ns=np.zeros_like(t))
    no_ranks = _variant(tmp_path, z, "noranks", meta_json=np.array(json.dumps({**meta, "num_ranks": 0})))
    cases = [
        (nan, "trace.t_start_ns: expected finite times (ns) in every record, got record 3: nan"),
        (inf, "trace.t_end_ns: expected finite times (ns) in every record, got record 5: inf"),
        (empty, "trace: expected at least one record, got 0 records"),
        (rank, "trace.rank: expected values in [0, 2) (meta num_ranks = 2), got record 2: 7"),
        (sm_neg, "trace.sm: expected values >= -1, got record 4: -3"),
        (sm_meta, "trace.sm: expected values in [-1, 132) (meta num_sms = 132), got record 4: 500"),
        (no_ranks, "trace.meta.num_ranks: expected an integer >= 1, got 0"),
        (sm_big, "trace.sm: expected SM indices < 148 (hardware B200 has 148 SMs), got record 4: 500"),
        (flat, "trace: expected records spanning some time (a makespan > 0 ns), got a makespan of 0 ns"),
    ]
    for path, line in cases:
        assert _compare_line(path, capsys) == (2, [f"megamoe: error: {line}"]), path
    for path, line in cases[:7]:  # the file's own contents: refused on load already
        with pytest.raises(InputError) as e:
            Trace.load(path)
        assert str(e.value) == line


def test_bad_stored_routing_or_meta_is_refused(tmp_path, capsys):
    """The routing a trace stores (topk_idx_<rank>) must be one [T, top_k] array of ids in
    [-1, E) per rank of meta, and meta's numbers integers: one line, exit 2 (ids beyond E used to
    be simulated or crash; a non-integer meta field was a traceback)."""
    p, _ = _saved(tmp_path)
    z = dict(np.load(p, allow_pickle=False))
    meta = json.loads(str(z["meta_json"]))
    ids = z["topk_idx_0"].copy()
    ids[0, 0] = 999
    cases = [
        (_variant(tmp_path, z, "ids", topk_idx_0=ids),
         "trace.topk_idx_0: expected ids in [-1, 256), got ids in [0, 999]"),
        (_variant(tmp_path, z, "shape", topk_idx_1=z["topk_idx_1"][:, :3]),
         "trace.topk_idx_1: expected shape [T, 6], got shape [40, 3]"),
        (_variant(tmp_path, z, "missing", drop=("topk_idx_1",)),
         "trace.topk_idx: expected 2 arrays topk_idx_0 .. topk_idx_1 (meta num_ranks), got 1 array"),
        (_variant(tmp_path, z, "gap", drop=("topk_idx_1",), topk_idx_5=z["topk_idx_1"]),
         "trace.topk_idx: expected arrays topk_idx_0 .. topk_idx_<R-1> (one per rank), got topk_idx_5 among 2 arrays"),
        (_variant(tmp_path, z, "topk", meta_json=np.array(json.dumps({**meta, "top_k": "six"}))),
         "trace.meta.top_k: expected an integer, got six"),
        (_variant(tmp_path, z, "nohidden", meta_json=np.array(json.dumps({k: v for k, v in meta.items() if k != "hidden"}))),
         "trace.meta.hidden: expected an integer, got missing"),
        (_variant(tmp_path, z, "hw", meta_json=np.array(json.dumps({**meta, "hardware": 5}))),
         "trace.meta.hardware: expected a string, got 5"),
        # (without recorded figures, as a kernel trace: the name must resolve)
        (_variant(tmp_path, z, "hwname", meta_json=np.array(json.dumps(
            {**{k: v for k, v in meta.items() if k != "hardware_figures"}, "hardware": "h300"}))),
         "trace.meta.hardware: expected a preset (b200, h100, h20, h200) or a .toml path, got h300"),
        (_variant(tmp_path, z, "hwfig", meta_json=np.array(json.dumps(
            {**meta, "hardware_figures": {**meta["hardware_figures"], "hbm_gbs": -1}}))),
         "trace.meta.hardware_figures.hbm_gbs: expected a number in [200, 100000] (GB/s), got -1"),
        (_variant(tmp_path, z, "hwfigs", meta_json=np.array(json.dumps({**meta, "hardware_figures": [1, 2]}))),
         "trace.meta.hardware_figures: expected an object (figure -> number), got list"),
        (_variant(tmp_path, z, "hwnull", meta_json=np.array(json.dumps({**meta, "hardware_figures": None}))),
         "trace.meta.hardware_figures: expected an object (figure -> number), got NoneType"),
        # a simulator trace's plan is made again and checked (an altered number is not fed back in)
        (_variant(tmp_path, z, "epw", meta_json=np.array(json.dumps(
            {**meta, "plan": {**meta["plan"], "experts_per_wave": meta["plan"]["experts_per_wave"] // 2}}))),
         f"trace.meta.plan.experts_per_wave: expected the value its scenario's plan takes again "
         f"({meta['plan']['experts_per_wave']}: the trace altered, or a policy of one's own named like a built-in? "
         f"give it: compare --policy FILE.py:Class), got {meta['plan']['experts_per_wave'] // 2}"),
        # a built-in's name under another kind: a policy of one's own
        (_variant(tmp_path, z, "kind", meta_json=np.array(json.dumps({**meta, "policies": {"wave": "wave-lag"}}))),
         "trace.meta.policies.wave: expected a built-in wave policy (wave-lag is a built-in scheduler policy: a "
         "policy of your own under its name? give it, compare --policy FILE.py:Class), got wave-lag"),
        (_variant(tmp_path, z, "floatrank", rank=z["rank"].astype(float)),
         "trace.rank: expected an integer column, got dtype float64"),
        (_variant(tmp_path, z, "bogus", meta_json=np.array(json.dumps({**meta, "shape": "bogus"}))),
         "trace.meta.shape: expected a preset name, an E,k,H,I string or 'custom', got bogus"),
        (_variant(tmp_path, z, "pro", meta_json=np.array(json.dumps({**meta, "shape": "deepseek-v4-pro"}))),
         "trace.meta.shape: expected a shape with meta's E,k,H,I = 256,6,4096,2048, "
         "got deepseek-v4-pro = 384,6,7168,3072"),
        (_variant(tmp_path, z, "toks", meta_json=np.array(json.dumps({**meta, "tokens_per_rank": "x"}))),
         "trace.meta.tokens_per_rank: expected the stored routing's token counts [96, 40], got x"),
        (_variant(tmp_path, z, "toks2", meta_json=np.array(json.dumps({**meta, "tokens_per_rank": [96, 41]}))),
         "trace.meta.tokens_per_rank: expected the stored routing's token counts [96, 40], got [96, 41]"),
        (_variant(tmp_path, z, "bm", meta_json=np.array(json.dumps({**meta, "plan": {**meta["plan"], "block_m": "16"}}))),
         "trace.meta.plan.block_m: expected an integer >= 1, got 16"),
        (_variant(tmp_path, z, "design", meta_json=np.array(json.dumps({**meta, "design": "bogus"}))),
         "trace.meta.design: expected deepgemm-sm100 or megamoe-sm90, got bogus"),
        (_variant(tmp_path, z, "maxtok", meta_json=np.array(json.dumps({**meta, "max_tokens_per_rank": 50}))),
         "trace.meta.tokens_per_rank: expected <= max_tokens (50), got 96"),
    ]
    for path, line in cases:
        assert _compare_line(path, capsys) == (2, [f"megamoe: error: {line}"]), path


def test_truncated_or_corrupt_trace_is_refused(tmp_path, capsys):
    """A truncated NPZ (no zip directory) and one whose member data is corrupt raise an
    InputError naming the trace, from Trace.load and from megamoe compare (exit 2, one line)."""
    p, _ = _saved(tmp_path)
    data = p.read_bytes()
    trunc = tmp_path / "trunc.npz"
    trunc.write_bytes(data[:5000])
    with pytest.raises(InputError, match=r"^trace: expected an \.npz trace file, got .*trunc\.npz "
                                         r"\(BadZipFile: File is not a zip file\)$"):
        Trace.load(str(trunc))
    assert main(["compare", str(trunc)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "trace: expected an .npz trace file" in err
    import zipfile

    with zipfile.ZipFile(p) as z:  # flip bytes inside the compressed data of one column
        info = z.getinfo("t_start_ns.npy")
    off = info.header_offset + 30 + len(info.filename) + len(info.extra) + 20
    bad = bytearray(data)
    bad[off:off + 64] = bytes(b ^ 0xFF for b in bad[off:off + 64])
    corrupt = tmp_path / "corrupt.npz"
    corrupt.write_bytes(bytes(bad))
    with pytest.raises(InputError, match=r"^trace: expected an \.npz trace file, got .*corrupt\.npz \((zlib\.error|"
                                         r"BadZipFile|EOFError)"):
        Trace.load(str(corrupt))


@pytest.mark.parametrize("path, msg", [
    (None, r"^trace: expected a path to an \.npz trace file, got None$"),
    (42, r"^trace: expected a path to an \.npz trace file, got 42$"),
])
def test_trace_load_path_type(path, msg):
    with pytest.raises(InputError, match=msg):
        Trace.load(path)


def test_trace_load_accepts_pathlike(tmp_path):
    p, res = _saved(tmp_path)
    assert len(Trace.load(p)) == len(res.trace)


_ROW = (0, 0, "mma", "l1_mma", 1, 0, 0, 0, 10.0, 20.0, 0, 0)


@pytest.mark.parametrize("rows, msg", [
    ([(0, 0, "bogus", *_ROW[3:])], r"^trace\.role: expected a role name \(dispatch, tma_a, tma_b, mma, epilogue, "
                                   r"producer, consumer\) or code 0\.\.6, got row 0: 'bogus'$"),
    ([_ROW, (0, 0, "mma", "nope", *_ROW[4:])], r"^trace\.kind: expected a kind name \(count, .*\) or code 0\.\.12, "
                                               r"got row 1: 'nope'$"),
    ([(0, 0, "mma", "pull")], r"^trace\.rows: expected rows of 12 values \(rank, sm, role, kind, expert, m_block, "
                              r"n_block, wave, t_start_ns, t_end_ns, bytes, tokens\), got row 0: 4 values$"),
    ([_ROW, 5], r"^trace\.rows: expected rows of 12 values .*got row 1: int$"),
    ([(0, 0, 99, *_ROW[3:])], r"^trace\.role: expected codes 0\.\.6, got row 0: 99$"),
    ([(0, 0, "mma", -1, *_ROW[4:])], r"^trace\.kind: expected codes 0\.\.12, got row 0: -1$"),
    ([("x", *_ROW[1:])], r"^trace\.rows: expected numbers in every column \(rank, .*\), got ValueError"),
    ([(0.5, *_ROW[1:])], r"^trace\.rank: expected integers in \[-2147483648, 2147483647\], got row 0: 0\.5$"),
    ([(*_ROW[:8], float("nan"), 1.0, 0, 0)], r"^trace\.t_start_ns: expected finite times \(ns\) in every record, "
                                             r"got row 0: nan$"),
    (np.zeros((2, 11)), r"^trace\.rows: expected an \[N, 12\] array .*got shape \[2, 11\]$"),
    (None, r"^trace\.rows: expected a list of rows or an \[N, 12\] array, got NoneType$"),
])
def test_trace_from_rows_refuses_bad_rows(rows, msg):
    with pytest.raises(InputError, match=msg):
        Trace.from_rows(rows)


def test_trace_from_rows_names_and_codes():
    t = Trace.from_rows([_ROW, (1, -1, 0, 4, -1, -1, -1, -1, 0.0, 5.0, 1 << 40, 3)])
    assert t["role"].tolist() == [3, 0] and t["kind"].tolist() == [6, 4] and t["bytes"][1] == 1 << 40
    assert len(Trace.from_rows(np.asarray([(0, 0, 3, 6, 1, 0, 0, 0, 1.0, 2.0, 0, 0)], float))) == 1


def test_compare_traces_by_block_ignores_the_unit():
    """Blocks by ticket (two CTAs per SM): the same block on another CTA is the same work. Two
    blocks, swapped between CTAs 0 and 1 and 10% / 30% slower in the 'simulated' trace: matched
    only by_block, with the per-kind errors of those two blocks (hand-computed)."""
    cols = ("rank", "sm", "role", "kind", "expert", "m_block", "n_block", "wave", "t_start_ns", "t_end_ns",
            "bytes", "tokens")
    assert cols == COLUMNS
    meas = Trace.from_rows([(0, 0, "consumer", "l1_mma", 3, 0, 1, 0, 0.0, 1000.0, 0, 16),
                            (0, 1, "consumer", "l1_mma", 5, 0, 2, 0, 0.0, 2000.0, 0, 16)])
    sim = Trace.from_rows([(0, 1, "consumer", "l1_mma", 3, 0, 1, 0, 0.0, 1100.0, 0, 16),
                           (0, 0, "consumer", "l1_mma", 5, 0, 2, 0, 0.0, 2600.0, 0, 16)])
    static = compare_traces(meas, sim, 2)
    assert static["matched_intervals"] == 0 and static["unmatched_block_work"] == 4
    r = compare_traces(meas, sim, 2, by_block=True)
    assert r["matched_intervals"] == 2 and r["unmatched_block_work"] == 0
    k = r["kind_errors"]["l1_mma"]
    assert k["matched"] == 2 and k["median"] == pytest.approx((0.1 + 0.3) / 2)


def test_kind_quantile_errors_compare_the_distributions():
    """The distribution metric (sim.compare.QUANTILES = 10/25/50/75/90): two l1_mma blocks swapped
    in duration between the sides (1000 / 3000 ns measured, 3000 / 1000 simulated) pair badly
    block by block (|3000/1000 - 1| = 2, |1000/3000 - 1| = 2/3: median 4/3) but have the same
    distribution (error 0). An l2_mma kind 20% slower everywhere reads 0.2 both ways. numpy's
    linear percentiles of (1000, 3000) are 1200 / 1500 / 2000 / 2500 / 2800."""
    rows_m = [(0, 0, "consumer", "l1_mma", 3, 0, 1, 0, 0.0, 1000.0, 0, 16),
              (0, 1, "consumer", "l1_mma", 5, 0, 2, 0, 0.0, 3000.0, 0, 16),
              (0, 0, "consumer", "l2_mma", 3, 0, 1, 0, 5000.0, 6000.0, 0, 16)]
    rows_s = [(0, 0, "consumer", "l1_mma", 3, 0, 1, 0, 0.0, 3000.0, 0, 16),
              (0, 1, "consumer", "l1_mma", 5, 0, 2, 0, 0.0, 1000.0, 0, 16),
              (0, 0, "consumer", "l2_mma", 3, 0, 1, 0, 5000.0, 6200.0, 0, 16)]
    r = compare_traces(Trace.from_rows(rows_m), Trace.from_rows(rows_s), 2)
    assert r["kind_errors"]["l1_mma"]["median"] == pytest.approx((2 + 2 / 3) / 2)
    assert r["kind_quantile_errors"]["l1_mma"] == pytest.approx(0.0)
    assert r["kind_quantile_errors"]["l2_mma"] == pytest.approx(0.2)
    assert r["median_kind_quantile_error"] == pytest.approx(0.1)  # median of (0, 0.2)
    # a 3000 ns block against the measured (1000, 3000): quantiles 3000 / (1200 .. 2800)
    one = compare_traces(Trace.from_rows(rows_m), Trace.from_rows([rows_s[0], rows_s[2]]), 2)
    want = np.median([3000 / q - 1 for q in (1200, 1500, 2000, 2500, 2800)])
    assert one["kind_quantile_errors"]["l1_mma"] == pytest.approx(want) == pytest.approx(0.5)


def test_overlay_lane_draws_the_simulators_rank_wide_records_on_every_sm():
    """The simulator keeps its count / pull / grid sync / combine records for the whole rank
    (sm = -1), the kernel one per CTA; the overlay used to draw only per-SM records, so the
    simulated lanes lacked those bars (noted in session 47). Hand-built four-record trace: SM 3's
    lane holds its own MMA and the rank-wide pull, SM 4's only the pull; idle waits are left out."""
    from sim.compare import overlay_lane

    cols = {c: np.zeros(4, dtype=np.int64) for c in COLUMNS}
    cols["sm"] = np.array([-1, 3, 3, 5])
    cols["kind"] = np.array([KIND["pull"], KIND["l1_mma"], KIND["idle_wait"], KIND["l1_mma"]])
    cols["t_start_ns"] = np.array([0, 2000, 1000, 2000])
    cols["t_end_ns"] = np.array([1500, 5000, 2000, 4000])
    t = Trace(cols)
    assert overlay_lane(t, 0, 3) == [("pull", 0.0, 1.5, True), ("l1_mma", 2.0, 3.0, False)]
    assert overlay_lane(t, 0, 4) == [("pull", 0.0, 1.5, True)]
    assert overlay_lane(t, 1, 3) == []  # another rank's lane
    # times count from the trace's first record, as compare's milestones do (a simulator trace
    # starts at its launch, a kernel trace at its first record)
    cols["t_start_ns"], cols["t_end_ns"] = cols["t_start_ns"] + 3000, cols["t_end_ns"] + 3000
    assert overlay_lane(Trace(cols), 0, 4) == [("pull", 0.0, 1.5, True)]
    # and each rank from its own first record: rank 1 launched 5 us late (a simulator trace's
    # launch skew; a kernel trace's rank clocks each start at their first record)
    two = {c: np.concatenate([v, v]) for c, v in cols.items()}
    two["rank"] = np.array([0] * 4 + [1] * 4)
    two["t_start_ns"][4:] += 5000
    two["t_end_ns"][4:] += 5000
    assert overlay_lane(Trace(two), 1, 3) == overlay_lane(Trace(two), 0, 3) == [("pull", 0.0, 1.5, True),
                                                                                ("l1_mma", 2.0, 3.0, False)]


def test_busy_fractions_take_the_union_of_a_units_intervals():
    """Hand-built: unit 0's producer has two loads in flight together ([0, 4] and [2, 6]: busy 6,
    not 8), unit 1 none of its own; a rank-wide producer record [8, 10] counts on both units. Over
    2 units x a 10-ns span: (6 + 2 + 2) / 20 = 0.5. Summing the durations read (8 + 4) / 20 = 0.6,
    and the default scenario's TMA roles summed past 1 and were capped there (fresh-user report,
    session 48)."""
    from megamoe.trace import ROLE
    from sim.metrics import busy_fractions

    cols = {c: np.zeros(4, dtype=np.int64) for c in COLUMNS}
    cols["sm"] = np.array([0, 0, -1, 1])
    cols["role"] = np.array([ROLE["producer"]] * 3 + [ROLE["consumer"]])
    cols["kind"] = np.array([KIND["l1_load"], KIND["l1_load"], KIND["pull"], KIND["idle_wait"]])
    cols["t_start_ns"] = np.array([0, 2, 8, 0])
    cols["t_end_ns"] = np.array([4, 6, 10, 10])
    got = busy_fractions(Trace(cols), 2, 10.0)
    assert got == {"producer": pytest.approx(0.5)}  # the consumer's only record is an idle wait


def test_balanced_time_spreads_a_roles_work_over_the_units():
    """Hand-built, one rank, 2 units: unit 0's consumer runs [10, 30] and [25, 40] (union 30),
    unit 1's [12, 20] (8) and an idle wait [0, 50] (not work); a producer record starts the
    trace at 0 and a dispatch record ends it at 50. Start 10, work (30 + 8) / 2 = 19, tail
    50 - 40 = 10: balanced 39 of a 50-ns makespan."""
    from megamoe.errors import InputError
    from megamoe.trace import ROLE
    from sim.metrics import balanced_time

    cols = {c: np.zeros(6, dtype=np.int64) for c in COLUMNS}
    cols["sm"] = np.array([0, 0, 1, 1, 0, 1])
    cols["role"] = np.array([ROLE["consumer"]] * 4 + [ROLE["producer"], ROLE["dispatch"]])
    cols["kind"] = np.array([KIND["l1_mma"], KIND["l1_epilogue"], KIND["l2_mma"], KIND["idle_wait"],
                             KIND["l1_load"], KIND["combine"]])
    cols["t_start_ns"] = np.array([10, 25, 12, 0, 0, 45])
    cols["t_end_ns"] = np.array([30, 40, 20, 50, 5, 50])
    tr = Trace(cols)
    assert balanced_time(tr, 2) == {"start_ns": 10.0, "work_ns": 19.0, "tail_ns": 10.0, "balanced_ns": 39.0,
                                    "makespan_ns": 50.0}
    # the producer's: start 0, work 5 / 2, tail 45
    assert balanced_time(tr, 2, "producer")["balanced_ns"] == 47.5
    for kw, field in (({"num_units": 0}, "num_units"), ({"num_units": 2.5}, "num_units"),
                      ({"num_units": 2, "role": "mma_warp"}, "role"), ({"num_units": 2, "role": "tma_a"}, "trace")):
        with pytest.raises(InputError, match=field):
            balanced_time(tr, **kw)
    cols["rank"] = np.array([0, 0, 0, 0, 1, 1])
    with pytest.raises(InputError, match="trace.rank"):
        balanced_time(Trace(cols), 2)


def test_balanced_time_of_a_kernel_trace_by_a_sweep_per_cta():
    """The committed 3-token kernel trace (264 CTAs): the consumers' work per CTA recomputed here
    CTA by CTA as the union of its records (a sweep over sorted starts), the start and tail
    from the records' extremes."""
    from megamoe.trace import ROLE
    from sim.compare import recorded_units
    from sim.metrics import balanced_time

    tr = Trace.load("benchmarks/traces/kernel_flash_ep1_t3.npz")
    units = recorded_units(tr, 0)
    got = balanced_time(tr, units)
    c = tr.where(role=ROLE["consumer"])
    c = c.select(c["kind"] != KIND["idle_wait"])
    total = 0.0
    for u in np.unique(c["sm"]).tolist():
        own = c.select(c["sm"] == u)
        end = -np.inf
        for a, b in sorted(zip(own["t_start_ns"].tolist(), own["t_end_ns"].tolist())):
            total += max(0.0, b - max(a, end))
            end = max(end, b)
    t0, t1 = tr["t_start_ns"].min(), tr["t_end_ns"].max()
    assert got["work_ns"] == pytest.approx(total / units, rel=1e-12)
    assert got["start_ns"] == c["t_start_ns"].min() - t0 and got["tail_ns"] == t1 - c["t_end_ns"].max()
    assert got["balanced_ns"] < got["makespan_ns"] == t1 - t0


def test_the_default_scenarios_busy_fractions_are_unions_at_most_one():
    """The default scenario (V4-Pro EP8 on B200): every role's busy fraction recomputed here per
    rank and unit as the union of its intervals (a sweep over sorted starts), at most 1."""
    from sim.metrics import busy_fractions

    res = simulate(Scenario())
    tr, units = res.trace, max(rp.num_sms for rp in res.plan.ranks)
    span = {r: float(res.rank_end_ns[r]) for r in range(res.plan.num_ranks)}
    got = busy_fractions(tr, units, span)
    for role, v in got.items():
        per_rank = []
        for r in range(res.plan.num_ranks):
            w = tr.where(rank=r, role=role)
            w = w.select(w["kind"] != KIND["idle_wait"])
            if not len(w):
                continue
            wide = w.select(w["sm"] < 0)
            total = 0.0
            for u in range(units):
                own = w.select(w["sm"] == u)
                iv = sorted(zip(np.r_[own["t_start_ns"], wide["t_start_ns"]].tolist(),
                                np.r_[own["t_end_ns"], wide["t_end_ns"]].tolist()))
                end = -np.inf
                for a, b in iv:
                    total += max(0.0, b - max(a, end))
                    end = max(end, b)
            per_rank.append(total / (units * span[r]))
        assert 0 < v <= 1 and v == pytest.approx(float(np.mean(per_rank)), rel=1e-9), role


def test_measured_busy_fractions_do_not_move_with_the_hardware(tmp_path):
    """A kernel trace's busy fractions are over its own CTAs (meta num_sms x plan.ctas_per_sm), not
    the simulated plan's units: compare on another preset read 0.12 / 0.52 / 0.59 for the 3-token
    trace's dispatch / producer / consumer instead of 0.13 / 0.58 / 0.66 (fresh-user report,
    session 48)."""
    from sim.compare import recorded_units

    p = "benchmarks/traces/kernel_flash_ep1_t3.npz"
    assert recorded_units(Trace.load(p), 7) == 264
    # a simulator trace: its hardware's SMs less the reserved ones, times its CTAs per SM
    res = simulate(Scenario(shape="deepseek-v4-flash", num_ranks=1, tokens_per_rank=12, design="megamoe-sm90",
                            hardware="h200", reserved_sms=4))
    sim_path = tmp_path / "s.npz"
    res.trace.save_npz(str(sim_path))
    assert recorded_units(Trace.load(str(sim_path)), 7) == 2 * 128 == res.plan.ranks[0].num_sms
    a, _, _ = compare_file(p)
    b, _, _ = compare_file(p, load_hardware("b200"))
    assert a["busy_fraction_measured"] == b["busy_fraction_measured"]
    # the report names what it simulated on, beside the scenario as recorded
    assert (a["hardware_simulated"], b["hardware_simulated"]) == ("H200", "B200")  # Hardware.name
    assert a["scenario"]["hardware"] == b["scenario"]["hardware"] == "h200"
    assert a["busy_fraction_simulated"] != b["busy_fraction_simulated"]


def test_streaming_bound_results_are_the_traces_recomputed(load_script):
    """``benchmarks/results/streaming_bound_h200.json`` is what ``benchmarks/streaming_bound.py``
    computes from the committed traces and benchmark now; at 1 token its t70 is recomputed by hand
    from the anchors' formula (6 touched experts x 1.5 H I + 6 routed rows x (H + 2 I + 2 H) bytes
    at 70% of the benchmark's copy bandwidth) and its K blocks from the shape, and each row's
    balanced time is its three parts."""
    sb = load_script("benchmarks/streaming_bound.py")
    rows, meta = sb.rows()
    saved = json.load(open("benchmarks/results/streaming_bound_h200.json"))
    assert saved == json.loads(json.dumps({"meta": meta, "rows": rows}))
    one = rows[0]
    H, I = 4096, 2048
    assert one["tokens"] == 1 and one["ctas"] == 132
    # 6 experts, each 32 L1 blocks of 32 K blocks and 32 L2 blocks of 16
    assert one["k_blocks"] == 6 * (2 * I // 128 * H // 128 + H // 128 * I // 128) == 9216
    assert one["t70_us"] == pytest.approx((6 * 1.5 * H * I + 6 * (H + 2 * I + 2 * H))
                                          / (0.7 * meta["copy_gbs_steady"] * 1e3), rel=1e-12)
    for r in rows:
        assert r["balanced_us"] == pytest.approx(r["start_us"] + r["work_us"] + r["tail_us"], rel=1e-12)
        assert r["start_us"] > 0 and r["tail_us"] > 0 and r["balanced_us"] < r["traced_makespan_us"]


def test_l2_traffic_rows_are_the_plan_and_benchmark_recomputed(load_script):
    """benchmarks/l2_traffic.py: the committed JSON is the script's output now; at 8192 tokens
    (block_m 128) a K block's stage brings 128 x 128 token bytes + 128 x 64 weight bytes + 512 B of
    weight scales + 128 x 8 B of token scales = 26112 B, every m block runs 32 x 32 L1 + 32 x 16 L2
    K blocks (V4-Flash), and the rate is the bytes over the benchmark's back-to-back time."""
    lt = load_script("benchmarks/l2_traffic.py")
    rows = lt.rows()
    saved = json.load(open("benchmarks/results/l2_traffic_h200.json"))["rows"]
    assert saved == json.loads(json.dumps(rows))
    r = next(x for x in rows if x["tokens"] == 8192)
    assert r["block_m"] == 128 and r["bytes_per_k_block"] == 128 * 128 + 128 * 64 + 512 + 128 * 8 == 26112
    assert r["k_blocks"] == r["m_blocks"] * (32 * 32 + 32 * 16)
    bench = json.load(open("benchmarks/results/kernel_h200_ep1_wgmma.json"))
    us = next(x["us_steady"] for x in bench["rows"] if x["impl"] == "megamoe_sm90" and x["tokens"] == 8192)
    assert r["l2_to_sm_tbs"] == pytest.approx(r["k_blocks"] * 26112 / (us * 1e-6) / 1e12, rel=1e-12)
    assert 0 < r["fill"] <= 1 and r["fill"] == pytest.approx(8192 * 6 / (r["m_blocks"] * 128), rel=1e-12)


def test_a_kernel_trace_is_simulated_at_the_wgmma_n_step_it_ran():
    """An SM90 kernel trace records its plan's WGMMA N step from kernel v9.12 on
    (``meta.plan.wgmma_n_step``); one without it (v9.11 and before, which ran every block whole) is
    simulated with whole blocks (step 128, capped at block_m), not at today's kernel step. A bad
    recorded step is named."""
    from pathlib import Path

    from sim.compare import scenario_from_meta

    traces = Path(__file__).resolve().parents[1] / "benchmarks/traces"
    old = Trace.load(str(traces / "kernel_flash_ep2_t8192.npz"))  # kernel v6.4: no step recorded
    assert "wgmma_n_step" not in old.meta["plan"] and old.meta.get("wgmma_n_step") is None
    assert scenario_from_meta(old).wgmma_n_step == 128
    t = Trace.load(str(traces / "kernel_flash_ep1_t4096.npz"))  # kernel v9.12 at block_m 128
    assert t.meta["plan"]["block_m"] == 128 and t.meta["plan"]["wgmma_n_step"] == 32
    assert scenario_from_meta(t).wgmma_n_step == 32
    t.meta["plan"]["wgmma_n_step"] = 12
    with pytest.raises(InputError, match=r"^trace.meta.plan.wgmma_n_step: expected a multiple of 8 from 8 to 128, "
                                         r"got 12$"):
        scenario_from_meta(t)


def test_whole_blocks_are_the_records_at_the_whole_block_m():
    """sim.calibrate.whole_blocks (the K-block fit's records): at block_m 128 and step 32 the
    records whose valid rows round up to 128 (97..128); with no recorded step every record."""
    from sim.calibrate import whole_blocks

    cols = {c: np.zeros(5, dtype=np.int64) for c in COLUMNS}
    cols["tokens"] = np.array([128, 97, 96, 33, 1])
    t = Trace(cols)
    t.meta = {"plan": {"block_m": 128, "wgmma_n_step": 32}}
    assert whole_blocks(t).tolist() == [True, True, False, False, False]
    t.meta = {"plan": {"block_m": 128}}
    assert whole_blocks(t).tolist() == [True] * 5
    t.meta = {"plan": {"block_m": 16, "wgmma_n_step": 16}}
    assert whole_blocks(t).tolist() == [True] * 5
