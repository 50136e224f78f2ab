"""`megamoe` CLI: the main job runs, outputs are written, bad input -> one line, exit 2."""

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from megamoe.cli import main


def run(*args):
    p = subprocess.run([sys.executable, "-m", "megamoe.cli", *args], capture_output=True, text=True,
                       timeout=300)
    return p.returncode, p.stdout, p.stderr


def test_simulate_writes_json_trace_plot(tmp_path):
    j, tr, png = tmp_path / "s.json", tmp_path / "t.json", tmp_path / "t.png"
    rc = main(["simulate", "--shape", "deepseek-v4-flash", "--tokens", "64", "--ranks", "4",
               "--json", str(j), "--trace", str(tr), "--plot", str(png)])
    assert rc == 0
    d = json.loads(j.read_text())
    for key in ("time_us", "tflops", "hbm_gbs", "nvlink_gbs", "t_reduction_us", "overlap_efficiency",
                "speedup_vs_legacy", "plan", "scenario"):
        assert key in d
    assert d["scenario"]["tokens_per_rank"] == [64] * 4 and d["plan"]["num_ranks"] == 4
    assert d["plan"]["ranks"][0]["block_m"] == 16  # e = 64*4*6/256 = 6 -> block_m 16
    t = json.loads(tr.read_text())["traceEvents"]
    x = [e for e in t if e["ph"] == "X"]
    assert x and all(e["dur"] >= 0 for e in x) and {"pid", "tid", "ts", "name"} <= set(x[0])
    assert any(e["ph"] == "M" and e["name"] == "thread_name" for e in t)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_default_simulate_reports_the_table():
    rc, out, err = run("simulate")
    assert rc == 0, err
    assert "deepseek-v4-pro" in out and "EP8" in out and "speedup vs legacy" in out


@pytest.mark.parametrize("args,field", [
    (["--shape", "deepseek-v9"], "shape"),
    (["--shape", "4,6,256,256"], "shape.top_k"),
    (["--ranks", "5"], "ranks"),
    (["--tokens", "9000", "--max-tokens", "8192"], "tokens"),
    (["--shape", "8,2,200,256"], "shape.hidden"),
    (["--shape", "8,2,256,100"], "shape.intermediate"),
    (["--routing", "bogus"], "routing"),
    (["--hardware", "a100"], "hardware"),
    (["--experts-per-wave", "0"], "--experts-per-wave"),
    (["--seed", "-1"], "--seed"),
    (["--ranks", "0"], "--ranks"),
    (["--json", "/nonexistent-dir/o.json"], "--json"),
    (["--plot", "p.txt"], "--plot"),
    (["--trace-sms", "0"], "--trace-sms"),
    (["--block-m", "48"], "block_m"),
    (["--k-split", "2"], "k_split: expected 1 with design deepgemm-sm100"),
    (["--k-split", "0"], "--k-split"),
    (["--wgmma-n-step", "8"], "wgmma_n_step: expected no value with design deepgemm-sm100"),
    (["--wgmma-n-step", "0"], "--wgmma-n-step: expected a multiple of 8 from 8 to 128, got '0'"),
    (["--design", "megamoe-sm90", "--hardware", "h200", "--shape", "deepseek-v4-flash", "--ranks", "1",
      "--wgmma-n-step", "12"], "--wgmma-n-step: expected a multiple of 8 from 8 to 128, got '12'"),
    (["--wgmma-n-step", "136"], "--wgmma-n-step: expected a multiple of 8 from 8 to 128, got '136'"),
    (["--design", "megamoe-sm90", "--hardware", "h200", "--shape", "deepseek-v4-flash", "--ranks", "1",
      "--k-split", "3"], "k_split: expected a divisor of both GEMMs' K blocks (32 and 16), got 3"),
    (["--tokens", "abc"], "tokens"),
    (["--ranks", "1", "--shape", "deepseek-v4-flash", "--tokens", "1,2"], "tokens: expected 1 value (one per rank), got 2"),
    (["--tokens", "131073", "--max-tokens", "131073"], "tokens"),
    (["--tokens", "1", "--max-tokens", "200000"], "max_tokens"),
    # the default pool is the most a call can need (V4-Pro EP8, 8192 tokens: 402432); more holds nothing
    (["--pool-tokens", "402433"], "pool_tokens: expected at most 402432 (the most one call can need"),
    # Python's int() / float() take digit-group underscores and non-ASCII digits; no option means them
    (["--seed", "1_000"], "--seed: expected an integer, got '1_000'"),
    (["--seed", "\u0661\u0662"], "--seed: expected an integer, got '\u0661\u0662'"),
    (["--tokens", "6_4"], "--tokens: expected an integer, got '6_4'"),
    (["--tokens", "-3"], "--tokens: expected integers in [0, 131072] per rank, got '-3'"),
    (["--tokens", "8,-1"], "--tokens: expected integers in [0, 131072] per rank, got '8,-1'"),
    (["--launch-skew-us", "1_0"], "--launch-skew-us: expected microseconds"),
    (["--routing", "zipf:1_2"], "routing.zipf_exponent: expected a number, got 1_2"),
    (["--routing", "hot:0.5:\u0664"], "routing.hot_experts: expected an integer, got \u0664"),
    (["--shape", "256,6,4_096,2048"], "shape: expected one of"),
    (["--policy", "fixed-waves:1_0"], "policy: expected fixed-waves:N"),
    (["--policy", "block-m:\u0661\u0666"], "policy: expected block-m:N with an integer N"),
])
def test_bad_input_one_line_exit_2(args, field):
    rc, out, err = run("simulate", *args)
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and field in lines[0] and "Traceback" not in err, err


@pytest.mark.parametrize("args,message", [
    (["--tokens=8", "--tokens", "16"], "--tokens: expected the option once, got it twice (8, then 16)"),
    (["--hardware", "h200", "--hardware", "b200"], "--hardware: expected the option once, got it twice (h200, then b200)"),
    (["--json={d}/a.json", "--json", "{d}/b.json"],
     "--json: expected the option once, got it twice ({d}/a.json, then {d}/b.json)"),
    (["--trace-sms", "4", "--json", "{d}/a.json"], "--trace-sms: expected a --trace to limit (it sets the Chrome "
                                                   "trace's SMs per rank), got --trace-sms 4 without --trace"),
])
def test_an_option_given_twice_or_for_nothing_is_refused(tmp_path, args, message):
    """argparse keeps the last of a repeated option silently (--json a.json --json b.json wrote b.json
    only, and a mistyped repeat of --tokens ran the other call); --trace-sms without --trace did
    nothing. Both are refused, and no file is written (fresh-user report, forty-sixth session)."""
    rc, out, err = run("simulate", *(x.format(d=tmp_path) for x in args))
    assert rc == 2 and err.strip().splitlines() == [f"megamoe: error: {message.format(d=tmp_path)}"], err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("args,message", [
    (["simulate", "--bogus"], "arguments: expected only options the command takes (see its --help), got --bogus"),
    (["compare"], "trace: expected a value (required), got none"),
    (["simulate", "--json"], "--json: expected a value, got none (a value that starts with '-' goes as --json=VALUE)"),
    # a value that looks like an option (fresh-user report, session 51)
    (["simulate", "--shape", "-256,6,4096,2048"],
     "--shape: expected a value, got none (a value that starts with '-' goes as --shape=VALUE)"),
    (["simulate", "--bounds=1"], "--bounds: expected no value (a flag), got '1'"),
    (["bogus"], "command: expected one of simulate, sweep, compare, calibrate, build, run, validate, got 'bogus'"),
    # options are spelled out: no abbreviation, ambiguous or not
    (["simulate", "--trace-", "x"], "arguments: expected only options the command takes (see its --help), got --trace- x "
                                    "(did you mean --trace-npz or --trace-sms?)"),
    (["simulate", "--tok", "64"], "arguments: expected only options the command takes (see its --help), got --tok 64 "
                                  "(did you mean --tokens?)"),
    (["sweep", "--tokns=4"], "arguments: expected only options the command takes (see its --help), got --tokns=4 "
                             "(did you mean --tokens?)"),
    (["simulate", "--combine-relay", "maybe"], "--combine-relay: expected one of on, off, got 'maybe'"),
])
def test_argparse_messages_take_the_field_form(args, message):
    """argparse's own refusals read '<field>: expected <what>, got <value>' like every other."""
    rc, _, err = run(*args)
    assert rc == 2 and err.splitlines() == [f"megamoe: error: {message}"], err


def test_no_command_prints_the_help_and_refuses():
    """``megamoe`` alone: the help on stdout, then the missing command's one-line error, exit 2
    (it exited 0 until session 51: a script that forgot its command went on as if it ran)."""
    rc, out, err = run()
    assert rc == 2 and "simulate" in out and "usage:" in out
    assert err.splitlines() == ["megamoe: error: command: expected one of simulate, sweep, compare, calibrate, build, "
                                "run, validate, got none"], err


def test_appending_options_may_repeat():
    rc, out, err = run("simulate", "--tokens", "8", "--policy", "interleaved", "--policy", "rank-by-rank")
    assert rc == 0 and "pull_order=rank-by-rank, scheduler=interleaved" in out, err


def test_trace_sms_above_the_plan_is_refused_and_nothing_is_written(tmp_path):
    out = tmp_path / "t.json"
    rc, _, err = run("simulate", "--tokens", "8", "--trace", str(out), "--trace-sms", "100000")
    assert rc == 2 and err.strip() == "megamoe: error: trace_sms: expected at most the plan's 148 SMs per rank, got 100000", err
    assert not out.exists()
    rc, stdout, _ = run("simulate", "--tokens", "8", "--trace", str(out), "--trace-sms", "148")
    assert rc == 0 and "SMs 0..147 of every rank)" in stdout and out.exists()


