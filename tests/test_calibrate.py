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
    """sim/hardware/h200.toml's SM90 figures are what fit_sm90_traces gives for the committed
    FP8 WGMMA kernel traces and per-role profile (rounded), and each source names them."""
    import json
    from pathlib import Path

    from sim.calibrate import fit_sm90_traces

    prof = json.loads(Path(_root("benchmarks/results/kernel_profile_stages_h200.json")).read_text())
    fit = fit_sm90_traces([_root(p) for p in TRACES], prof)
    hw = load_hardware("h200")
    assert set(fit) == {"sm90_mma_fraction", "e2m1_decode_thread_ns_per_elem", "stage_handoff_ns",
                        "l1_epilogue_thread_ns_per_elem", "block_overhead_ns", "l2_epilogue_thread_ns_per_elem",
                        "pull_latency_ns", "grid_sync_ns"}
    for key, (value, how) in fit.items():
        assert getattr(hw, key) == pytest.approx(value, rel=2e-3, abs=0.5), key
        assert how in hw.sources[key] and "2026-11-30" in hw.sources[key] and "FP8 WGMMA" in hw.sources[key]
    # the slope: 10.3 ns per block row and K block = 418 TFLOP/s on 132 SMs, 29.5% of the FP8 GEMM
    assert fit["sm90_mma_fraction"][0] == pytest.approx(0.295, abs=0.002)


def test_one_trace_gives_the_same_mma_fraction():
    from sim.calibrate import from_kernel_trace

    hw = load_hardware("h200")
    got = from_kernel_trace(_root(TRACES[-1]), hw.fp8_dense_tflops * hw.mma_efficiency)
    assert got["sm90_mma_fraction"] == pytest.approx(hw.sm90_mma_fraction, rel=0.01)
    assert got["grid_sync_ns"] == 1696.0


def test_fit_needs_two_block_m():
    from megamoe.errors import InputError
    from sim.calibrate import fit_sm90_traces

    with pytest.raises(InputError, match="^fit_sm90_traces: expected traces of at least two block_m"):
        fit_sm90_traces([_root(TRACES[0]), _root(TRACES[1])])
