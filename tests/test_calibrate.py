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