def test_bad_routing_file_and_hardware_file(tmp_path):
    bad = tmp_path / "ids.npy"
    np.save(bad, np.full((4, 6), 999))
    rc, _, err = run("simulate", "--ranks", "1", "--shape", "deepseek-v4-flash", "--routing", f"file:{bad}")
    assert rc == 2 and "routing.file" in err and "ids in [-1, 256)" in err
    np.save(bad, np.zeros((4, 5), dtype=np.int64))
    rc, _, err = run("simulate", "--ranks", "1", "--shape", "deepseek-v4-flash", "--routing", f"file:{bad}")
    assert rc == 2 and "shape [T, 6]" in err
    hw = tmp_path / "hw.toml"
    from sim.hardware import PRESET_DIR
    hw.write_text((PRESET_DIR / "b200.toml").read_text().replace("hbm_gbs = 8000.0", "hbm_gbs = -8000.0"))
    rc, _, err = run("simulate", "--hardware", str(hw), "--tokens", "1")
    assert rc == 2 and "hardware.figures.hbm_gbs" in err and len(err.strip().splitlines()) == 1


def test_file_routing_runs(tmp_path):
    ids = np.array([[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, -1]])
    np.save(tmp_path / "r{}.npy".format(0), ids)
    np.save(tmp_path / "r{}.npy".format(1), ids[:1])
    j = tmp_path / "o.json"
    rc = main(["simulate", "--shape", "deepseek-v4-flash", "--ranks", "2", "--routing",
               f"file:{tmp_path}/r{{rank}}.npy", "--json", str(j)])
    assert rc == 0
    d = json.loads(j.read_text())
    assert d["scenario"]["tokens_per_rank"] == [2, 1] and sum(d["num_recv_tokens"]) == 17


