"""Hardware files: every figure sourced, bad figures rejected with the field named."""

import tomllib

import pytest

from megamoe.errors import InputError
from sim.hardware import PRESET_DIR, load_hardware, parse_hardware, preset_names


def test_presets_load_with_a_source_per_figure():
    assert preset_names() == ["b200", "h20", "h200"]
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


def _data():
    return tomllib.loads((PRESET_DIR / "b200.toml").read_text())


def test_negative_bandwidth_is_rejected():
    d = _data()
    d["figures"]["hbm_gbs"] = -1.0
    with pytest.raises(InputError, match=r"^hardware.figures.hbm_gbs: expected a positive number, got -1.0"):
        parse_hardware(d)


def test_missing_source_is_rejected():
    d = _data()
    del d["sources"]["nvlink_gbs_per_direction"]
    with pytest.raises(InputError, match="hardware.sources.nvlink_gbs_per_direction"):
        parse_hardware(d)


def test_unknown_preset_and_bad_path(tmp_path):
    with pytest.raises(InputError, match="^hardware"):
        load_hardware("a100")
    p = tmp_path / "x.toml"
    p.write_text("name = 3\n")
    with pytest.raises(InputError, match="hardware.name"):
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
