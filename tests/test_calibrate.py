"""megamoe calibrate: the TOML it writes loads and carries the measured figures (no GPU
needed for that part); without a GPU the command fails cleanly."""

import tomllib

import pytest

from megamoe.cli import main
from sim.calibrate import calibrated_toml
from sim.hardware import load_hardware, parse_hardware


def test_calibrated_toml_replaces_measured_figures(tmp_path):
    measured = {"device": "NVIDIA H200", "num_sms": 132, "l2_cache_bytes": 62914560,
                "smem_per_block_bytes": 232448, "copy_gbs": 4240.0, "fp8_gemm_tflops": 1424.0,
                "p2p_gbs": 385.0, "p2p_small_copy_ns": 9000.0}
    text = calibrated_toml("h200", measured, {"grid_sync_ns": 1234.0}, date="2026-11-30")
    hw = parse_hardware(tomllib.loads(text))
    base = load_hardware("h200")
    assert hw.hbm_efficiency == pytest.approx(4240.0 / 4800.0, abs=1e-4)
    assert hw.mma_efficiency == pytest.approx(1424.0 / 1979.0, abs=1e-4)
    assert hw.nvlink_efficiency == pytest.approx(385.0 / 450.0, abs=1e-4)
    assert hw.grid_sync_ns == 1234.0 and hw.nvlink_latency_ns == 9000.0
    assert hw.launch_ns == base.launch_ns  # not measured: kept with its source
    assert "2026-11-30" in hw.sources["hbm_efficiency"] and "NVIDIA H200" in hw.sources["mma_efficiency"]
    assert hw.sources["launch_ns"] == base.sources["launch_ns"]
    p = tmp_path / "c.toml"
    p.write_text(text)
    assert load_hardware(str(p)).num_sms == 132


def test_calibrate_without_gpu_is_a_clean_error(capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert main(["calibrate", "--out", "/tmp/never.toml"]) == 2
    assert "calibrate: expected a CUDA GPU" in capsys.readouterr().err


TRACES = [f"benchmarks/traces/kernel_flash_ep1_t{t}.npz" for t in (64, 512, 4096)]


def _root(p):
    from pathlib import Path

    return str(Path(__file__).resolve().parent.parent / p)


def test_h200_sm90_figures_are_the_fit_to_the_committed_traces():
    """sim/hardware/h200.toml's SM90 figures and their sources are what ``python -m
    sim.calibrate`` (refit_h200: fit_sm90_traces on the committed FP8 WGMMA + ballot scheduler
    traces and the per-role profile) writes: each source names the files, the date and the
    kernel version."""
    import json
    from pathlib import Path

    from sim.calibrate import SM90_FIT_KERNEL, SM90_FIT_PROFILE, SM90_FIT_TRACES, fit_sm90_traces, sm90_fit_sources

    assert list(SM90_FIT_TRACES) == TRACES
    prof = json.loads(Path(_root(SM90_FIT_PROFILE)).read_text())
    fit = fit_sm90_traces([_root(p) for p in TRACES], prof)
    hw = load_hardware("h200")
    assert set(fit) == {"sm90_mma_fraction", "e2m1_decode_thread_ns_per_elem", "stage_handoff_ns",
                        "sched_block_ns", "sched_step_ns", "l1_epilogue_thread_ns_per_elem", "block_overhead_ns",
                        "l2_epilogue_fixed_ns", "l2_epilogue_thread_ns_per_elem", "pull_latency_ns",
                        "combine_round_ns", "grid_sync_ns"}
    for key, (value, src) in sm90_fit_sources(fit).items():
        assert getattr(hw, key) == pytest.approx(fit[key][0], rel=2e-3, abs=0.5), key
        assert getattr(hw, key) == value and hw.sources[key] == src, key
        assert fit[key][1] in src and "2026-11-30" in src and SM90_FIT_KERNEL in src, key
        assert "kernel_flash_ep1_t{64,512,4096}.npz" in src, key
    # the slope: (1850 - 939.5 ns) / (128 - 16) rows = 8.13 ns per block row and K block (the
    # K-block times at block_m 16 and 128 quoted in the source); 128 weight rows x 128 K x 2 =
    # 32768 FLOP per row and K block -> 4.03 TFLOP/s per SM, 532 TFLOP/s on 132 SMs, 37.5% of
    # 1419 TFLOP/s
    assert fit["sm90_mma_fraction"][0] == pytest.approx(32768 / 8.13e-9 * 132 / 1419e12, abs=0.002)
    # the scheduler: ~0.75 us per block plus ~0.33 us per step
    assert fit["sched_block_ns"][0] == pytest.approx(748, abs=30)
    assert fit["sched_step_ns"][0] == pytest.approx(333, abs=15)


def test_one_trace_gives_the_same_mma_fraction():
    from sim.calibrate import from_kernel_trace

    hw = load_hardware("h200")
    got = from_kernel_trace(_root(TRACES[-1]), hw.fp8_dense_tflops * hw.mma_efficiency)
    assert got["sm90_mma_fraction"] == pytest.approx(hw.sm90_mma_fraction, rel=0.01)
    assert got["grid_sync_ns"] == 1568.0  # last arrival to first release in that trace


def test_fit_needs_two_block_m():
    from megamoe.errors import InputError
    from sim.calibrate import fit_sm90_traces

    with pytest.raises(InputError, match="^fit_sm90_traces: expected traces of at least two block_m"):
        fit_sm90_traces([_root(TRACES[0]), _root(TRACES[1])])


def test_refit_h200_rewrites_only_the_fitted_lines(tmp_path):
    """refit_h200 on a copy of the preset leaves it unchanged (the preset is its output) and
    fails cleanly when a figure line is missing."""
    from megamoe.errors import InputError
    from sim.calibrate import refit_h200
    from sim.hardware import PRESET_DIR

    p = tmp_path / "h200.toml"
    text = (PRESET_DIR / "h200.toml").read_text()
    p.write_text(text)
    refit_h200(toml_path=str(p))
    assert p.read_text() == text
    p.write_text(text.replace("sched_step_ns = ", "# sched_step_ns = ", 1))
    with pytest.raises(InputError, match="^refit_h200: expected one line for sched_step_ns in \\[figures\\]"):
        refit_h200(toml_path=str(p))