def test_all_masked_gives_strict_json(tmp_path):
    j = tmp_path / "m.json"
    assert main(["simulate", "--shape", "deepseek-v4-flash", "--tokens", "64", "--routing", "masked:1.0",
                 "--json", str(j)]) == 0
    d = json.loads(j.read_text(), parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert d["tflops"] == 0 and d["hbm_gbs"] == 0 and d["nvlink_gbs"] == 0
    assert d["overlap_efficiency"] is None  # 0 / 0 with no compute: null, not a number


def test_routing_file_tokens_mismatch_and_npz(tmp_path):
    ids = np.tile(np.arange(6, dtype=np.int64), (4, 1))  # 4 tokens, distinct experts per row
    np.save(tmp_path / "a.npy", ids)
    rc, _, err = run("simulate", "--ranks", "1", "--shape", "deepseek-v4-flash", "--routing",
                     f"file:{tmp_path}/a.npy", "--tokens", "100")
    assert rc == 2 and "tokens: expected the routing's own token counts [4]" in err
    np.savez(tmp_path / "two.npz", a=ids, b=ids)
    rc, _, err = run("simulate", "--ranks", "1", "--shape", "deepseek-v4-flash", "--routing",
                     f"file:{tmp_path}/two.npz")
    assert rc == 2 and "one array or an array named topk_idx" in err


def test_case_insensitive_presets(tmp_path):
    j = tmp_path / "c.json"
    assert main(["simulate", "--shape", "DeepSeek-V4-Flash", "--routing", "Uniform", "--tokens", "8",
                 "--hardware", "B200", "--json", str(j)]) == 0
    assert json.loads(j.read_text())["scenario"]["shape"] == "deepseek-v4-flash"


def test_sweep_with_no_valid_point_exits_2(tmp_path):
    rc, _, err = run("sweep", "--shape", "deepseek-v4-flash", "--ranks", "2", "--tokens", "4",
                     "--set", "experts_per_wave=500,600", "--out", str(tmp_path), "--jobs", "1")
    assert rc == 2 and "sweep: expected at least one valid point" in err


def test_unwritable_or_wrong_kind_of_path_is_one_line_exit_2(tmp_path):
    """Paths the OS refuses (a folder given as a file) and a plain .npy given as a trace."""
    np.save(tmp_path / "a.npy", np.zeros(3))
    (tmp_path / "d.json").mkdir()
    for args, needle in ((["simulate", "--tokens", "8", "--json", str(tmp_path / "d.json")],
                          "--json: expected a file path (not a folder)"),
                         (["simulate", "--tokens", "8", "--hardware", str(tmp_path)], "hardware: expected an existing TOML file"),
                         (["compare", str(tmp_path / "a.npy")], "a single array")):
        rc, out, err = run(*args)
        assert rc == 2 and "Traceback" not in err and err.count("\n") == 1 and needle in err, (args, err)


def test_validate_exit_code_follows_the_verdict(tmp_path):
    """The PR #316 rows are B200 measurements: on the H200 preset the predictions are far off
    (the verdict says FAIL), the command says so and exits 1; on B200 it passes, exit 0."""
    rc, out, err = run("validate", "--hardware", "h200")
    assert rc == 1 and "FAIL" in out and "measured on B200s" in out, (out, err)


def test_calibrate_checks_its_arguments_before_looking_for_a_gpu():
    rc, _, err = run("calibrate", "--base", "nope")
    assert rc == 2 and "--base: expected a preset" in err and "Traceback" not in err


def test_version():
    from importlib.metadata import version
    rc, out, _ = run("--version")
    assert rc == 0 and out.strip() == f"megamoe {version('megamoe')}"


def test_run_without_a_gpu_is_one_line(monkeypatch, capsys):
    """`megamoe run` on a machine without a CUDA GPU: exit 2 and one line in the CLI's error
    format, for one rank and for --ranks 2 (the fresh-user pass found two other formats)."""
    torch = pytest.importorskip("torch")
    from megamoe.kernel import runtime
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(runtime, "cuda_available", lambda: False)
    assert main(["run", "--tokens", "4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["megamoe: error: device: expected a CUDA GPU with compute capability 9.0 (sm_90a) or 10.0 (sm_100a), got none"]
    assert main(["run", "--tokens", "4", "--ranks", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["megamoe: error: ranks: expected 2 CUDA GPUs (one per rank), got 0"]


@pytest.mark.parametrize("ranks", ["1", "2"])
def test_run_without_torch_is_one_line(monkeypatch, capsys, ranks):
    """`megamoe run` where torch is not installed (after the README's first command, or the
    `kernel` extra alone): exit 2 and one line naming torch (a fresh-user pass found a
    ModuleNotFoundError traceback and exit 1)."""
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    assert main(["run", "--tokens", "5", "--ranks", ranks]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "megamoe: error: device: expected torch (a CUDA build, >= 2.9) to run the kernel, got torch not installed"]


@pytest.mark.parametrize("args, line", [
    (["--shape", "256,6,4096,2048", "--ranks", "3"], "ranks: expected a divisor of the expert count 256, got 3"),
    (["--shape", "512,6,4096,2048"], "shape.num_experts: expected <= 256 per rank (scheduler lane cache), got 512"),
    (["--shape", "8,2,256,8192"], "shape.inter: expected <= 4096 (64 L1 N blocks per mask word), got 8192"),
])
def test_run_checks_the_kernel_shape_before_the_gpu(monkeypatch, capsys, args, line):
    """A shape the kernel cannot run is named before `megamoe run` looks for a GPU (it used to
    say "no GPU" on a CPU machine and the shape error only on a GPU one)."""
    torch = pytest.importorskip("torch")
    from megamoe.kernel import runtime
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(runtime, "cuda_available", lambda: False)
    assert main(["run", "--tokens", "4", *args]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"megamoe: error: {line}"]


def test_run_checks_the_token_count_before_the_gpu(monkeypatch, capsys):
    """`megamoe run --tokens` above the per-rank limit simulate has (the same rule,
    scenario.check_tokens_per_rank) is named before the GPU check
    (until session 24 a CPU machine said only "no GPU", and a GPU one tried to allocate)."""
    from megamoe.kernel import cli_support
    from megamoe.scenario import MAX_TOKENS_PER_RANK
    monkeypatch.setattr(cli_support, "run_main", lambda *a, **k: pytest.fail("reached the GPU run"))
    for ranks in ("1", "2"):
        assert main(["run", "--tokens", str(MAX_TOKENS_PER_RANK + 1), "--ranks", ranks]) == 2
        assert capsys.readouterr().err.strip().splitlines() == [
            f"megamoe: error: tokens: expected integers in [0, {MAX_TOKENS_PER_RANK}] per rank, got {MAX_TOKENS_PER_RANK + 1}"]


def test_kernel_shape_limits():
    from megamoe.errors import InputError
    from megamoe.kernel.runtime import check_kernel_shape
    check_kernel_shape(256, 6, 4096, 2048)
    check_kernel_shape(512, 6, 4096, 2048, ranks=2)      # 256 per rank
    with pytest.raises(InputError, match=r"^shape: expected hidden and inter multiples of 128, got \(4096, 2000\)$"):
        check_kernel_shape(256, 6, 4096, 2000)
    with pytest.raises(InputError, match=r"^shape.topk: expected 1\.\.8 \(num_experts\), got 9$"):
        check_kernel_shape(8, 9, 256, 128)
    with pytest.raises(InputError, match=r"^shape.num_experts: expected <= 256 per rank \(scheduler lane cache\), "
                                         r"with 2 ranks, got 1024$"):
        check_kernel_shape(1024, 6, 4096, 2048, ranks=2)


def test_empty_call_prints_na_for_the_undefined_ratio_and_null_in_json(tmp_path):
    """--tokens 0 is a valid call (launch, count exchange, grid syncs, barriers): the time is
    that fixed cost, but overlap efficiency |comm ∩ compute| / min(|comm|, |compute|) is 0 / 0
    with no MMA at all: n/a in the table, null in --json; the other figures stay numbers."""
    from megamoe.trace import KIND, ROLE, Trace
    from sim.hardware import load_hardware

    j, npz = tmp_path / "e.json", tmp_path / "e.npz"
    rc, out, err = run("simulate", "--shape", "deepseek-v4-flash", "--ranks", "2", "--tokens", "0",
                       "--json", str(j), "--trace-npz", str(npz))
    assert rc == 0, err
    row = next(line for line in out.splitlines() if "overlap efficiency" in line)
    assert row.split("│")[2].strip() == "n/a", row
    assert "empty call (no token routed to an expert)" in out and "null in --json" in out
    d = json.loads(j.read_text())
    assert d["overlap_efficiency"] is None
    assert d["tflops"] == d["hbm_gbs"] == d["nvlink_gbs"] == 0 and d["num_recv_tokens"] == [0, 0]
    tr = Trace.load(str(npz))
    assert not np.isin(tr["kind"], [KIND["l1_mma"], KIND["l2_mma"]]).any()  # nothing to overlap with
    # the time is a real fixed cost: the ranks' last interval ends there (no skew: both start at 0)
    ends = [tr["t_end_ns"][tr["rank"] == r].max() for r in (0, 1)]
    assert d["time_us"] == pytest.approx(np.mean(ends) / 1e3) and d["time_us"] > 0
    # busy fractions: per rank, the role's rank-level interval time over the rank's span, mean over ranks
    for role, v in d["busy_fraction"].items():
        per = []
        for r in (0, 1):
            sel = (tr["rank"] == r) & (tr["role"] == ROLE[role]) & (tr["kind"] != KIND["idle_wait"])
            assert (tr["sm"][sel] == -1).all()
            per.append((tr["t_end_ns"][sel] - tr["t_start_ns"][sel]).sum() / ends[r])
        assert v == pytest.approx(np.mean(per))
    # legacy path with no rows: 5 launches, 2 all-to-all latencies, 2 barriers (hardware figures)
    hw = load_hardware("b200")
    legacy_ns = 5 * hw.legacy_launch_ns + 2 * hw.legacy_a2a_latency_ns + 2 * hw.nvl_barrier_ns
    assert d["speedup_vs_legacy"] == pytest.approx(legacy_ns / 1e3 / d["time_us"])


def test_call_with_some_empty_ranks_keeps_overlap_efficiency(tmp_path):
    """One empty rank is not an empty call: rank 1 sends its rows to rank 0's experts too, so
    both ranks compute and the figure is a number again, with no empty-call line."""
    j = tmp_path / "p.json"
    rc, out, err = run("simulate", "--shape", "deepseek-v4-flash", "--ranks", "2", "--tokens", "0,4",
                       "--json", str(j))
    assert rc == 0, err
    d = json.loads(j.read_text())
    assert sum(d["num_recv_tokens"]) == 4 * 6 and 0 < d["overlap_efficiency"] <= 1
    assert "empty call" not in out and "n/a" not in out


def _help_sections(*argv):
    rc, out, _ = run(*argv, "--help")
    assert rc == 0
    sections, name = {}, None
    for line in out.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            name = line[:-1]
        elif name:
            sections.setdefault(name, []).append(line.strip().split(" ")[0])
    return sections


@pytest.mark.parametrize("cmd", ["simulate", "sweep"])
def test_launch_skew_is_listed_with_the_scenario_options(cmd):
    s = _help_sections(cmd)
    assert "--launch-skew-us" in s["scenario"] and "--launch-skew-us" not in s["options"]
    assert {"--shape", "--routing", "--launch-skew-us"} <= set(s["scenario"])


_RUN_ONLY = ("megamoe: error: routing: expected uniform, zipf[:1] or one_expert for megamoe run --routing (the "
             "kernel's input generator makes only these; masked, hot and file: are simulate-only), got ")


@pytest.mark.parametrize("routing,line", [
    ("masked:0.2", _RUN_ONLY + "masked:0.2"),
    ("hot:0.5", _RUN_ONLY + "hot:0.5"),
    ("file:ids.npy", _RUN_ONLY + "file:ids.npy"),
    ("zipf:1.2", ("megamoe: error: routing.zipf_exponent: expected 1 for megamoe run --routing (the kernel's "
                  "input generator has exponent 1 only), got 1.2")),
    ("bogus", _RUN_ONLY + "bogus"),  # (until session 24: simulate's whole vocabulary)
    ("zipf:x", "megamoe: error: routing.zipf_exponent: expected a number, got x"),
])
def test_run_refuses_routing_its_generator_cannot_make_before_looking_for_a_gpu(routing, line, monkeypatch, capsys):
    from megamoe.kernel import cli_support
    monkeypatch.setattr(cli_support, "run_main", lambda *a, **k: pytest.fail("reached the GPU run"))
    for ranks in ("1", "2"):
        assert main(["run", "--routing", routing, "--tokens", "4", "--ranks", ranks]) == 2
        assert capsys.readouterr().err.strip().splitlines() == [line]


@pytest.mark.parametrize("routing,kernel_name", [("uniform", "uniform"), ("zipf", "zipf"), ("zipf:1", "zipf"),
                                                 ("one_expert", "one_expert"), ("One_Expert", "one_expert")])
def test_run_and_simulate_take_the_same_routing_names(routing, kernel_name, monkeypatch, tmp_path):
    """The names `megamoe run` takes are simulate's; run hands the kernel generator its name
    (one rank: run_main, --ranks 2: run_ep_main), and simulate runs the same spelling."""
    from megamoe.kernel import cli_support, ep
    got = []
    monkeypatch.setattr(cli_support, "run_main", lambda *a: got.append(("one", a[5])) or 0)
    monkeypatch.setattr(ep, "run_ep_main", lambda *a: got.append(("ep", a[6])) or 0)
    assert main(["run", "--routing", routing, "--tokens", "4"]) == 0
    assert main(["run", "--routing", routing, "--tokens", "4", "--ranks", "2"]) == 0
    assert got == [("one", kernel_name), ("ep", kernel_name)]
    j = tmp_path / "r.json"
    assert main(["simulate", "--shape", "deepseek-v4-flash", "--ranks", "2", "--tokens", "8", "--routing", routing,
                 "--json", str(j)]) == 0
    assert json.loads(j.read_text())["scenario"]["routing"] == ("zipf:1" if kernel_name == "zipf" else kernel_name)


def test_sweep_refuses_oversized_and_repeated_axes(tmp_path):
    """A sweep range is sized before it is built (1:100000000 used to exhaust memory), the
    grid is bounded, an axis given twice is an error (it used to drop the first), an empty
    value list says what came."""
    from sim.sweep import MAX_POINTS

    out = str(tmp_path / "sw")
    rc, _, err = run("sweep", "--set", "tokens=1:100000000", "--out", out)
    assert rc == 2 and f"sweep.tokens: expected a range of at most {MAX_POINTS} values" in err
    assert "(100000000)" in err and len(err.strip().splitlines()) == 1
    rc, _, err = run("sweep", "--set", "tokens=1:400", "--set", "seed=0:400", "--out", out)
    assert rc == 2 and f"at most {MAX_POINTS} points" in err and "got 160400" in err
    rc, _, err = run("sweep", "--set", "tokens=1", "--set", "tokens=2", "--out", out)
    assert rc == 2 and "--set: expected each axis once" in err and "tokens twice" in err
    rc, _, err = run("sweep", "--set", "tokens=", "--out", out)
    assert rc == 2 and err.strip().endswith("got ''")


def test_sweep_refuses_an_axis_also_given_as_its_option(tmp_path):
    """A swept axis replaces its option's value at every point, so giving both is refused (the
    option was silently dropped); nothing is written. --policy is not such an option: a policy axis
    adds to its list."""
    out = tmp_path / "sw"
    for extra, name in ((["--tokens", "5"], "tokens"),
                        (["--block-m", "16", "--design", "megamoe-sm90"], "block_m")):
        axis = "tokens=1,2" if name == "tokens" else "block_m=16,32"
        rc, outp, err = run("sweep", "--set", axis, *extra, "--out", str(out))
        flag = "--" + name.replace("_", "-")
        assert rc == 2 and err.strip() == f"megamoe: error: --set: expected an axis not also given as its own option, got {name} in --set and {flag}"
        assert outp == "" and not out.exists()
    rc, outp, _ = run("sweep", "--set", "tokens=1,2", "--policy", "round-robin", "--shape", "8,2,512,256", "--ranks", "2",
                      "--out", str(out))
    assert rc == 0 and "2 points (0 invalid)" in outp


def test_shape_error_lists_presets_plainly():
    rc, _, err = run("simulate", "--shape", "foo")
    assert rc == 2 and "one of deepseek-v4-flash, deepseek-v4-pro or four integers E,k,H,I" in err and "[" not in err
    # three numbers or four non-numbers: the same message, the count spelled out
    for bad in ("1,2,3", "a,b,c,d"):
        rc, _, err = run("simulate", "--shape", bad)
        assert rc == 2 and "shape: expected one of deepseek-v4-flash, deepseek-v4-pro or four integers E,k,H,I" in err
        assert err.strip().endswith(f"got {bad}") and "Traceback" not in err
    # from Python, a non-string is named too (not an AttributeError)
    from megamoe.errors import InputError
    from megamoe.shapes import get_shape

    for bad in (5, None):
        with pytest.raises(InputError, match=rf"^shape: expected one of .* an E,k,H,I string, got {bad!r}$"):
            get_shape(bad)


def test_legacy_speedup_says_when_its_latencies_are_estimates(tmp_path):
    """The legacy path's all-to-all latency was fitted on B200 only, with several ranks (PR
    #316's speedup column): on the H200 preset it is an estimate, and at one rank (no all-to-all,
    sim.legacy) nothing of the path is fitted; the output says which under the table."""
    rc, out, _ = run("simulate", "--hardware", "h200", "--design", "megamoe-sm90", "--shape", "deepseek-v4-flash",
                     "--ranks", "1", "--tokens", "64")
    assert rc == 0 and "idealised unfused path at one rank" in out and "legacy_launch_ns 6 us" in out
    assert "DeepEP" not in out and "legacy_a2a_latency_ns" not in out
    rc, out, _ = run("simulate", "--hardware", "h200", "--tokens", "64")
    assert rc == 0 and "DeepEP all-to-alls" in out and "legacy_a2a_latency_ns: estimate" in out
    rc, out, _ = run("simulate", "--tokens", "64")
    assert rc == 0 and "speedup vs legacy: against" not in out  # b200, eight ranks: fitted
    # a what-if file on the b200 preset inherits the B200's fit: said to be no fit to this GPU
    hw = tmp_path / "hbm2x.toml"
    hw.write_text('name = "B200 2x HBM"\nbase = "b200"\n[figures]\nhbm_gbs = 16000.0\n'
                  '[sources]\nhbm_gbs = "what-if: twice the HBM"\n')
    rc, out, _ = run("simulate", "--hardware", str(hw), "--tokens", "64")
    out = " ".join(out.split())
    assert rc == 0 and ("on B200 2x HBM its all-to-all latency is not fitted to this GPU (legacy_a2a_latency_ns: "
                        "estimate: B200's figure (b200): fitted:") in out


def test_oversized_total_work_is_refused_before_allocating(monkeypatch):
    """ranks x tokens (and ranks x experts, and the blocks they make) are bounded so a
    simulation always fits the CI machine's 24 GB: `--ranks 256 --tokens 131072` used to be
    OOM-killed. The first two are checked before routing is generated, the blocks before the
    engine starts."""
    from megamoe import scenario
    from megamoe.errors import InputError
    from sim import engine

    monkeypatch.setattr(scenario, "generate", lambda *a, **k: pytest.fail("routing generated"))
    with pytest.raises(InputError) as e:
        scenario.Scenario(shape="deepseek-v4-flash", num_ranks=256, tokens_per_rank=131072)
    assert str(e.value) == ("tokens: expected ranks x tokens per rank x top_k <= 12582912 routed slots (the "
                            "simulator's memory grows with them: 16 ranks x 131072 tokens x 6 took 5.5 GB), got "
                            "256 x 131072 x 6 = 201326592")
    with pytest.raises(InputError, match=r"^tokens: .* got 2228224 tokens x 6 = 13369344$"):
        scenario.Scenario(shape="deepseek-v4-flash", num_ranks=32, tokens_per_rank=[131072] * 16 + [8192] * 16)
    assert scenario.Scenario(shape="deepseek-v4-flash", num_ranks=16, tokens_per_rank=131072).num_ranks == 16
    with pytest.raises(InputError) as e:
        scenario.Scenario(shape="4096,6,1024,512", num_ranks=4096, tokens_per_rank=1)
    assert str(e.value) == ("ranks: expected ranks x experts <= 1048576 (the simulator's memory grows with them), "
                            "got 4096 x 4096 = 16777216")
    monkeypatch.undo()
    monkeypatch.setattr(engine, "_Engine", lambda *a, **k: pytest.fail("engine started"))
    monkeypatch.setattr(engine, "MAX_BLOCKS", 100_000)  # the same check at a size a test can afford
    with pytest.raises(InputError) as e:
        engine.simulate(scenario.Scenario(shape="deepseek-v4-flash", num_ranks=8, tokens_per_rank=4096, block_m=16))
    assert str(e.value) == ("blocks: expected at most 100000 blocks over all ranks (routed slots / block_m x "
                            "(2 x intermediate + hidden) / 128: fewer tokens, a larger block_m or a smaller hidden or "
                            "intermediate make fewer), got 794240 (block_m 16, hidden 4096, intermediate 2048)")
    rc, _, err = run("simulate", "--shape", "deepseek-v4-flash", "--ranks", "256", "--tokens", "131072")
    assert rc == 2 and err.strip().splitlines() == [(
        "megamoe: error: tokens: expected ranks x tokens per rank x top_k <= 12582912 routed slots (the simulator's "
        "memory grows with them: 16 ranks x 131072 tokens x 6 took 5.5 GB), got 256 x 131072 x 6 = 201326592")]


def test_shape_too_large_for_shared_memory_names_the_shape_field(tmp_path, capsys):
    """The expert count sizes a block's shared memory (the dispatch's per-expert tables): the
    error names shape.num_experts and the largest count that fits, not the hardware's figure;
    a hardware too small for any shape still names hardware.smem_per_block_bytes."""
    from megamoe.design_sm90 import smem_bytes
    from sim.hardware import PRESET_DIR

    assert main(["simulate", "--shape", "100000,6,1024,512", "--ranks", "1", "--tokens", "16"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [(
        "megamoe: error: shape.num_experts: expected at most 37376 experts (their dispatch tables and 2 pipeline "
        "stages at block_m 16 need 482788 bytes of shared memory per block, the hardware has 232448), got 100000")]
    assert main(["simulate", "--shape", "100000,6,1024,512", "--ranks", "1", "--tokens", "16", "--design",
                 "megamoe-sm90", "--hardware", "h200"]) == 2
    # the SM90 kernel's own formula, with its floor of 4 stages at block_m 16 (one per producer
    # warp, megamoe.design_sm90.min_stages)
    most = max(e for e in range(10000, 17400) if smem_bytes(16, 4, e) <= 232448)
    assert smem_bytes(16, 4, most + 1) > 232448 >= smem_bytes(16, 2, most + 1)
    assert capsys.readouterr().err.strip().splitlines() == [(
        f"megamoe: error: shape.num_experts: expected at most {most} experts (their dispatch tables and 4 pipeline "
        f"stages at block_m 16 need {smem_bytes(16, 4, 100000)} bytes of shared memory per block, the hardware has "
        "232448), got 100000")]
    j = tmp_path / "ok.json"
    assert main(["simulate", "--shape", "37376,6,1024,512", "--ranks", "1", "--tokens", "16", "--json", str(j)]) == 0
    hw = tmp_path / "tiny.toml"
    hw.write_text((PRESET_DIR / "b200.toml").read_text().replace("smem_per_block_bytes = 232448",
                                                                 "smem_per_block_bytes = 20000"))
    assert main(["simulate", "--hardware", str(hw), "--tokens", "16"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [(
        "megamoe: error: hardware.smem_per_block_bytes: expected >= 93668 bytes for 2 pipeline stages at block_m 16, "
        "got 20000")]


@pytest.mark.parametrize("value", ["nan", "-1", "0", "inf", "abc"])
def test_run_refuses_a_clamp_that_is_not_a_finite_positive_number(value, monkeypatch, capsys):
    """`megamoe run --clamp` is checked before any GPU work: NaN, negative, zero and infinite
    clamps used to reach the kernel unchecked (the reference takes None = no clamp or c > 0)."""
    from megamoe.kernel import cli_support, ep
    monkeypatch.setattr(cli_support, "run_main", lambda *a, **k: pytest.fail("reached the GPU run"))
    monkeypatch.setattr(ep, "run_ep_main", lambda *a, **k: pytest.fail("reached the GPU run"))
    for ranks in ("1", "2"):
        with pytest.raises(SystemExit) as e:
            main(["run", "--clamp", value, "--tokens", "4", "--ranks", ranks])
        assert e.value.code == 2
        assert capsys.readouterr().err.strip().splitlines() == [(
            f"megamoe: error: --clamp: expected a finite number > 0 (leave --clamp out for no clamp), "
            f"got '{value}'")]


def test_run_passes_a_valid_clamp_and_none_without_the_flag(monkeypatch):
    from megamoe.kernel import cli_support
    got = []
    monkeypatch.setattr(cli_support, "run_main", lambda *a: got.append(a[6]) or 0)
    assert main(["run", "--tokens", "4", "--clamp", "7.5"]) == 0
    assert main(["run", "--tokens", "4"]) == 0
    assert got == [7.5, None]


@pytest.mark.parametrize("argv,line", [
    (["simulate", "--tokens", "abc"], "--tokens: expected an integer, got 'abc'"),
    (["simulate", "--design", "nosuch"], "--design: expected one of deepgemm-sm100, megamoe-sm90, got 'nosuch'"),
    (["simulate", "--ranks", "x"], "--ranks: expected an integer, got 'x'"),
    (["sweep", "--jobs", "x"], "--jobs: expected an integer, got 'x'"),
    (["run", "--tokens", "x"], "--tokens: expected an integer, got 'x'"),
    (["run", "--reps", "1.5"], "--reps: expected an integer, got '1.5'"),
    (["run", "--clamp", "abc"], ("--clamp: expected a finite number > 0 (leave --clamp out for no clamp), "
                                 "got 'abc'")),
    (["validate", "--seed", "-2"], "--seed: expected an integer >= 0, got '-2'"),
])
def test_flag_type_errors_are_one_line_naming_the_flag(argv, line, capsys):
    """Every numeric or fixed-choice flag's type error is the project's one line (`expected ...,
    got ...`) with exit code 2, no usage dump (`--clamp abc` used argparse's own wording; `--design`
    was refused by the scenario as `design:`, not naming the flag)."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"megamoe: error: {line}"]


# -- outputs: checked before any work, written all or nothing --------------------------------
FLASH = ["--shape", "deepseek-v4-flash", "--ranks", "2", "--tokens", "8"]
PRECIOUS = '{"precious":1}\n'
needs_proc = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux /proc (a folder nobody can write)")


def _no_temporaries(folder):
    return [p.name for p in folder.iterdir() if p.name.startswith(".megamoe-tmp-")] == []


def _no_simulation(monkeypatch):
    from sim import engine
    monkeypatch.setattr(engine, "simulate", lambda *a, **k: pytest.fail("simulated before checking the outputs"))


@needs_proc
@pytest.mark.parametrize("flag,bad", [("--plot", "/proc/x.png"), ("--trace", "/proc/x.json"),
                                      ("--trace-npz", "/proc/x.npz")])
def test_an_unwritable_output_fails_before_the_simulation_and_loses_nothing(flag, bad, tmp_path, monkeypatch, capsys):
    """`--json keep.json --plot /proc/x.png` used to print "wrote keep.json", overwrite it, then
    fail; `--json a.json --trace /proc/x.json` left a.json behind."""
    keep, new = tmp_path / "keep.json", tmp_path / "a.json"
    keep.write_text(PRECIOUS)
    _no_simulation(monkeypatch)
    for j in (keep, new):
        assert main(["simulate", *FLASH, "--json", str(j), flag, bad]) == 2
        out, err = capsys.readouterr()
        assert err.splitlines() == [f"megamoe: error: {flag}: expected a path in a folder this user can write, got "
                                    f"{bad} (No such file or directory)"] and "wrote" not in out
    assert keep.read_text() == PRECIOUS and not new.exists() and _no_temporaries(tmp_path)


def test_a_failure_after_some_outputs_were_written_keeps_the_old_files(tmp_path, monkeypatch, capsys):
    """The JSON and trace are written, then the plot fails: nothing is renamed into place."""
    from sim import plots

    keep, tr = tmp_path / "keep.json", tmp_path / "t.json"
    keep.write_text(PRECIOUS)

    def boom(res, path):
        open(path, "w").write("half a figure")
        raise OSError(28, "No space left on device", path)

    monkeypatch.setattr(plots, "plot_timeline", boom)
    assert main(["simulate", *FLASH, "--json", str(keep), "--trace", str(tr), "--plot", str(tmp_path / "p.png")]) == 2
    out, err = capsys.readouterr()
    assert "No space left on device" in err and len(err.splitlines()) == 1 and "wrote" not in out
    assert keep.read_text() == PRECIOUS and not tr.exists() and not (tmp_path / "p.png").exists()
    assert _no_temporaries(tmp_path)


def test_a_folder_given_as_an_output_is_refused_before_the_simulation(tmp_path, monkeypatch, capsys):
    (tmp_path / "d.json").mkdir()
    (tmp_path / "d.png").mkdir()
    _no_simulation(monkeypatch)
    for flag, name in (("--json", "d.json"), ("--trace", "d.json"), ("--plot", "d.png")):
        with pytest.raises(SystemExit) as e:
            main(["simulate", *FLASH, flag, str(tmp_path / name)])
        assert e.value.code == 2
        assert capsys.readouterr().err.splitlines() == [
            f"megamoe: error: {flag}: expected a file path (not a folder), got '{tmp_path / name}'"]


def test_two_outputs_on_one_path_are_refused(tmp_path, monkeypatch, capsys):
    """`--json same.json --trace same.json` printed "wrote same.json" twice and lost the JSON."""
    same = tmp_path / "same.json"
    _no_simulation(monkeypatch)
    assert main(["simulate", *FLASH, "--json", str(same), "--trace", str(same)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"megamoe: error: --trace: expected a path other than --json's (each output its own file), got {same}"]
    other = tmp_path / "sub" / ".." / "same.json"  # the same file under another name
    (tmp_path / "sub").mkdir()
    assert main(["simulate", *FLASH, "--json", str(same), "--trace", str(other)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"megamoe: error: --trace: expected a path other than --json's (each output its own file), got {other} "
        f"(the same file as {same})"]
    assert not same.exists() and _no_temporaries(tmp_path)


def test_suffixes_in_any_case_are_written_in_the_format_they_name(tmp_path, capsys):
    """`--trace-npz X.NPZ` used to write X.NPZ.npz (NumPy adds .npz) and `--trace T.JSON.GZ`
    an uncompressed file: the suffix check is case-blind, so the writers are too."""
    import gzip

    from megamoe.trace import Trace

    npz, gz, png, j = tmp_path / "X.NPZ", tmp_path / "T.JSON.GZ", tmp_path / "P.PNG", tmp_path / "S.Json"
    assert main(["simulate", *FLASH, "--trace-npz", str(npz), "--trace", str(gz), "--plot", str(png),
                 "--json", str(j)]) == 0
    out = capsys.readouterr().out
    for f in (npz, gz, png, j):
        assert f"wrote {f}" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["P.PNG", "S.Json", "T.JSON.GZ", "X.NPZ"]
    assert len(Trace.load(str(npz))) > 0
    assert json.loads(gzip.decompress(gz.read_bytes()))["traceEvents"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and json.loads(j.read_text())["time_us"] > 0


def test_outputs_get_the_usual_permissions_and_follow_symlinks(tmp_path):
    """A new output gets what open() gives (0666 & ~umask, not mkstemp's 0600), an existing
    one keeps its mode, a symlink's target is replaced and the link stays."""
    from megamoe.cli import Outputs

    umask = os.umask(0o022)
    try:
        old, target = tmp_path / "old.json", tmp_path / "target.json"
        old.write_text("x")
        old.chmod(0o640)
        target.write_text("x")
        link = tmp_path / "link.json"
        link.symlink_to(target)
        with Outputs() as outs:
            for name in ("new.json", "old.json", "link.json"):
                with open(outs.reserve("--json", str(tmp_path / name), (".json",)), "w") as f:
                    f.write(name)
            outs.commit()
        assert (tmp_path / "new.json").stat().st_mode & 0o777 == 0o644 and old.stat().st_mode & 0o777 == 0o640
        assert link.is_symlink() and target.read_text() == "link.json" and old.read_text() == "old.json"
        assert _no_temporaries(tmp_path)
    finally:
        os.umask(umask)


def test_validate_json_is_reported_and_every_option_has_help():
    """`validate --json` printed no "wrote" line; `validate --json` and `run --reps` had no help."""
    parser = __import__("megamoe.cli", fromlist=["build_parser"]).build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing = [f"{name} {'/'.join(a.option_strings) or a.dest}" for name, p in sub.choices.items()
               for a in p._actions if not a.help]
    assert missing == []


def test_one_line_parser_reports_as_its_program():
    """megamoe.errors.OneLineArgumentParser: `<program>: error: <message>`, exit 2, nothing else
    (no usage line); a subcommand's parser (prog "megamoe simulate") reports as "megamoe"."""
    from megamoe.errors import OneLineArgumentParser

    for prog, shown in (("peer_ab.py", "peer_ab.py"), ("megamoe simulate", "megamoe")):
        p = OneLineArgumentParser(prog=prog)
        p.add_argument("--n", type=int)
        buf = io.StringIO()
        with contextlib.redirect_stderr(buf), pytest.raises(SystemExit) as e:
            p.parse_args(["--n", "x"])
        assert e.value.code == 2
        assert buf.getvalue() == f"{shown}: error: --n: expected an integer, got 'x'\n"


def test_one_line_parser_reports_input_errors_of_its_block():
    """OneLineArgumentParser.input_errors: an InputError raised in the block becomes the
    parser's one-line error (exit 2); other exceptions pass through, and a clean block runs on."""
    from megamoe.errors import InputError, OneLineArgumentParser

    p = OneLineArgumentParser(prog="peer_ab.py")
    buf = io.StringIO()
    with contextlib.redirect_stderr(buf), pytest.raises(SystemExit) as e, p.input_errors():
        raise InputError("out", "a file path (not a folder)", "/tmp")
    assert e.value.code == 2
    assert buf.getvalue() == "peer_ab.py: error: out: expected a file path (not a folder), got /tmp\n"
    with pytest.raises(KeyError), p.input_errors():
        raise KeyError("x")
    with p.input_errors():
        done = True
    assert done


def test_help_states_the_parsers_own_defaults():
    """A help text never restates an option's default as a literal ("default 64" beside
    default=64): it takes it from the parser (argparse's %(default)s), so the two cannot drift
    apart. Options whose default is computed (None: "default: the design's choice") say so in
    words."""
    import re

    parser = __import__("megamoe.cli", fromlist=["build_parser"]).build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    literal = []
    for name, p in sub.choices.items():
        for a in p._actions:
            if a.default in (None, argparse.SUPPRESS, False, []) or not a.help:
                continue
            stated = re.search(rf"\bdefault {re.escape(str(a.default))}(?![\w.])", a.help)
            if stated:
                literal.append(f"{name} {'/'.join(a.option_strings) or a.dest}: {stated.group(0)!r}")
    assert literal == []
    help_text = sub.choices["run"].format_help()
    assert "tokens per rank (default 64)" in help_text and "input seed (default 0)" in help_text
    # sweep --set names every axis sim.sweep takes (it listed some and "...": fresh-user report, session 49)
    from sim.sweep import SCALE_ALIASES, SCENARIO_AXES

    set_help = " ".join(next(a for a in sub.choices["sweep"]._actions if "--set" in a.option_strings).help.split())
    assert all(f"{axis}," in set_help or f"{axis} " in set_help for axis in [*SCENARIO_AXES, "policy", *SCALE_ALIASES])


def test_calibrate_names_its_options_in_errors(tmp_path, capsys):
    """`calibrate --base` / `--kernel-trace` errors name the option the user typed, not the
    library's field (`hardware`, `trace`), before any GPU work; --base takes a preset only (the
    file it writes is that preset with the measured figures: a TOML path passed this check and
    failed after the measurements)."""
    assert main(["calibrate", "--base", "nosuch", "--out", str(tmp_path / "c.toml")]) == 2
    assert capsys.readouterr().err == "megamoe: error: --base: expected a preset (b200, h100, h20, h200), got nosuch\n"
    assert main(["calibrate", "--kernel-trace", str(tmp_path / "no.npz"), "--out", str(tmp_path / "c.toml")]) == 2
    assert capsys.readouterr().err.startswith("megamoe: error: --kernel-trace: expected an .npz trace file, got ")
    from sim.hardware import PRESET_DIR
    good = tmp_path / "h200copy.toml"
    good.write_text((PRESET_DIR / "h200.toml").read_text())
    for base, shown in ((str(good), str(good)), (" h200", "' h200'")):
        assert main(["calibrate", "--base", base, "--out", str(tmp_path / "c.toml")]) == 2
        assert capsys.readouterr().err == f"megamoe: error: --base: expected a preset (b200, h100, h20, h200), got {shown}\n"
    assert not (tmp_path / "c.toml").exists()


def test_validate_writes_its_json_after_the_table(tmp_path, monkeypatch, capsys):
    from sim import validate as V

    row = {"tokens_per_rank": 1, **{f"{k}_{s}": 1.0 for k in ("time_us", "tflops", "hbm_gbs", "nvlink_gbs",
                                                               "speedup_vs_legacy") for s in ("pred", "pub")},
           "time_us_err": 0.0}
    monkeypatch.setattr(V, "validate", lambda hw, seed=0: [row])
    j = tmp_path / "v.json"
    assert main(["validate", "--json", str(j)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == f"wrote {j}" and json.loads(j.read_text())["rows"] == [row]
    keep = tmp_path / "keep.json"
    keep.write_text(PRECIOUS)
    monkeypatch.setattr(V, "validate", lambda hw, seed=0: (_ for _ in ()).throw(KeyboardInterrupt))
    assert main(["validate", "--json", str(keep)]) == 130
    assert keep.read_text() == PRECIOUS and _no_temporaries(tmp_path)


@needs_proc
def test_compare_and_calibrate_check_their_outputs_first(tmp_path, monkeypatch, capsys):
    from sim import calibrate, compare

    monkeypatch.setattr(compare, "compare_file", lambda *a, **k: pytest.fail("compared before checking outputs"))
    monkeypatch.setattr(calibrate, "measure", lambda *a, **k: pytest.fail("measured before checking --out"))
    keep = tmp_path / "keep.json"
    keep.write_text(PRECIOUS)
    assert main(["compare", str(tmp_path / "t.npz"), "--json", str(keep), "--plot", "/proc/x.png"]) == 2
    assert capsys.readouterr().err.startswith("megamoe: error: --plot: expected a path in a folder this user can write")
    assert main(["calibrate", "--out", "/proc/x.toml"]) == 2
    assert capsys.readouterr().err.startswith("megamoe: error: --out: expected a path in a folder this user can write")
    assert keep.read_text() == PRECIOUS and _no_temporaries(tmp_path)


def test_compare_writes_both_outputs(tmp_path, capsys):
    npz, j, png = tmp_path / "t.npz", tmp_path / "r.json", tmp_path / "o.png"
    assert main(["simulate", *FLASH, "--trace-npz", str(npz)]) == 0
    assert main(["compare", str(npz), "--json", str(j), "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert f"wrote {j}" in out and f"wrote {png}" in out and "makespan_error" in json.loads(j.read_text())
    assert _no_temporaries(tmp_path)


def test_simulate_time_is_the_traced_span_plus_the_launch(tmp_path):
    """`simulate`'s time runs from the launch; a trace (and so `compare`'s measured and
    simulated spans) starts at its first record: the two differ by the hardware's launch_ns,
    which both outputs say."""
    from megamoe.trace import Trace
    from sim.hardware import load_hardware

    npz, j = tmp_path / "t.npz", tmp_path / "s.json"
    rc, out, err = run("simulate", *FLASH, "--trace-npz", str(npz), "--json", str(j))
    assert rc == 0, err
    launch_us = load_hardware("b200").launch_ns / 1e3
    assert f"time (us, {launch_us:g} us launch included)" in out
    span_us = Trace.load(str(npz)).makespan_ns / 1e3
    assert json.loads(j.read_text())["time_us"] == pytest.approx(span_us + launch_us, abs=1e-6)
    rc, out, err = run("compare", str(npz))
    assert rc == 0, err
    # (a simulator's trace is "recorded", a kernel's "measured")
    assert f"recorded {span_us:.1f} us, simulated {span_us:.1f} us (the traced spans: launch not included)" in out
    assert "overlap efficiency: recorded " in out and "measured" not in out


def test_sweep_checks_its_out_folder_before_any_point(tmp_path, monkeypatch, capsys):
    """The folder the sweep would write to is checked first (the sweep makes it once a point is
    valid, by design, and keeps points.jsonl as its resume log)."""
    from sim import sweep as S

    monkeypatch.setattr(S, "sweep", lambda *a, **k: pytest.fail("swept before checking --out"))
    out = tmp_path / "sw"
    (out / "time_us_vs_tokens.png").mkdir(parents=True)
    assert main(["sweep", "--set", "tokens=1,2", "--out", str(out)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"megamoe: error: --out: expected a folder where time_us_vs_tokens.png can be written, got {out} "
        "(time_us_vs_tokens.png is a folder)"]
    if os.path.isdir("/proc/self"):
        assert main(["sweep", "--set", "tokens=1,2", "--out", "/proc/sw"]) == 2
        assert capsys.readouterr().err.startswith("megamoe: error: --out: expected a folder this user can write")
    # a new folder under a missing one: refused (a mistyped parent), as any output's missing folder
    deeper = tmp_path / "new" / "deeper"
    assert main(["sweep", "--set", "tokens=1,2", "--out", str(deeper)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"megamoe: error: --out: expected a folder, existing or new in an existing folder (its parents are not "
        f"made), got {deeper} ({tmp_path / 'new'} is missing)"]
    assert not (tmp_path / "new").exists()
    monkeypatch.undo()
    new = tmp_path / "new"  # a new folder in an existing one: made by the sweep
    assert main(["sweep", *FLASH[:4], "--set", "tokens=1,2", "--out", str(new), "--jobs", "1"]) == 0
    assert (new / "results.csv").exists() and _no_temporaries(tmp_path)


def test_run_trace_is_staged_and_named_by_its_final_path(tmp_path, monkeypatch, capsys):
    """`megamoe run --trace` goes through the same mechanism: the kernel writes a temporary
    (its "-> path" line names the final file), kept when written (a failed check, exit 1,
    still writes it), and an existing file is left alone when the run writes nothing."""
    from megamoe.kernel import cli_support, ep

    def fake_run(*a):
        path = a[8]
        with open(path, "w") as f:
            f.write('{"traceEvents": []}')
        print(f"trace: 0 records -> {path}")
        return 1

    monkeypatch.setattr(cli_support, "run_main", fake_run)
    tr = tmp_path / "k.json"
    assert main(["run", "--tokens", "4", "--trace", str(tr)]) == 1
    assert capsys.readouterr().out.splitlines() == [f"trace: 0 records -> {tr}"] and tr.read_text()
    tr.write_text(PRECIOUS)
    monkeypatch.setattr(cli_support, "run_main", lambda *a: 2)  # e.g. no GPU: nothing written
    assert main(["run", "--tokens", "4", "--trace", str(tr)]) == 2 and tr.read_text() == PRECIOUS

    def fake_ep(ranks, *a):
        for r in range(ranks):
            with open(f"{a[8]}.rank{r}.json", "w") as f:
                f.write("{}")
        return 0

    monkeypatch.setattr(ep, "run_ep_main", fake_ep)
    monkeypatch.delenv("RANK", raising=False)
    assert main(["run", "--tokens", "4", "--ranks", "2", "--trace", str(tr)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.json", "k.json.rank0.json", "k.json.rank1.json"]
    assert tr.read_text() == PRECIOUS


def test_a_closed_stdout_exits_quietly():
    """`megamoe sweep ... | head -1` ended with "megamoe: error: Broken pipe", exit 2: now no
    message and 141 (128 + SIGPIPE, what a shell reports for a unix tool stopped that way)."""
    p = subprocess.Popen([sys.executable, "-m", "megamoe.cli", "simulate", *FLASH], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.close()
    err = p.stderr.read()
    assert p.wait(timeout=300) == 141 and err == b""


def test_ctrl_c_is_one_line_exit_130(tmp_path, monkeypatch, capsys):
    from sim import engine

    keep = tmp_path / "keep.json"
    keep.write_text(PRECIOUS)
    monkeypatch.setattr(engine, "simulate", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    assert main(["simulate", *FLASH, "--json", str(keep), "--plot", str(tmp_path / "p.png")]) == 130
    assert capsys.readouterr().err.splitlines() == ["megamoe: interrupted"]
    assert keep.read_text() == PRECIOUS and sorted(p.name for p in tmp_path.iterdir()) == ["keep.json"]


def test_outputs_into_special_files_and_overlong_names(tmp_path, capsys):
    """An existing output that is not a regular file (a FIFO here; /dev/null alike) is written
    into, not replaced by a regular file; a file name longer than the folder allows is refused
    by flag before the simulation."""
    import threading

    fifo = tmp_path / "ff.json"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()))
    reader.start()
    assert main(["simulate", "--shape", "deepseek-v4-flash", "--ranks", "1", "--tokens", "8", "--json", str(fifo)]) == 0
    reader.join(timeout=60)
    assert os.path.exists(fifo) and not os.path.isfile(fifo)  # still the FIFO
    assert json.loads(got[0])["scenario"]["tokens_per_rank"] == [8]
    capsys.readouterr()
    long = tmp_path / ("a" * 260 + ".json")
    assert main(["simulate", "--shape", "deepseek-v4-flash", "--tokens", "8", "--json", str(long)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "megamoe: error: --json: expected a file name of at most 255 bytes, got 265 bytes"]
    assert sorted(os.listdir(tmp_path)) == ["ff.json"]


def test_compare_json_writes_null_not_nan(tmp_path, capsys):
    """A comparison whose per-kind error is undefined (no matched intervals: a kernel trace
    whose stored routing is all masked) is written as JSON null, never the non-JSON NaN."""

    from pathlib import Path

    src = Path(__file__).resolve().parents[1] / "benchmarks" / "traces" / "kernel_flash_ep1_t1.npz"
    z = dict(np.load(src, allow_pickle=False))
    z["topk_idx_0"] = np.full_like(z["topk_idx_0"], -1)  # the re-simulation matches none of its kinds
    p = tmp_path / "t.npz"
    np.savez(p, **z)
    out = tmp_path / "c.json"
    rc = main(["compare", str(p), "--json", str(out)])
    text = out.read_text()
    assert rc == 0 and "NaN" not in text and json.loads(text)["median_kind_error"] is None
    json.loads(text, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))


def test_sm90_stage_floor_is_a_one_line_error(capsys):
    """megamoe-sm90 runs with at least one stage per producer warp (4 at block_m 16): 3 is
    refused with the range (at 64 tokens two CTAs share each SM: half of 233472 B less the 1024-B
    reserve = 115712 B, (115712 - 6144) // 11264 = 9 stages; at one CTA per SM 232448 B, 16), 4
    simulates; the SM100 design keeps its floor of 2; two CTAs per SM at block_m 32 is refused."""
    base = ["simulate", "--shape", "deepseek-v4-flash", "--ranks", "1", "--tokens", "64"]
    assert main([*base, "--design", "megamoe-sm90", "--hardware", "h200", "--num-stages", "3"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [(
        "megamoe: error: num_stages: expected an integer in [4, 9] (at least one per issuing producer warp, at most what 115712 B of "
        "shared memory holds at block_m 16), got 3")]  # below the floor: one CTA per SM would not help
    assert main([*base, "--design", "megamoe-sm90", "--hardware", "h200", "--num-stages", "10"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [(
        "megamoe: error: num_stages: expected an integer in [4, 9] (at least one per issuing producer warp, at most what 115712 B of "
        "shared memory holds at block_m 16); two CTAs share each SM here (ctas_per_sm 1 allows more), got 10")]
    for bad in ("0", "3", "two", "1.5"):  # argparse's type error: exit 2 by SystemExit
        with pytest.raises(SystemExit) as e:
            main([*base, "--design", "megamoe-sm90", "--hardware", "h200", "--ctas-per-sm", bad])
        assert e.value.code == 2
        assert capsys.readouterr().err.strip().splitlines() == [
            f"megamoe: error: --ctas-per-sm: expected 1 or 2, got {bad!r}"]
    assert main([*base, "--design", "megamoe-sm90", "--hardware", "h200", "--num-stages", "3", "--ctas-per-sm", "1"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [(
        "megamoe: error: num_stages: expected an integer in [4, 16] (at least one per issuing producer warp, at most what 232448 B of "
        "shared memory holds at block_m 16), got 3")]
    assert main([*base, "--design", "megamoe-sm90", "--hardware", "h200", "--block-m", "32", "--ctas-per-sm", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("megamoe: error: ctas_per_sm: expected 1 at block_m 32, "), err
    assert main([*base, "--ctas-per-sm", "2"]) == 2  # the SM100 design: 2-CTA clusters, not CTAs sharing an SM
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("megamoe: error: ctas_per_sm: expected no value with design deepgemm-sm100"), err
    assert main([*base, "--design", "megamoe-sm90", "--hardware", "h200", "--num-stages", "4"]) == 0
    capsys.readouterr()
    assert main([*base, "--num-stages", "2"]) == 0


def test_sm90_pool_is_the_kernels_and_not_an_override(capsys):
    """megamoe-sm90 has no pool ring: a --pool-tokens override is refused in one line, and the
    plan reports the kernel's pool, sized for the buffer's max tokens (every routed row plus
    block padding per expert, by hand at block_m 16: 8192 x 6 + 256 x 15 = 52992 rows for the
    default 8192; align(64 x 6 + 256 x 15, 16) = 4224 for --max-tokens 64)."""
    base = ["simulate", "--shape", "deepseek-v4-flash", "--ranks", "1", "--tokens", "64", "--design", "megamoe-sm90",
            "--hardware", "h200"]
    assert main([*base, "--pool-tokens", "1"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [(
        "megamoe: error: pool_tokens: expected no override with design megamoe-sm90 (its pool holds every routed "
        "row, sized by the kernel), got 1")]
    assert main(base) == 0
    assert " pool=52992 tokens " in capsys.readouterr().out
    assert main([*base, "--max-tokens", "64"]) == 0
    assert " pool=4224 tokens " in capsys.readouterr().out


def test_plan_line_names_the_wave_lag_order_only_when_it_is_the_list(capsys):
    """At two CTAs per SM (V4-Flash EP1, 16 tokens on the H200: block_m 16) the SM90 plan's list
    is the wave-lag order; a --policy that replaces the list with another must not be labelled
    with it, the wave-lag scheduler as a policy is."""
    args = ["simulate", "--shape", "deepseek-v4-flash", "--ranks", "1", "--tokens", "16",
            "--design", "megamoe-sm90", "--hardware", "h200"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "x 2 CTAs (blocks by ticket, wave-lag order)" in out
    assert main([*args, "--policy", "wave-scheduler"]) == 0
    out = capsys.readouterr().out
    assert "x 2 CTAs (blocks by ticket)" in out and "wave-lag order" not in out
    assert "policies: " in out and "wave-scheduler" in out
    # the wave-lag scheduler as a policy gives the same list: named so
    assert main([*args, "--policy", "wave-lag"]) == 0
    out = capsys.readouterr().out
    assert "x 2 CTAs (blocks by ticket, wave-lag order)" in out and "scheduler=wave-lag" in out
    # at 3 tokens the two-CTA plan has one wave (block_m 16, 256 experts a wave), where the
    # wave-lag order is the plain one: not named
    assert main([a if a != "16" else "3" for a in args]) == 0
    out = capsys.readouterr().out
    assert "waves=1 " in out and "x 2 CTAs (blocks by ticket)" in out and "wave-lag order" not in out


def test_compare_says_when_the_trace_is_from_another_kernel_build():
    """A kernel trace recorded by another build than the one most SM90 figures were fitted to (the
    EP2 traces: v6.4, build fbc2931d; the H200 fit: v9.12, build 349f5e1e, named in 26 of the 31
    figures' sources, fbc2931d in 1) says so; a trace of the fitted build does not (fresh-user
    report, session 51: the EP2 trace's -32% came with no word)."""
    import re

    from sim.hardware import SM90_DESIGN_FIGURES, load_hardware

    hw = load_hardware("h200")
    named = [set(re.findall(r"build ([0-9a-f]{8})", hw.sources[k])) for k in SM90_DESIGN_FIGURES]
    assert (sum("349f5e1e" in b for b in named), sum("fbc2931d" in b for b in named), len(named)) == (26, 1, 31)
    traces = Path(__file__).resolve().parent.parent / "benchmarks" / "traces"
    rc, out, err = run("compare", str(traces / "kernel_flash_ep2_t64.npz"))
    assert rc == 0, err
    assert ("note: the trace was recorded by kernel build fbc2931d; 26 of H200's 31 SM90 figures were fitted to "
            "traces of build 349f5e1e (1 to this build's): part of a difference may be the kernel's own change "
            "between the builds") in " ".join(out.split())
    rc, out, err = run("compare", str(traces / "kernel_flash_ep1_t64.npz"))
    assert rc == 0 and "kernel build" not in out, err


def test_compare_says_when_the_hardware_is_not_the_traces():
    """`compare --hardware` with another GPU model than the one the trace's meta names (an H200
    trace simulated on the B200 preset, +70% apart) says so under the first line, as validate does
    for the published B200 rows, and that the SM90 figures there are estimates; the trace's own
    preset, named or by default, gives neither note."""
    trace = str(Path(__file__).resolve().parent.parent / "benchmarks" / "traces" / "kernel_flash_ep1_t1.npz")
    rc, out, err = run("compare", trace, "--hardware", "b200")
    assert rc == 0, err
    assert "note: the trace was recorded on hardware 'h200' (its meta); this run simulated it with 'b200' (B200)" in out
    # and, as simulate does, that the SM90 figures it was simulated with are estimates there
    # (compare --hardware b200 said nothing of it: session 48's left-alone list)
    assert ("note: design megamoe-sm90 on B200: none of its 31 SM90 figures is fitted to traces of our SM90 "
            "kernel on this GPU (the h200 preset's are): 31 are estimates") in " ".join(out.split())
    # the H100 preset takes them from its base, the h200 preset, where they are fitted: said so
    rc, out, err = run("compare", trace, "--hardware", "h100")
    assert rc == 0 and ("note: design megamoe-sm90 on H100: none of its 31 SM90 figures is fitted to traces of "
                        "our SM90 kernel on this GPU (the h200 preset's are): 31 are the h200 preset's fits, taken "
                        "through base") in " ".join(out.split()), err
    for extra in (["--hardware", "h200"], []):
        rc, out, err = run("compare", trace, *extra)
        assert rc == 0 and "note: the trace was recorded" not in out and "not fitted to traces" not in out, err


def test_simulate_says_when_the_sm90_figures_are_estimates():
    """The megamoe-sm90 design on a preset whose SM90 figures are estimates (B200, H20: most copied
    or rounded from earlier H200 fits) says so; on the H200 preset, where each is fitted to our
    kernel's traces or measured, it does not; the deepgemm-sm100 design, which uses none, neither."""
    from sim.hardware import SM90_DESIGN_FIGURES, load_hardware

    base = ("simulate", "--shape", "deepseek-v4-flash", "--ranks", "1", "--tokens", "16")
    for hw in ("b200", "h20"):
        n = sum(load_hardware(hw).sources[k].startswith("estimate") for k in SM90_DESIGN_FIGURES)
        assert n == len(SM90_DESIGN_FIGURES)  # the presets' own sources, read independently of the CLI
        rc, out, err = run(*base, "--design", "megamoe-sm90", "--hardware", hw)
        assert rc == 0, err
        assert (f"note: design megamoe-sm90 on {load_hardware(hw).name}: none of its {n} SM90 figures is fitted "
                f"to traces of our SM90 kernel on this GPU (the h200 preset's are): {n} are estimates"
                in " ".join(out.split()))
    assert not any(load_hardware("h200").sources[k].startswith("estimate") for k in SM90_DESIGN_FIGURES)
    for extra in (["--design", "megamoe-sm90", "--hardware", "h200"], ["--design", "deepgemm-sm100", "--hardware", "b200"]):
        rc, out, err = run(*base, *extra)
        assert rc == 0 and "SM90 figures" not in " ".join(out.split()), err


def test_sm90_design_figures_are_figures_and_described():
    import sim.hardware as h

    assert set(h.SM90_DESIGN_FIGURES) <= set(h._FIGURES)
    assert len(set(h.SM90_DESIGN_FIGURES)) == len(h.SM90_DESIGN_FIGURES)
    for k in h.SM90_DESIGN_FIGURES:
        assert f"``{k}``" in h.__doc__, k


def test_empty_or_padded_paths_and_whole_axis_values_are_shown_plainly(tmp_path):
    """An empty trace path is shown quoted (it read "got  (FileNotFoundError)"), and a sweep value
    that is its whole axis is not repeated ("got 'b300' in 'b300' (hardware: b300)")."""
    rc, _, err = run("compare", "")
    assert rc == 2 and err.strip() == "megamoe: error: trace: expected an .npz trace file, got '' (FileNotFoundError)"
    rc, _, err = run("sweep", "--set", "hardware=b300", "--out", str(tmp_path / "s"))
    assert rc == 2 and err.strip().endswith("or a .toml path, got 'b300'")
    rc, _, err = run("sweep", "--set", "hardware=h200,b300", "--out", str(tmp_path / "s"))
    assert rc == 2 and err.strip().endswith("got 'b300' in 'h200,b300'")
    rc, _, err = run("sweep", "--set", "routing=zipf:x", "--out", str(tmp_path / "s"))
    assert rc == 2 and err.strip().endswith("got 'zipf:x' (routing.zipf_exponent: x)")
    assert not (tmp_path / "s").exists()


def test_a_design_built_for_another_architecture_is_noted():
    """The default design (DeepGEMM's SM100 reference) on an SM90 preset is a what-if, and so is the
    SM90 design on the B200: a note names both architectures and the native design; the native
    pairings print no such note."""
    args = ("--shape", "deepseek-v4-flash", "--ranks", "1", "--tokens", "16")
    rc, out, _ = run("simulate", "--hardware", "h200", *args)
    out = " ".join(out.split())
    assert rc == 0 and ("note: design deepgemm-sm100 is built for SM100 GPUs and H200 is SM90: a what-if of that "
                        "design on H200's figures; --design megamoe-sm90 models the kernel that runs there") in out
    rc, out, _ = run("simulate", "--hardware", "b200", "--design", "megamoe-sm90", *args)
    out = " ".join(out.split())
    assert rc == 0 and "note: design megamoe-sm90 is built for SM90 GPUs and B200 is SM100" in out
    assert "--design deepgemm-sm100 models the kernel that runs there" in out
    for hw, design in (("h200", "megamoe-sm90"), ("h100", "megamoe-sm90"), ("b200", "deepgemm-sm100")):
        rc, out, _ = run("simulate", "--hardware", hw, "--design", design, *args)
        assert rc == 0 and "is built for" not in out, hw


def test_compare_names_the_call_it_simulated():
    """compare prints, above its first line, the scenario and rank 0's plan it simulated the trace
    as (the lines simulate prints): the 64-token H200 trace is V4-Flash EP1 at two CTAs per SM,
    block_m 16, the megamoe-sm90 design on the H200 preset (its meta, read independently)."""
    from megamoe.trace import Trace

    trace = str(Path(__file__).resolve().parent.parent / "benchmarks" / "traces" / "kernel_flash_ep1_t64.npz")
    meta = Trace.load(trace).meta
    rc, out, err = run("compare", trace)
    lines = out.splitlines()
    assert rc == 0, err
    assert lines[0].startswith("deepseek-v4-flash (E=256, k=6, H=4096, I=2048)  EP1  tokens/rank=64")
    assert f"hardware={meta['hardware'].upper()}" in lines[0] and f"design={meta['design']}" in lines[0]
    assert lines[1].startswith("plan (rank 0): block_m=16 ") and " x 2 CTAs" in lines[1]
    assert lines[2].startswith(f"{trace}: measured ")


def test_simulate_bounds_prints_the_probes_and_writes_them(tmp_path):
    """--bounds: a table row per probe (time and change as sim.studies.bounds computes them), the
    verdict line, and the same rows under 'bounds' in --json; without it neither."""
    from megamoe.scenario import Scenario
    from sim.studies import bound_verdict, bounds

    args = ["simulate", "--shape", "deepseek-v4-flash", "--ranks", "1", "--tokens", "16", "--hardware", "h200",
            "--design", "megamoe-sm90"]
    rc, out, err = run(*args, "--bounds", "--json", str(tmp_path / "b.json"))
    assert rc == 0, err
    want = bounds(Scenario(shape="deepseek-v4-flash", num_ranks=1, tokens_per_rank=16, hardware="h200",
                           design="megamoe-sm90"))
    flat = " ".join(out.split())
    for r in want["rows"]:
        assert f"│ {r['probe']}" in out and f"{r['time_us']:.1f} │ {100 * r['change']:+.1f}%" in flat
    assert " ".join(bound_verdict(want).split()) in flat
    saved = json.loads((tmp_path / "b.json").read_text())
    assert [(r["probe"], r["time_us"]) for r in saved["bounds"]] == [(r["probe"], r["time_us"]) for r in want["rows"]]
    assert saved["bounds_verdict"] == bound_verdict(want) and saved["time_us"] == want["time_us"]
    base_row = next(line for line in out.splitlines() if "(nothing: the call as it is)" in line)
    assert f" {want['time_us']:.1f} " in base_row  # the table's first row: what each change is against
    rc, out, _ = run(*args, "--json", str(tmp_path / "n.json"))
    assert rc == 0 and "what bounds it" not in out and "bounds" not in json.loads((tmp_path / "n.json").read_text())


def test_cli_page_bounds_example_is_the_simulation():
    """docs/simulator/cli.md's --bounds example (V4-Flash, 128 tokens per rank, eight B200s): its
    three percentages are sim.studies.bounds' for that call."""
    from megamoe.scenario import Scenario
    from sim.studies import bounds

    by = {r["probe"]: -100 * r["change"] for r in
          bounds(Scenario(shape="deepseek-v4-flash", num_ranks=8, tokens_per_rank=128))["rows"]}
    page = " ".join((Path(__file__).resolve().parents[1] / "docs/simulator/cli.md").read_text().split())
    assert (f"gains {by['grid syncs and NVLink barriers x0.5']:.1f}% from halving the syncs and barriers, "
            f"{by['HBM bandwidth x2']:.1f}% from twice the HBM, under 1% from the tensor cores or NVLink") in page
    assert by["tensor-core rate x2"] < 1 and by["NVLink bandwidth x2"] < 1


def test_two_cta_token_range_in_readme_and_help_is_the_design_rule():
    """The token range where the SM90 design runs two CTAs per SM on V4-Flash, one rank (README and
    simulate --help say 3-682), found by asking megamoe.design_sm90.design_for at every count."""
    from megamoe import design_sm90 as d

    two = [t for t in range(1, 2049) if d.design_for(t, 4096, 2048, 256, 6, num_sms=132).ctas_per_sm == 2]
    assert two == list(range(two[0], two[-1] + 1))  # one contiguous range
    span = f"{two[0]}-{two[-1]} tokens on V4-Flash"
    readme = " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text().split())
    rc, out, _ = run("simulate", "--help")
    assert f"from {two[0]} to {two[-1]} tokens on V4-Flash" in readme and span in " ".join(out.split()), span


def test_simulate_prints_the_hbm_per_rank_and_the_cli_page_quotes_it(tmp_path):
    """simulate's "HBM per rank" line is Plan.memory_per_rank of the call (in GB, its parts and
    total), --json has it under plan, and the CLI page's 6.70 GB for the default call is that total."""
    from megamoe.scenario import Scenario
    from sim import simulate

    mem = simulate(Scenario()).plan.memory_per_rank()
    rc, out, err = run("simulate", "--json", str(tmp_path / "d.json"))
    assert rc == 0, err
    assert ("HBM per rank (plan.memory_per_rank, the symmetric buffer's workspace left out): "
            + " + ".join(f"{k} {mem[k] / 1e9:.2f}" for k in ("weights", "pools", "combine", "input"))
            + f" = {mem['total'] / 1e9:.2f} GB") in " ".join(out.split())
    assert json.loads((tmp_path / "d.json").read_text())["plan"]["memory_per_rank_bytes"] == mem
    page = " ".join((Path(__file__).resolve().parents[1] / "docs/simulator/cli.md").read_text().split())
    assert f"8192 tokens per rank holds {mem['total'] / 1e9:.2f} GB a rank" in page


def test_the_plan_line_marks_a_wgmma_n_step_what_if_only_where_it_is_not_the_kernels():
    """The plan line names the WGMMA N step where it is finer than block_m, and marks it "(what-if)"
    only where it differs from the kernel's own step at that block_m: a v9.12 trace compared (step
    32 at block_m 128, from its meta) is the kernel's, 64 asked of simulate is a what-if (fresh-user
    report, session 52: compare called the traced kernel's own step a what-if)."""
    trace = str(Path(__file__).resolve().parent.parent / "benchmarks" / "traces" / "kernel_flash_ep1_t4096.npz")
    rc, out, err = run("compare", trace)
    assert rc == 0, err
    assert "WGMMA N step=32" in out and "WGMMA N step=32 (what-if)" not in out
    base = ("--design", "megamoe-sm90", "--hardware", "h200", "--shape", "deepseek-v4-flash", "--ranks", "1",
            "--tokens", "4096")
    rc, out, err = run("simulate", *base, "--wgmma-n-step", "64")
    assert rc == 0 and "WGMMA N step=64 (what-if)" in out, err
    rc, out, err = run("simulate", *base)
    assert rc == 0 and "WGMMA N step=32" in out and "(what-if)" not in out, err
