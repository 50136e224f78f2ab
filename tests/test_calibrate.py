"""megamoe calibrate: the TOML it writes loads and carries the measured figures (no GPU
needed for that part); without a GPU the command fails cleanly."""

import re
import tomllib

import pytest

from megamoe.cli import main
from megamoe.errors import InputError
from sim.calibrate import calibrated_toml
from sim.hardware import load_hardware, parse_hardware


def test_calibrated_toml_replaces_measured_figures(tmp_path):
    measured = {"device": "NVIDIA H200", "num_sms": 132, "l2_cache_bytes": 62914560,
                "smem_per_block_bytes": 232448, "copy_gbs": 4240.0, "fp8_gemm_tflops": 1424.0,
                "p2p_gbs": 385.0}
    text = calibrated_toml("h200", measured, {"grid_sync_ns": 1234.0}, date="2026-11-30")
    hw = parse_hardware(tomllib.loads(text))
    base = load_hardware("h200")
    assert hw.hbm_efficiency == pytest.approx(4240.0 / 4800.0, abs=1e-4)
    assert hw.mma_efficiency == pytest.approx(1424.0 / 1979.0, abs=1e-4)
    assert hw.nvlink_efficiency == pytest.approx(385.0 / 450.0, abs=1e-4)
    assert hw.grid_sync_ns == 1234.0
    assert hw.arch == base.arch == "sm90"  # the base's family kept
    assert calibrated_toml("h100", measured).count('arch = "sm90"') == 1  # a derived preset's, from its base
    assert hw.launch_ns == base.launch_ns  # not measured: kept with its source
    # the NVLink round trip comes from EP kernel traces, not from a copy: kept from the base file
    assert hw.nvlink_latency_ns == base.nvlink_latency_ns
    assert hw.sources["nvlink_latency_ns"] == base.sources["nvlink_latency_ns"]
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


TRACES = [f"benchmarks/traces/kernel_flash_ep1_{t}.npz" for t in ("one_cta_t64", "one_cta_t512", "t4096")]


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

    from sim.calibrate import (
        SM90_FIT_DATE,
        SM90_FIT_KERNEL,
        SM90_FIT_PROFILE,
        SM90_FIT_TRACES,
        fit_sm90_traces,
        sm90_fit_sources,
    )

    assert list(SM90_FIT_TRACES) == TRACES
    prof = json.loads(Path(_root(SM90_FIT_PROFILE)).read_text())
    fit = fit_sm90_traces([_root(p) for p in TRACES], prof)
    hw = load_hardware("h200")
    assert set(fit) == {"sm90_mma_fraction", "sm90_promotion_ns_per_row", "e2m1_decode_thread_ns_per_elem",
                        "stage_handoff_ns",
                        "sm90_issue_kblock_ns", "sched_desc_ns", "sched_ahead_ns",
                        "l1_epilogue_thread_ns_per_elem", "block_overhead_ns",
                        "l2_epilogue_fixed_ns", "l2_epilogue_thread_ns_per_elem", "pull_latency_ns",
                        "combine_round_ns", "combine_round_serial_ns", "grid_sync_ns", "sm90_count_ns", "sm90_count_item_ns",
                        "sm90_mask_seen_ns", "sm90_mask_seen_relay_ns", "sm90_first_fill_ns",
                        "sm90_first_kloop_ns", "sm90_fetch_counts_ns"}
    for key, (value, src) in sm90_fit_sources(fit).items():
        assert getattr(hw, key) == pytest.approx(fit[key][0], rel=2e-3, abs=0.5), key
        assert getattr(hw, key) == value and hw.sources[key] == src, key
        assert fit[key][1] in src and SM90_FIT_DATE in src and SM90_FIT_KERNEL in src, key
        assert "kernel_flash_ep1_{one_cta_t64,one_cta_t512,t4096}.npz" in src, key
    # the slope: K blocks with two promotions of 332 / 333 ns at block_m 16 (the mean of the
    # median L1 K loop / 32 and L2 K loop / 16: T=64 (10432 / 32 + 5408 / 16) / 2 = (326 + 338) / 2,
    # T=512 (10432 / 32 + 5440 / 16) / 2 = (326 + 340) / 2) and 784 ns at block_m 128 (T=4096: the
    # L2 K loop, 12544 / 16; the L1 K block there is promoted once, 22016 / 32 = 688 ns; at block_m
    # 128 both medians are read over whole blocks only, valid rows > 96, as the fit reads them
    # (sim.calibrate.whole_blocks): from v9.12 a block_m 128 block runs its WGMMAs at N = its valid
    # rows rounded up to 32); least
    # squares over x = 16, 16, 128 puts the line through the mean of the block_m 16 points:
    # (784 - 332.5) / 112 = 4.031 ns per block_m row and K block; 128 weight rows x 128 K x 2 =
    # 32768 FLOP per row and K block -> 8.13 TFLOP/s per SM, 1073 TFLOP/s on 132 SMs, 75.6% of
    # 1419 TFLOP/s (kernel v9.12's traces; v9.11's: 330.5 / 330.5 / 798 ns (10400 / 32, 5376 / 16,
    # 10336 / 32, 5408 / 16, 12768 / 16, 21920 / 32; every block whole), 73.0%; v9.8's: 330 / 329.5 / 806 ns (10368 / 32, 5376 / 16,
    # 10336 / 32, 5376 / 16, 12896 / 16, 22144 / 32), 71.7%; v9.7's: 330.5 / 330 / 804 ns (10400 / 32, 5376 / 16, 10368 / 32,
    # 12864 / 16, 22144 / 32), 72.1%; v9.6's: 331.5 / 331 / 806 ns (10400 / 32, 5408 / 16, 10368 / 32,
    # 12896 / 16, 22112 / 32), 71.9%; v9.3.1's: 330 / 804 ns (10368 / 32, 5376 / 16, 12864 / 16,
    # 22144 / 32), 72.0%; v9.1's:
    # 329 / 798 ns (10304 / 32, 12768 / 16, 22016 / 32), 72.8%, its
    # block_m 16 K blocks 27 ns shorter than v9.0's, whose 356 / 800 ns gave 76.9%; v8.6's: 357 / 832 ns (T=512 (11296 / 32
    # + 5792 / 16) / 2, T=4096 13312 / 16, its L1 K block 21888 / 32 = 684 ns), 71.9%; v8.5's:
    # 356 / 826 ns, 72.6%; v8.4's: 358.25 / 834 ns, 71.8%; v8.3's: 355 / 356 / 912
    # ns, 61.4%; v8.2's: 369 / 368 / 928
    # ns, 61.0%; v8.1's: 368.5 / 368 / 922
    # ns, 61.7%; v8.0's: 360 / 361 / 916
    # ns, 61.4%; v7.9's: 363 / 363 / 922
    # ns, 61.1%; v7.8's: 361 / 361 / 920
    # ns, 61.1%; v7.6's: 364 / 364 / 894
    # ns, 64.4%; v7.5's: 364 / 364 / 884 ns, both GEMMs promoted twice, 65.7%; v7.4's: 381 /
    # 379 / 960 ns, 58.9%; v7.3's: 378 / 378.5 / 888.5 ns, 66.9%; v7.2's, from warpgroup 0:
    # 406.25 / 886.5 ns, 71.1%; v6.7's: 39.4%; v6.5's: 36.0%; v6.4's: 33.7%)
    assert fit["sm90_mma_fraction"][0] == pytest.approx(
        32768 / ((12544 / 16 - ((10432 / 32 + 5408 / 16) / 2 + (10432 / 32 + 5440 / 16) / 2) / 2) / 112 * 1e-9)
        * 132 / 1419e12, rel=1e-4)  # (the preset's FP8 GEMM rate is 1418.9 TFLOP/s, rounded here)
    # one promotion per block_m row: (784 - 688) / 128 = 0.750 ns (v9.12's traces, whole blocks only; v9.11's:
    # (798 - 685) / 128 = 0.883 ns; v9.8's: (806 - 692) / 128
    # = 0.891 ns; v9.7's: (804 - 692) / 128
    # = 0.875 ns; v9.6's: (806 - 691) / 128
    # = 0.898 ns; v9.3.1's: (804 - 692) / 128
    # = 0.875 ns; v9.1's: (798 - 688) / 128
    # = 0.859 ns; v9.0's: (800 - 693) / 128
    # = 0.836 ns; v8.6's: (832 - 684)
    # / 128 = 1.156 ns; v8.5's: (826 - 680) / 128
    # = 1.141 ns; v8.4's: (834 - 685) / 128
    # = 1.164 ns; v8.3's: (912 - 741) / 128
    # = 1.336 ns; v8.2's: (928 - 754) / 128
    # = 1.359 ns; v8.1's: (922 - 739) / 128 = 1.430 ns; v8.0's: (916 - 732) /
    # 128 = 1.4375 ns; v7.9's: (922 - 740) / 128 = 1.422 ns; v7.8's: (920 - 743) / 128 = 1.383 ns;
    # v7.6's: (894 - 797) / 128 = 0.758 ns)
    assert fit["sm90_promotion_ns_per_row"][0] == pytest.approx((12544 / 16 - 22016 / 32) / 128, rel=1e-9)
    # the scheduler's walk (sched_block_ns, sched_step_ns: 690 + 292 ns on v9.0's traces; v8.6's,
    # 860 + 283 ns; v7.2's 873 + 287) is no longer fitted: since v9.1 no trace's consumers walk
    # between the blocks (test_walk_figures_are_kept_from_kernel_v9_0)
    # the producer's copy issues in each CTA's first L1 block (ring empty): ~300 ns per K block
    # at T=64 and 512 (block_m 16, 16 stages), ~0.7-0.8 us at 4096 (block_m 128, 8 stages; kernel
    # v9.12's traces: 323 ns the smallest (T=64; 358 at T=512); v9.11's: 330.5 ns (T=64; 357 at T=512); v9.8's: 319 ns (T=64; 356 at T=512: block_m 16's
    # first fill is paced by arrivals since v9.8);
    # v9.7's: 321 ns (T=64; 328 at T=512); v9.6's: 332 ns (T=64; 334 at T=512); v9.3.1's: 308 ns; v9.1's: 332 ns; v9.0's: 294, 322 and 674 ns, the last issue 14.1, 14.6 and 8.4 K blocks before the
    # consumers' K loop ends; v8.6's traces: 293.5 ns at T=64; v8.5's: 296, 360 and 711 ns, the last issue 12.9, 11.2 and 8.8 K blocks before
    # the consumers' K loop ends; v8.4's: 300, 339 and 696 ns; v8.3's: 303, 342 and 770 ns; v8.2's: 301, 336 and 788 ns; v8.1's: 297, 339 and 806 ns; v8.0's: 296, 343 and 784 ns; v7.9's: 298, 350 and 804 ns; v7.8's:
    # 293, 319 and 710 ns), about a full ring everywhere
    # (four producer warps issue faster than the consumers free stages), so the figure is the
    # smallest, an upper bound
    assert fit["sm90_issue_kblock_ns"][0] == pytest.approx(323, abs=5)
    assert "upper bound" in fit["sm90_issue_kblock_ns"][1]
    assert re.search(r"T=4096 \(block_m 128\) [6-9]\d\d ns", fit["sm90_issue_kblock_ns"][1])
    # the combine round, fitted where the kernel loads a token's slots four at a time
    # (design_sm90.COMBINE_SLOTS, block_m >= 32; kernel v8.0): T=4096's slowest CTA 83904 ns over
    # ceil(4096 x 4096 / 8 / (132 x 512)) = ceil(31.03) = 32 rounds = 2622 ns (v9.12's trace; v9.11's:
    # 82400 ns, 2575; v9.8's:
    # 82208 ns, 2569; v9.7's:
    # 81856 ns, 2558; v9.6's:
    # 81728 ns, 2554; v9.3.1's:
    # 81760 ns, 2555; v9.1's:
    # 81920 ns, 2560; v9.0's: 81056 ns, 2533; v8.6's:
    # 80320 ns, 2510; v8.5's:
    # 80672 ns, 2521; v8.4's: 79840
    # ns, 2495; v8.3's: 79872
    # ns, 2496; v8.2's: 79136
    # ns, 2473; v8.1's: 76992
    # ns, 2406; v8.0's: 77696 ns, 2428; v7.9, one slot at a time everywhere: 3660 ns, the median of T=512 and 4096)
    assert fit["combine_round_ns"][0] == 83904 / 32
    assert "slots loaded 4 at a time: T=4096 (block_m 128)" in fit["combine_round_ns"][1]
    # and where it loads them one at a time (block_m 16; fitted since session 43): the one-CTA
    # T=512 trace's slowest CTA 14784 ns over ceil(512 x 4096 / 8 / (132 x 512)) = ceil(3.88) = 4
    # rounds = 3696 ns (v9.12's trace; v9.11's: 14272 ns, 3568; v9.8's: 14848 ns, 3712); the T=64 trace has one round, so it
    # is not in the fit
    assert fit["combine_round_serial_ns"][0] == 14784 / 4
    assert "slots loaded 1 at a time: T=512 (block_m 16) 14.78 us / 4" in fit["combine_round_serial_ns"][1]


def test_dispatch_start_line_is_least_squares_over_the_pull_starts():
    """sm90_count_ns / sm90_count_item_ns: the first pull's start (median over the 132 CTAs'
    pull records, read from the v9.12 traces: T=64 6752 ns, T=512 7168 ns, T=4096 11648 ns; v9.11's:
    7040, 7264 and 11696 ns; v9.8's:
    6592, 7168 and 11872 ns; v9.7's:
    7232, 7360 and 11824 ns; v9.6's:
    7024, 7552 and 11600 ns; v9.3.1's:
    7104, 7456 and 11184 ns; v9.1's:
    6848, 7616 and 11328 ns; v9.0's: 6208, 6944 and 11344 ns; v8.6's: 6176, 6624 and 12048 ns) less
    grid_sync_ns (736 ns, the median of the three traces' 736 / 768 / 736 ns; v9.11's: 768 ns), against the largest CTA's share of the T k = 6 T items, ceil(6 T / 132): 3, 24,
    187; the least-squares line by its closed form."""
    from sim.calibrate import fit_sm90_traces

    fit = fit_sm90_traces([_root(p) for p in TRACES])
    x = [3.0, 24.0, 187.0]
    y = [6752.0 - 736.0, 7168.0 - 736.0, 11648.0 - 736.0]
    mx, my = sum(x) / 3, sum(y) / 3
    slope = sum((a - mx) * (b - my) for a, b in zip(x, y)) / sum((a - mx) ** 2 for a in x)
    assert fit["grid_sync_ns"][0] == 736.0
    assert fit["sm90_count_item_ns"][0] == pytest.approx(slope, rel=1e-9)  # 26.94 ns (v9.11's: 26.02; v9.8's: 28.76; v9.7's: 25.88; v9.6's: 24.86; v9.3.1's: 22.44; v9.1's: 23.75; v9.0's: 27.56; v8.6's: 32.43)
    assert fit["sm90_count_ns"][0] == pytest.approx(my - slope * mx, rel=1e-9)  # 5865 ns (v9.11's: 6042; v9.8's: 5757; v9.7's: 6223; v9.6's: 6216; v9.3.1's: 6245; v9.1's: 6199; v9.0's: 5495; v8.6's: 5265)
    assert "T=4096 11.65 us at 187 items" in fit["sm90_count_ns"][1]


def test_one_trace_gives_the_same_mma_fraction():
    from sim.calibrate import from_kernel_trace

    hw = load_hardware("h200")
    got = from_kernel_trace(_root(TRACES[-1]), hw.fp8_dense_tflops * hw.mma_efficiency)
    assert got["sm90_mma_fraction"] == pytest.approx(hw.sm90_mma_fraction, rel=0.01)
    # the grid sync before the combine: last arrival (2563488 ns) to first release (2564224 ns)
    # (v9.12's trace; v9.11's: 2772544 to 2773312 ns; v9.8's: 2791232 to 2791968 ns; v9.7's: 2796864 to 2797600 ns; v9.6's: 2777536 to 2778304 ns; v9.3.1's: 2778528 to 2779264 ns; v9.1's: 2765152 to 2765888 ns; v9.0's: 2803072 to 2803776 ns; v8.6's: 2896224 to 2896960 ns)
    assert got["grid_sync_ns"] == 2564224 - 2563488


def test_mask_seen_figures_are_the_medians_of_the_producers_waits():
    """sm90_mask_seen_relay_ns / sm90_mask_seen_ns: the median, over every L2 producer wait in the
    fit traces, of the wait's end less the later end of the two L1 epilogues whose mask bits it
    waited for (L2 K block kb: L1 n blocks 2 kb, 2 kb + 1), pooled over the traces whose block_m
    relays the release (64 and 512 tokens, block_m 16) and over the others (4096, block_m 128).
    Recomputed here record by record; the medians read 1568 / 1568 ns at 64 / 512 tokens (1568
    pooled) and 960 ns at 4096 (v9.12's traces; v9.11's: 1536 / 1536 ns, 1536 pooled, and 960 ns; v9.8's: 1536 / 1600 ns, 1568 pooled, and 960 ns; v9.7's: 1504 / 1536 ns, 1504 pooled, and 960 ns; v9.6's: 1536 / 1568 ns, 1536 pooled, and 928 ns; v9.3.1's: 1504 / 1552 ns, 1504 pooled, and 960 ns; v9.1's: 1536 / 1536 ns, 1536 pooled, and 960 ns; v9.0's: 1600 / 1552 ns, 1568 pooled, and 864 ns;
    v8.6's: 1536 / 1568 ns, 1536 pooled, and 928 ns)."""
    import numpy as np

    from megamoe.trace import KIND, ROLE, Trace
    from sim.calibrate import fit_sm90_traces

    fit = fit_sm90_traces([_root(p) for p in TRACES])
    pooled = {True: [], False: []}
    medians = {}
    for p in TRACES:
        t = Trace.load(_root(p))
        k = t["kind"]
        epi = {}
        for i in np.nonzero(k == KIND["l1_epilogue"])[0]:
            epi[(int(t["expert"][i]), int(t["m_block"][i]), int(t["n_block"][i]))] = float(t["t_end_ns"][i])
        l2 = {(int(t["sm"][i]), int(t["expert"][i]), int(t["m_block"][i]), int(t["n_block"][i]))
              for i in np.nonzero(k == KIND["l2_load"])[0]}
        lat = []
        for i in np.nonzero((k == KIND["idle_wait"]) & (t["role"] == ROLE["producer"]))[0]:
            ex, mb, kb = int(t["expert"][i]), int(t["m_block"][i]), int(t["tokens"][i])
            if (int(t["sm"][i]), ex, mb, int(t["n_block"][i])) in l2:
                lat.append(float(t["t_end_ns"][i]) - max(epi[(ex, mb, 2 * kb)], epi[(ex, mb, 2 * kb + 1)]))
        medians[int(t.meta["tokens_per_rank"][0])] = float(np.median(lat))
        pooled[int(t.meta["plan"]["block_m"]) == 16] += lat
    assert medians == {64: 1568.0, 512: 1568.0, 4096: 960.0}
    assert fit["sm90_mask_seen_relay_ns"][0] == float(np.median(pooled[True])) == 1568.0
    assert fit["sm90_mask_seen_ns"][0] == float(np.median(pooled[False])) == 960.0
    hw = load_hardware("h200")
    assert (hw.sm90_mask_seen_relay_ns, hw.sm90_mask_seen_ns) == (1568.0, 960.0)


def _consumer_gaps(t):
    """Read straight from a trace's records: each consumer MMA record that follows an epilogue
    record of the same SM, the gap between the two (ns), and the scheduler's chunk scans and
    chunk skips between their blocks (sim.engine.sm90_walk_steps on the trace's own plan):
    three float arrays."""
    import itertools

    import numpy as np

    from megamoe.trace import KIND
    from sim.calibrate import _sm90_plan
    from sim.engine import sm90_walk_steps

    rp = _sm90_plan(t).ranks[0]
    key, _ = sm90_walk_steps(rp)
    S = rp.num_sms
    mma, epi = (KIND["l1_mma"], KIND["l2_mma"]), (KIND["l1_epilogue"], KIND["l2_epilogue"])
    gs, scans, skips = [], [], []
    for sm in range(S):
        at = {tuple(b[:4]): k for b, k in zip(rp.sm_blocks(sm).tolist(), key[sm::S].tolist())}
        c = t.where(sm=sm, role="consumer")
        o = np.argsort(c["t_start_ns"], kind="stable")
        recs = list(zip(c["kind"][o].tolist(), c["expert"][o].tolist(), c["m_block"][o].tolist(),
                        c["n_block"][o].tolist(), c["t_start_ns"][o].tolist(), c["t_end_ns"][o].tolist()))
        for prev, cur in itertools.pairwise(recs):
            if cur[0] in mma and prev[0] in epi:
                k0 = at[(1 if prev[0] == KIND["l1_epilogue"] else 2, prev[1], prev[2], prev[3])]
                k1 = at[(1 if cur[0] == KIND["l1_mma"] else 2, cur[1], cur[2], cur[3])]
                gs.append(cur[4] - prev[5])
                scans.append(k1[0] - k0[0])
                skips.append(k1[1] - k0[1])
    return np.array(gs, float), np.array(scans, float), np.array(skips, float)


def test_walk_figures_are_kept_from_kernel_v9_0():
    """Since kernel v9.1 no committed trace's consumers walk the scheduler between two blocks (block_m
    16 reads the producer's descriptors, block_m >= 32 walks inside the epilogue), so the fit does
    not produce the walk's figures and refit_h200 leaves them as fitted to v9.0's traces (the walk's
    code is unchanged; the producer still runs it): the consumer gaps of the 1-token trace (the
    wide walk, every gap 4-8 chunk skips) no longer pay for the skips."""
    import json
    from pathlib import Path

    from megamoe.trace import Trace
    from sim.calibrate import SM90_FIT_PROFILE, SM90_SKIP_FIT_TRACE, fit_sm90_traces

    fit = fit_sm90_traces([_root(p) for p in TRACES], json.loads(Path(_root(SM90_FIT_PROFILE)).read_text()))
    assert not {"sched_block_ns", "sched_step_ns", "sched_skip_ns"} & set(fit)
    hw = load_hardware("h200")
    for key in ("sched_block_ns", "sched_step_ns", "sched_skip_ns"):
        assert hw.sources[key].startswith("kept from the fit to kernel v9.0's traces"), key
        assert "BLOCK_DESCRIPTORS" in hw.sources[key] and "v9.0" in hw.sources[key], key
    g, sc, sk = _consumer_gaps(Trace.load(_root(SM90_SKIP_FIT_TRACE)))
    assert not sc.any() and sk.min() >= 4  # the plan's walk: skips only
    # under v9.0 a gap was 690 ns + ~140 ns per skip, 1250-1670 ns at 4-7 skips; under v9.1 the
    # shortest gap at each of those counts is ~350-400 ns (no walk in it; the longer ones wait for
    # the L1 -> L2 hand-off)
    for k in (4, 5, 6, 7):
        assert g[sk == k].min() < 500, k


def test_sched_ahead_is_the_mean_gap_of_the_walk_inside_the_epilogue():
    """sched_ahead_ns (kernel v9.0: at block_m >= 32 the consumers walk to the next block inside the
    epilogue, design_sm90.WALK_IN_EPILOGUE): the consumer gap's fixed part there, the mean over the
    fit traces of that block_m (T=4096, block_m 128; each trace weighted equally, so one trace's
    plain mean) of gap - sched_step_ns x chunk scans, over the gaps without chunk skips. Read here
    from the trace's records directly (each consumer MMA record after an epilogue record of the
    same SM, the scans and skips from sim.engine.sm90_walk_steps between the two blocks): 16252
    gaps, none with a skip, 12160 without a scan (median 320 ns) and 4092 with one; the mean
    313 ns less 292 ns per scan (v9.6's traces; v9.1's: 315 ns; v9.0's: 306 ns), against the 690 ns fixed part of
    the walk between the blocks (v9.0's block_m 16 traces)."""
    import json
    from pathlib import Path

    import numpy as np

    from megamoe.design_sm90 import WALK_IN_EPILOGUE
    from megamoe.trace import Trace
    from sim.calibrate import SM90_FIT_DATE, SM90_FIT_PROFILE, fit_sm90_traces

    fit = fit_sm90_traces([_root(p) for p in TRACES], json.loads(Path(_root(SM90_FIT_PROFILE)).read_text()))
    inside = [p for p in TRACES if WALK_IN_EPILOGUE[int(Trace.load(_root(p)).meta["plan"]["block_m"])]]
    assert inside == [TRACES[-1]]  # T=4096; T=64 and 512 (block_m 16) read block descriptors
    g, sc, sk = _consumer_gaps(Trace.load(_root(TRACES[-1])))
    z = sk == 0
    assert len(g) == int(z.sum()) == 16252 and int((sc == 0).sum()) == 12160 and int((sc == 1).sum()) == 4092
    hw = load_hardware("h200")
    step = hw.sched_step_ns
    got = fit["sched_ahead_ns"][0]
    assert got == pytest.approx(float(np.mean(g[z] - step * sc[z])), rel=1e-9)  # 313.3 ns (v9.6; v9.3.1: 310.5)
    assert abs(got - float(np.median(g[z & (sc == 0)]))) <= 20  # the median gap without a scan: 320 ns
    assert got < hw.sched_block_ns  # walked ahead: 313 ns against 690 ns
    assert 250 <= got <= 400
    assert hw.sched_ahead_ns == pytest.approx(got, rel=2e-3) and hw.sched_ahead_ns < hw.sched_block_ns
    assert "WALK_IN_EPILOGUE" in hw.sources["sched_ahead_ns"] and SM90_FIT_DATE in hw.sources["sched_ahead_ns"]


def test_combine_start_is_the_median_gap_after_the_release():
    """sm90_combine_start_ns / sm90_combine_start_pair_ns: per CTA, its combine record's start less
    the end of its last grid-sync record (its release), pooled over the one-CTA fit traces (64, 512,
    4096 tokens) and over the two-CTA pair-fit trace (64 tokens); the medians. Read here from the
    NPZ arrays with a loop per CTA: 608 and 1280 ns (kernel v9.12's traces; v9.11's: 608 and 1248 ns)."""
    import numpy as np

    from megamoe.trace import KIND
    from sim.calibrate import SM90_FIT_TRACES, SM90_PAIR_FIT_TRACES, fit_sm90_combine_start

    def gaps(p):
        d = np.load(_root(p))
        out = []
        for c in np.unique(d["sm"][d["kind"] == KIND["combine"]]):
            g = np.nonzero((d["kind"] == KIND["grid_sync"]) & (d["sm"] == c))[0]
            last = g[np.argmax(d["t_start_ns"][g])]
            cb = np.nonzero((d["kind"] == KIND["combine"]) & (d["sm"] == c))[0]
            out += [float(d["t_start_ns"][i] - d["t_end_ns"][last]) for i in cb]
        return out

    one = [x for p in SM90_FIT_TRACES for x in gaps(p)]
    two = [x for p in SM90_PAIR_FIT_TRACES for x in gaps(p)]
    assert (np.median(one), np.median(two)) == (608.0, 1280.0)
    fit = fit_sm90_combine_start([_root(p) for p in (*SM90_FIT_TRACES, *SM90_PAIR_FIT_TRACES)])
    assert fit["sm90_combine_start_ns"][0] == 608.0 and fit["sm90_combine_start_pair_ns"][0] == 1280.0
    hw = load_hardware("h200")
    assert (hw.sm90_combine_start_ns, hw.sm90_combine_start_pair_ns) == (608.0, 1280.0)
    with pytest.raises(InputError, match="^fit_sm90_combine_start: expected a trace at 2 CTAs per SM, got none"):
        fit_sm90_combine_start([_root(p) for p in SM90_FIT_TRACES])


def test_count_pair_is_the_two_cta_start_beyond_the_one_cta_line():
    """sm90_count_pair_ns: on the two-CTA count-barrier traces (64, 256, 512 tokens: 264 CTAs, the
    most items a CTA counts ceil(T x 6 / 264) = 2, 6, 12) the median over the CTAs' pull records of
    their start, less sm90_count_ns + share x sm90_count_item_ns + grid_sync_ns of the H200 file (the
    one-CTA line); the median over the three. Read here with numpy from the NPZ arrays: +1.95 /
    +2.07 / +1.40 us, 1.95 us (kernel v9.12's traces and line; v9.11's: +2.31 / +1.77 / +1.36 us, 1.77 us)."""
    import numpy as np

    from megamoe.trace import KIND
    from sim.calibrate import SM90_COUNT_PAIR_FIT_TRACES, fit_sm90_count_pair

    hw = load_hardware("h200")
    ex = []
    for p, share in zip(SM90_COUNT_PAIR_FIT_TRACES, (2, 6, 12)):
        d = np.load(_root(p))
        w = d["kind"] == KIND["pull"]
        start = float(np.median(d["t_start_ns"][w] - d["t_start_ns"].min()))
        ex.append(start - (hw.sm90_count_ns + share * hw.sm90_count_item_ns + hw.grid_sync_ns))
    assert [round(x / 10) * 10 for x in ex] == [1950, 2070, 1400]
    fit = fit_sm90_count_pair([_root(p) for p in SM90_COUNT_PAIR_FIT_TRACES], hw)
    assert fit["sm90_count_pair_ns"][0] == pytest.approx(float(np.median(ex)), rel=1e-12)
    assert hw.sm90_count_pair_ns == float(f"{np.median(ex):.4g}")
    with pytest.raises(InputError, match="^fit_sm90_count_pair: expected one-rank traces at two CTAs per SM"):
        fit_sm90_count_pair([_root("benchmarks/traces/kernel_flash_ep1_one_cta_t64.npz")], hw)


def test_pull_line_is_least_squares_over_the_one_cta_traces():
    """sm90_pull_base_ns + sm90_pull_warp_ns x pulling warps: per one-CTA trace (1 token, one-CTA 64
    and 512, 1024), each CTA's pull record over its rounds (ceil(items / 4)) less its fold rounds
    (8 x pull_fold_chunk_ns, or 2 where a lone item's four warps share the row at block_m 16), the
    median over the CTAs with items, against the warps pulling in the first round (items up to four
    per CTA, four for a lone item); an ordinary least-squares line through the four points, here with
    numpy's lstsq on a design matrix built from the NPZ arrays with plain loops. Medians read:
    2012 / 3248 / 3827 / 3832 ns at 24 / 384 / 528 / 528 warps; line 1912 ns + 3.60 ns per warp
    (kernel v9.12's traces; v9.11's: 2076 / 3376 / 3800 / 3969 ns, 1992 ns + 3.59 ns per warp)."""
    import numpy as np

    from megamoe.trace import KIND, Trace
    from sim.calibrate import SM90_PULL_FIT_TRACES, fit_sm90_pull

    hw = load_hardware("h200")
    fold = hw.pull_fold_chunk_ns
    xs, ys = [], []
    for p in SM90_PULL_FIT_TRACES:
        d = np.load(_root(p))
        meta = Trace.load(_root(p)).meta
        T, K, S, bm = meta["tokens_per_rank"][0], meta["top_k"], meta["num_sms"], meta["plan"]["block_m"]
        ids = d["topk_idx_0"].reshape(-1)
        items = [sum(1 for i in range(T * K * c // S, T * K * (c + 1) // S) if ids[i] >= 0) for c in range(S)]
        per, busy = [], 0
        for c in range(S):
            n = items[c]
            lone = n == 1 and bm == 16
            busy += 4 if lone else min(n, 4)
            if n == 0:
                continue
            w = (d["kind"] == KIND["pull"]) & (d["sm"] == c)
            assert w.sum() == 1
            dur = float(d["t_end_ns"][w][0] - d["t_start_ns"][w][0])
            per.append(dur / -(-n // 4) - (2 if lone else 8) * fold)
        xs.append(busy)
        ys.append(float(np.median(per)))
    assert xs == [24, 384, 528, 528]
    assert [round(y) for y in ys] == [2012, 3248, 3827, 3832]
    (base, slope), *_ = np.linalg.lstsq(np.column_stack([np.ones(4), xs]), np.array(ys), rcond=None)
    fit = fit_sm90_pull([_root(p) for p in SM90_PULL_FIT_TRACES], fold)
    assert fit["sm90_pull_base_ns"][0] == pytest.approx(base, rel=1e-9)
    assert fit["sm90_pull_warp_ns"][0] == pytest.approx(slope, rel=1e-9)
    assert hw.sm90_pull_base_ns == float(f"{base:.4g}") == 1912.0 and hw.sm90_pull_warp_ns == float(f"{slope:.4g}")
    assert "1912 ns + 3.60 ns per warp" in fit["sm90_pull_base_ns"][1]


def test_first_fill_is_the_median_lag_from_first_issue_to_first_mma():
    """sm90_first_fill_ns (the ring's first fill at the call's start): over every CTA of the fit
    traces whose consumers read block descriptors (block_m 16: the one-CTA traces at 64 and 512
    tokens), the time from the CTA's first copy issue (its first L1 block's load record's start, or
    the end of that block's arrival wait if later) to its first L1 MMA record (which starts at the
    first stage's arrival there), the median over the 264 CTAs. Read here straight from the NPZ
    arrays: per-trace medians 1840 / 2688 ns, pooled 2368 ns (kernel v9.12's traces; v9.11's: 1728 / 2336
    ns, pooled 1888 ns; v9.8's: 2048 / 2496
    ns, pooled 2208 ns), over two and a half times
    one tma_latency_ns (716 ns, the copy-engine probe's 8 KiB copy with all SMs loading)."""
    import numpy as np

    from megamoe.design_sm90 import BLOCK_DESCRIPTORS
    from megamoe.trace import KIND, ROLE, Trace
    from sim.calibrate import fit_sm90_traces

    lags, medians = [], []
    for p in TRACES:
        if not BLOCK_DESCRIPTORS[int(Trace.load(_root(p)).meta["plan"]["block_m"])]:
            continue  # T=4096, block_m 128: the consumers' record starts at their walk, not the data
        d = np.load(_root(p))
        k, sm = d["kind"], d["sm"]
        mine = []
        for c in np.unique(sm[k == KIND["l1_mma"]]):
            m = np.nonzero((k == KIND["l1_mma"]) & (sm == c))[0]
            i = m[np.argmin(d["t_start_ns"][m])]
            key = (sm == c) & (d["expert"] == d["expert"][i]) & (d["m_block"] == d["m_block"][i]) \
                & (d["n_block"] == d["n_block"][i])
            ld = np.nonzero(key & (k == KIND["l1_load"]))[0]
            iw = np.nonzero(key & (k == KIND["idle_wait"]) & (d["role"] == ROLE["producer"]))[0]
            assert len(ld) == 1
            t0 = max(float(d["t_start_ns"][ld[0]]), float(d["t_end_ns"][iw].max()) if len(iw) else 0.0)
            mine.append(float(d["t_start_ns"][i]) - t0)
        medians.append(float(np.median(mine)))
        lags += mine
    assert len(lags) == 264 and medians == [1840.0, 2688.0]
    fit = fit_sm90_traces([_root(p) for p in TRACES])
    got = fit["sm90_first_fill_ns"][0]
    assert got == float(np.median(lags)) == 2368.0
    hw = load_hardware("h200")
    assert hw.sm90_first_fill_ns == got and 2 * hw.tma_latency_ns < got < 5000.0
    assert "T=64 (block_m 16, median 1.84 us), T=512 (block_m 16, median 2.69 us)" in fit["sm90_first_fill_ns"][1]


def test_first_kloop_is_the_median_excess_of_each_ctas_first_l1_block():
    """sm90_first_kloop_ns (the first K loop where kernel v9.8 paces the ring's first fill by
    arrivals, block_m 16): over every CTA of the block_m 16 fit traces (the one-CTA traces at 64 and
    512 tokens) with two or more L1 MMA records, its first record's duration less the median of its
    later ones; the median over the 264 CTAs. Read here straight from the NPZ arrays with a plain
    loop per CTA: per-trace medians 0.96 / 2.38 us, pooled 1632 ns (kernel v9.12's traces; v9.11's:
    1.53 / 2.58 us, pooled 1896 ns). The
    block_m 128 trace (4096 tokens, the whole ring at once) is left out: its first record holds the
    wait for the pull (19.1 us; v9.11's: 16.6 us)."""
    import numpy as np

    from megamoe.design_sm90 import FIRST_FILL_PER_SM
    from megamoe.trace import KIND, Trace
    from sim.calibrate import fit_sm90_traces

    pooled, medians = [], []
    for p in TRACES:
        if not FIRST_FILL_PER_SM[int(Trace.load(_root(p)).meta["plan"]["block_m"])]:
            continue
        d = np.load(_root(p))
        k, sm = d["kind"], d["sm"]
        mine = []
        for c in np.unique(sm[k == KIND["l1_mma"]]):
            m = np.nonzero((k == KIND["l1_mma"]) & (sm == c))[0]
            m = m[np.argsort(d["t_start_ns"][m], kind="stable")]
            dur = (d["t_end_ns"][m] - d["t_start_ns"][m]).astype(np.float64)
            if len(dur) >= 2:
                mine.append(dur[0] - float(np.median(dur[1:])))
        medians.append(round(float(np.median(mine))))
        pooled += mine
    assert len(pooled) == 264 and medians == [960, 2384]
    fit = fit_sm90_traces([_root(p) for p in TRACES])
    got = fit["sm90_first_kloop_ns"][0]
    assert got == float(np.median(pooled)) == 1632.0
    assert load_hardware("h200").sm90_first_kloop_ns == got
    assert "T=64 (block_m 16, median 0.96 us), T=512 (block_m 16, median 2.38 us): 1.63 us" in fit["sm90_first_kloop_ns"][1]


def test_fetch_counts_is_the_first_walk_start_less_the_walk():
    """sm90_fetch_counts_ns (the schedulers' read of the published counts before their first walk):
    per fit trace the median over its 132 CTAs of the time from the CTA's first pull record (its
    counts ready) to its producer's first load record (read here from the NPZ arrays: 1888 / 1472 /
    3040 ns at 64 / 512 / 4096 tokens on v9.12's traces; v9.11's: 1824 / 2160 / 2624 ns; v9.8's: 1760 / 1936 / 2528 ns), the median over
    the traces (1888 ns; v9.11's: 2160 ns) less the first walk's fixed part, sched_block_ns (690.2 ns, fitted to v9.0's
    traces and kept): 1197.8, written 1198 ns (v9.11's: 1469.8, written 1470 ns)."""
    import numpy as np

    from megamoe.trace import KIND
    from sim.calibrate import fit_sm90_traces

    medians = []
    for p in TRACES:
        d = np.load(_root(p))
        k, sm = d["kind"], d["sm"]
        pull, load = k == KIND["pull"], (k == KIND["l1_load"]) | (k == KIND["l2_load"])
        per = [float(d["t_start_ns"][load & (sm == c)].min() - d["t_start_ns"][pull & (sm == c)].min())
               for c in np.unique(sm[load]) if (pull & (sm == c)).any()]
        assert len(per) == 132
        medians.append(float(np.median(per)))
    assert medians == [1888.0, 1472.0, 3040.0]
    hw = load_hardware("h200")
    fit = fit_sm90_traces([_root(p) for p in TRACES])
    assert fit["sm90_fetch_counts_ns"][0] == pytest.approx(1888.0 - hw.sched_block_ns, abs=1e-9)  # 690.2 ns
    assert hw.sm90_fetch_counts_ns == float(f"{fit['sm90_fetch_counts_ns'][0]:.4g}") == 1198.0


def test_local_count_is_the_median_first_pull_of_the_local_count_traces():
    """sm90_local_count_ns (the local count: kernel v8.9 at one CTA per SM, v9.7 at two): the preset
    holds the median over the local-count traces (1 token at one CTA, 3 / 6 / 8 / 12 / 16 at two) of
    each trace's median pull-record start, read here from the NPZ arrays with numpy: 4560 / 5344 /
    5216 / 4928 / 5536 / 4672 ns in v9.12's traces, so (4928 + 5216) / 2 = 5072 ns (v9.11's: 4288 / 5184 /
    5184 / 5184 / 5056 / 4544 ns, 5120 ns; v9.8's: 4512 / 5312
    / 6160 / 6464 / 5536 / 5472 ns, 5504 ns). Until the
    forty-second session it was read off the 1-token trace alone (v9.6: 4672 ns; v9.7: 5936 ns, the
    same one-CTA code: the call's start moves by ~1 us; v9.3.1: 5024; v9.1: 4384; v9.0: 3200; v8.9:
    3264; v8.8's trace, with the count barrier, put it at 5.34 us). A trace whose plan has the count
    barrier is refused, and so is an empty list."""
    import numpy as np

    from megamoe.errors import InputError
    from megamoe.trace import KIND
    from sim.calibrate import (
        SM90_LOCAL_COUNT_FIT_TRACES,
        SM90_SKIP_FIT_KERNEL,
        fit_sm90_local_count,
    )

    assert list(SM90_LOCAL_COUNT_FIT_TRACES) == [f"benchmarks/traces/kernel_flash_ep1_t{t}.npz"
                                                 for t in (1, 3, 6, 8, 12, 16)]
    medians = []
    for p in SM90_LOCAL_COUNT_FIT_TRACES:
        d = np.load(_root(p))
        starts = d["t_start_ns"][d["kind"] == KIND["pull"]]
        assert len(starts) in (132, 264) and d["t_start_ns"].min() == 0.0
        assert not (d["kind"][d["t_start_ns"] < starts.min()] == KIND["grid_sync"]).any()  # no count barrier
        medians.append(float(np.median(starts)))
    assert medians == [4560.0, 5344.0, 5216.0, 4928.0, 5536.0, 4672.0]
    got, how = fit_sm90_local_count([_root(p) for p in SM90_LOCAL_COUNT_FIT_TRACES])["sm90_local_count_ns"]
    assert got == float(np.median(medians)) == (4928.0 + 5216.0) / 2
    hw = load_hardware("h200")
    assert hw.sm90_local_count_ns == got
    src = hw.sources["sm90_local_count_ns"]
    assert "kernel_flash_ep1_t{1,3,6,8,12,16}.npz" in src and SM90_SKIP_FIT_KERNEL in src and how in src
    assert "fit_sm90_local_count" in src and "T=3 (2 CTAs per SM, 264 CTAs) 5.34 us" in how
    with pytest.raises(InputError, match="^fit_sm90_local_count: expected a one-rank trace whose plan counts locally"):
        fit_sm90_local_count([_root(TRACES[0])])
    with pytest.raises(InputError, match="^fit_sm90_local_count: expected at least one trace, got none"):
        fit_sm90_local_count([])
    with pytest.raises(InputError, match="^fit_sm90_local_count: expected a list of trace paths, got str "):
        fit_sm90_local_count(SM90_LOCAL_COUNT_FIT_TRACES[0])


def test_tma_figures_are_the_copy_engine_probe():
    """tma_latency_ns and sm_load_gbs are read off the committed probe run
    (benchmarks/results/tma_probe_h200.json, benchmarks/device/tma_probe.cu on the lent H200):
    the 8 KiB copy from HBM with all 132 SMs loading, and the best one-CTA stream."""
    import json
    from pathlib import Path

    from sim.calibrate import TMA_PROBE, fit_tma_probe

    d = json.loads(Path(_root(TMA_PROBE)).read_text())
    hw = load_hardware("h200")
    (row,) = [r for r in d["latency"] if (r["bytes"], r["source"], r["ctas"]) == (8192, "hbm", 132)]
    # the same median in SM cycles over the cycles per ns the kernel read: 1416 / 1.9776 = 716.0 ns
    assert row["ns_p50"] == pytest.approx(row["cycles_p50"] / row["cycles_per_ns"], abs=0.1)
    assert hw.tma_latency_ns == pytest.approx(row["cycles_p50"] / row["cycles_per_ns"], rel=2e-3)
    # an L2 hit is shorter than a fresh line, and one CTA alone waits less than 132 together
    alone = {(r["source"], r["ctas"]): r["ns_p50"] for r in d["latency"] if r["bytes"] == 8192}
    assert alone[("l2", 132)] < alone[("hbm", 1)] < alone[("hbm", 132)]
    # one CTA: four issuing warps with 2 x 16 KiB each from L2 moved 189.3 GB/s, the most of the
    # one-CTA rows; one issuing warp is bound by its loop (58.8 GB/s in 8 KiB copies, 117 in 16 KiB)
    one = [r for r in d["stream"] if r["ctas"] == 1]
    assert hw.sm_load_gbs == max(r["gbs_p50"] for r in one) == 189.3
    assert all(r["gbs_p50"] < hw.sm_load_gbs / 1.5 for r in one if r["warps"] == 1)
    fit = fit_tma_probe(_root(TMA_PROBE), label=TMA_PROBE)
    for key in ("tma_latency_ns", "sm_load_gbs"):
        assert (getattr(hw, key), hw.sources[key]) == fit[key]
        assert "tma_probe.cu" in hw.sources[key] and d["date"] in hw.sources[key]
        assert f"({TMA_PROBE})" in hw.sources[key] and "/work/" not in hw.sources[key]  # no checkout path


def test_tma_probe_without_the_latency_row_is_a_clean_error(tmp_path):
    import json
    from pathlib import Path

    from megamoe.errors import InputError
    from sim.calibrate import TMA_PROBE, fit_tma_probe

    d = json.loads(Path(_root(TMA_PROBE)).read_text())
    d["latency"] = [r for r in d["latency"] if r["ctas"] == 1]
    p = tmp_path / "probe.json"
    p.write_text(json.dumps(d))
    with pytest.raises(InputError, match="^fit_tma_probe: expected one latency row of 8192 B from hbm on 132 CTAs, got 0"):
        fit_tma_probe(str(p))


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
    p.write_text(text.replace("sched_desc_ns = ", "# sched_desc_ns = ", 1))
    with pytest.raises(InputError, match="^refit_h200: expected one line for sched_desc_ns in \\[figures\\]"):
        refit_h200(toml_path=str(p))


EP_TRACES = [f"benchmarks/traces/kernel_flash_ep2_t{t}.npz" for t in (64, 512, 2048)]


def test_h200_ep_figures_are_the_fit_to_the_ep2_traces():
    """sim/hardware/h200.toml's expert-parallel figures (``nvlink_latency_ns``,
    ``l2_epilogue_ep_ns``) and their sources are what ``python -m sim.calibrate`` writes:
    fit_sm90_ep_traces on the committed EP2 traces at 64, 512 and 2048 tokens per rank, on the
    file's one-rank L2 epilogue line."""
    from sim.calibrate import (
        SM90_EP_FIT_TRACES,
        fit_sm90_ep_traces,
        sm90_ep_fit_sources,
    )

    assert list(SM90_EP_FIT_TRACES) == EP_TRACES
    hw = load_hardware("h200")
    fit = fit_sm90_ep_traces([_root(p) for p in EP_TRACES], hw.l2_epilogue_fixed_ns, hw.l2_epilogue_thread_ns_per_elem)
    assert set(fit) == {"nvlink_latency_ns", "l2_epilogue_ep_ns"}
    for key, (value, src) in sm90_ep_fit_sources(fit).items():
        assert getattr(hw, key) == value and hw.sources[key] == src, key
        assert fit[key][1] in src and "2026-12-01" in src and "two lent H200s" in src, key
        assert "kernel_flash_ep2_t{64,512,2048}.npz" in src, key
    # at 64 tokens per rank every CTA's dispatch warp 0 pulls one item, and the CTA's pull record
    # ends with warp 0's loop: the records fall in two groups, 131 under 9 us (local items,
    # median 5.12 us) and 133 over (remote, median 11.62 us); the 6.50 us between them is the
    # remote pull's 4 dependent NVLink round trips, 1.62 us each (the fit takes the median over
    # the three traces of the same difference by least squares: 6.97 us, 1.74 us each)
    assert fit["nvlink_latency_ns"][0] == pytest.approx((11616 - 5120) / 4, rel=0.1)
    # median L2 epilogue measured (the EP2 traces, kernel v6.4) vs the one-rank line (fitted to
    # the EP1 traces of v7.9: 569.7 ns + 10.27 ns x (block_m + rows) / 2, with (block_m + median
    # rows) / 2 = 9.5, 28 and 112 per trace): 960 vs 667 ns at 64 tokens per rank (block_m 16),
    # 2432 vs 857 at 512 (block_m 32), 6848 vs 1720 at 2048 (block_m 128); in relative error
    # each trace's excess counts by 1 / duration^2: (293/960^2 + 1575/2432^2 + 5128/6848^2) /
    # (1/960^2 + 1/2432^2 + 1/6848^2) = 543 ns (the fit, over every epilogue rather than the
    # medians: 522). Most of it is v6.4's epilogue (2-byte stores, the per-element address
    # build), which v7.2 and v7.7 took out of the one-rank line, not the second rank: a figure
    # to refit when EP2 is re-recorded.
    assert fit["l2_epilogue_ep_ns"][0] == pytest.approx(543, abs=30)


def test_ep_fit_needs_several_ranks():
    from megamoe.errors import InputError
    from sim.calibrate import fit_sm90_ep_traces

    with pytest.raises(InputError, match="^fit_sm90_ep_traces: expected traces of two or more ranks"):
        fit_sm90_ep_traces([_root(TRACES[0])], 351.8, 54.24)


def test_ep_l2_epilogue_figure_is_in_every_preset():
    """Every preset carries ``l2_epilogue_ep_ns``: the H200's fitted (above), the others an
    estimate saying so; a file without it is rejected like any missing figure."""
    from megamoe.errors import InputError
    from sim.hardware import PRESET_DIR

    for name in ("b200", "h20"):
        hw = load_hardware(name)
        assert hw.l2_epilogue_ep_ns == 160.0 and hw.sources["l2_epilogue_ep_ns"].startswith("estimate")
    data = tomllib.loads((PRESET_DIR / "h200.toml").read_text())
    del data["figures"]["l2_epilogue_ep_ns"]
    with pytest.raises(InputError, match=r"^hardware.figures.l2_epilogue_ep_ns: expected a number, got missing"):
        parse_hardware(data)


def test_sched_desc_is_the_mean_gap_where_the_consumers_read_descriptors():
    """sched_desc_ns (kernel v9.1: at block_m 16 the consumers take their blocks from the producer's
    descriptors, design_sm90.BLOCK_DESCRIPTORS): the mean consumer gap over the block_m 16 fit
    traces, each trace weighted equally, read here from the records directly: T=64 13052 gaps
    (mean 434.0 ns), T=512 17660 (413.8 ns), none with a chunk skip; 423.9 ns, against v9.0's
    690 ns + 292 ns per chunk scan of the walk there. The gaps no longer grow with the scans the
    walk would have made (4092 of each trace's gaps had one)."""

    from megamoe.design_sm90 import BLOCK_DESCRIPTORS
    from megamoe.trace import Trace
    from sim.calibrate import fit_sm90_traces

    fit = fit_sm90_traces([_root(p) for p in TRACES])
    means = []
    for p in TRACES[:2]:
        t = Trace.load(_root(p))
        assert BLOCK_DESCRIPTORS[int(t.meta["plan"]["block_m"])]
        g, sc, sk = _consumer_gaps(t)
        assert not sk.any() and int((sc == 1).sum()) == 4092
        assert abs(g[sc == 1].mean() - g[sc == 0].mean()) < 100  # a scan cost the walk 292 ns
        means.append(g.mean())
    assert fit["sched_desc_ns"][0] == pytest.approx(sum(means) / 2, rel=1e-9)
    assert 300 <= fit["sched_desc_ns"][0] <= 550
    hw = load_hardware("h200")
    assert hw.sched_desc_ns == pytest.approx(fit["sched_desc_ns"][0], rel=2e-3) and hw.sched_desc_ns < hw.sched_block_ns
    assert "BLOCK_DESCRIPTORS" in hw.sources["sched_desc_ns"]


def test_pair_share_meets_the_two_cta_traces():
    """sm90_pair_share_first and sm90_pair_share (two CTAs per SM, blocks by ticket in the wave-lag
    order: kernel v9.4's trace at 64 tokens): the first share is read off the trace, computed here from its
    records (the CTAs whose mean L1 MMA record is below the median CTA's: their median L1 record
    over the one-CTA trace's median), between 1.1 and 1.5 (a lone CTA's ~10.3 us L1 block against
    ~13.2 us, benchmarks/NOTES_kernel.md, session 38) and below the second CTA's; the committed
    second share is the bisection's at which the model's makespan meets the trace's (relative
    error within 1%); the same fit on the 64- and 512-token traces together reads a
    first share in the same range; bad pairings are one-line errors."""
    import dataclasses

    import numpy as np

    from megamoe.trace import KIND, Trace
    from sim.calibrate import (
        SM90_PAIR_FIT_TRACES,
        SM90_PAIR_ONE_CTA_TRACES,
        fit_sm90_pair_share,
    )
    from sim.compare import scenario_from_meta
    from sim.engine import simulate

    hw = load_hardware("h200")
    pair, one = [_root(p) for p in SM90_PAIR_FIT_TRACES], [_root(p) for p in SM90_PAIR_ONE_CTA_TRACES]
    fit = fit_sm90_pair_share(pair, one, hw)
    (first, how_first), (v, how) = fit["sm90_pair_share_first"], fit["sm90_pair_share"]
    assert hw.sm90_pair_share == float(f"{v:.4g}") and hw.sm90_pair_share_first == float(f"{first:.4g}")
    errs, ratios = [], []
    for p, o in zip(pair, one):
        tp, to = Trace.load(p), Trace.load(o)
        assert (tp.meta["plan"]["ctas_per_sm"], to.meta["plan"].get("ctas_per_sm", 1)) == (2, 1)
        errs.append(simulate(scenario_from_meta(tp), hw).trace.makespan_ns / tp.makespan_ns - 1.0)
        l1 = tp.where(kind=KIND["l1_mma"])
        d = l1["t_end_ns"] - l1["t_start_ns"]
        per_cta = {c: d[l1["sm"] == c].mean() for c in set(l1["sm"].tolist())}
        mid = np.median(list(per_cta.values()))
        fast = np.array([per_cta[c] < mid for c in l1["sm"].tolist()])
        o1 = to.where(kind=KIND["l1_mma"])
        ratios.append(np.median(d[fast]) / np.median(o1["t_end_ns"] - o1["t_start_ns"]))
        assert f"T={tp.meta['tokens_per_rank'][0]}: 132 of 264 CTAs" in how_first
    assert first == pytest.approx(sum(ratios) / len(ratios), rel=1e-12) and 1.1 < first < 1.5
    # within 1%: at two CTAs the makespan steps with the share as blocks change hands (on v9.4's
    # trace -0.48% at 2.55, -0.96% at 2.56, +0.36% at 2.60), so the bisection's end is not a zero
    assert abs(sum(errs) / len(errs)) < 0.01, errs
    assert first < v <= 4.0 and f"sm90_pair_share_first {hw.sm90_pair_share_first:g}" in how
    both = [_root(f"benchmarks/traces/kernel_flash_ep1_t{t}.npz") for t in (64, 512)]
    first_both, _ = fit_sm90_pair_share(both, [_root(p) for p in TRACES[:2]], hw)["sm90_pair_share_first"]
    assert 1.1 < first_both < 1.5
    with pytest.raises(InputError, match="^fit_sm90_pair_share: expected two CTAs per SM in"):
        fit_sm90_pair_share(one, one, hw)
    with pytest.raises(InputError, match="^fit_sm90_pair_share: expected as many one-CTA traces"):
        fit_sm90_pair_share(pair, [], hw)
    with pytest.raises(InputError, match="^fit_sm90_pair_share: expected the same tokens in"):
        fit_sm90_pair_share(both[1:], one, hw)
    with pytest.raises(InputError, match="^fit_sm90_pair_share: expected a share in \\[1, 4\\]"):
        fit_sm90_pair_share(pair, one, dataclasses.replace(hw, stage_handoff_ns=hw.stage_handoff_ns * 10))  # too slow at 1

def test_block_jitter_is_the_robust_spread_of_consecutive_l1_k_loops():
    """block_jitter: per CTA of the one-CTA block_m 16 / 32 traces (64 / 512 / 1024 tokens), its L1
    MMA records in time order but the first, the logs of each duration over the one before; pooled,
    1.4826 x their median absolute deviation over sqrt(2). Read here from the NPZ arrays with a
    plain loop per CTA and the standard library's median: 0.96 / 0.92 / 0.55% per trace, pooled
    0.65% on kernel v9.12's traces (v9.11's: 0.97 / 0.66 / 0.56%, pooled 0.65%); the preset holds it
    rounded to 4 digits."""
    import math
    import statistics

    import numpy as np

    from megamoe.trace import KIND
    from sim.calibrate import BLOCK_JITTER_FIT_TRACES, fit_block_jitter

    pooled = []
    for p in BLOCK_JITTER_FIT_TRACES:
        d = np.load(_root(p))
        k, sm, t0, t1 = d["kind"], d["sm"], d["t_start_ns"].tolist(), d["t_end_ns"].tolist()
        for c in sorted(set(sm[k == KIND["l1_mma"]].tolist())):
            m = np.nonzero((k == KIND["l1_mma"]) & (sm == c))[0].tolist()
            m.sort(key=lambda i: (t0[i], i))
            dur = [float(t1[i] - t0[i]) for i in m][1:]
            pooled += [math.log(b / a) for a, b in zip(dur, dur[1:])]
    med = statistics.median(pooled)
    want = 1.4826 * statistics.median([abs(x - med) for x in pooled]) / math.sqrt(2)
    got, how = fit_block_jitter([_root(p) for p in BLOCK_JITTER_FIT_TRACES])["block_jitter"]
    assert got == pytest.approx(want, rel=1e-12) and round(100 * got, 2) == 0.65
    assert "T=64 0.96%" in how and "T=512 0.92%" in how and "T=1024 0.55%" in how
    assert load_hardware("h200").block_jitter == float(f"{got:.4g}")


def test_block_jitter_fit_recovers_a_known_spread(tmp_path):
    """fit_block_jitter on a trace whose L1 K loops were redrawn as 1 us x exp(N(0, 0.03)) each
    gives 0.03 within 4%; the same with its records shuffled in the file (the fit orders each CTA's by
    start), and with every 25th record 3x as long (a robust spread: the ratios' plain standard
    deviation over sqrt(2) would read ~0.22); a two-CTA trace is refused by name."""
    import numpy as np

    from megamoe.trace import KIND, Trace
    from sim.calibrate import fit_block_jitter

    t = Trace.load(_root("benchmarks/traces/kernel_flash_ep1_one_cta_t512.npz"))
    m = t.cols["kind"] == KIND["l1_mma"]
    rng = np.random.default_rng(11)
    t.cols["t_end_ns"] = t.cols["t_end_ns"].astype(np.float64)
    t.cols["t_end_ns"][m] = t.cols["t_start_ns"][m] + 1000.0 * np.exp(rng.normal(0.0, 0.03, int(m.sum())))
    p = tmp_path / "redrawn.npz"
    t.save_npz(str(p))
    assert fit_block_jitter([str(p)])["block_jitter"][0] == pytest.approx(0.03, rel=0.04)
    got = fit_block_jitter([str(p)])["block_jitter"][0]
    perm = rng.permutation(len(t))
    t.cols = {k: v[perm] for k, v in t.cols.items()}
    t.save_npz(str(p))
    assert fit_block_jitter([str(p)])["block_jitter"][0] == got
    m = t.cols["kind"] == KIND["l1_mma"]
    slow = np.flatnonzero(m)[::25]
    t.cols["t_end_ns"][slow] = t.cols["t_start_ns"][slow] + 3 * (t.cols["t_end_ns"][slow] - t.cols["t_start_ns"][slow])
    t.save_npz(str(p))
    assert fit_block_jitter([str(p)])["block_jitter"][0] == pytest.approx(0.03, rel=0.1)
    with pytest.raises(InputError, match="fit_block_jitter.*one CTA per SM"):
        fit_block_jitter([_root("benchmarks/traces/kernel_flash_ep1_t64.npz")])


def test_pull_pair_is_the_median_lone_pull_at_two_ctas():
    """sm90_pull_pair_ns: every CTA of the two-CTA traces at 3-64 tokens that holds one item (the T k
    items split evenly over the 264 CTAs: 18 / 36 / 48 / 72 / 96 / 144 of them), its pull record less
    two of the row's eight fold rounds (its four warps share them); the median over the 414 CTAs.
    Read here from the NPZ arrays with a plain loop: 3916 ns on kernel v9.12's traces (v9.11's: 3836 ns), 1.2-1.9 us
    above the one-CTA line at 3-16 tokens."""
    import statistics

    import numpy as np

    from megamoe.trace import KIND
    from sim.calibrate import SM90_PULL_PAIR_FIT_TRACES, fit_sm90_pull_pair

    fold = load_hardware("h200").pull_fold_chunk_ns
    got, counts = [], []
    for p in SM90_PULL_PAIR_FIT_TRACES:
        d = np.load(_root(p))
        ids = d["topk_idx_0"].reshape(-1).tolist()
        n_ctas = 264
        items = [0] * n_ctas
        for c in range(n_ctas):
            items[c] = sum(1 for x in ids[len(ids) * c // n_ctas:len(ids) * (c + 1) // n_ctas] if x >= 0)
        k, sm, t0, t1 = d["kind"].tolist(), d["sm"].tolist(), d["t_start_ns"].tolist(), d["t_end_ns"].tolist()
        lone = [t1[i] - t0[i] - 2 * fold for i in range(len(k)) if k[i] == KIND["pull"] and items[sm[i]] == 1]
        counts.append(len(lone))
        got += lone
    assert counts == [18, 36, 48, 72, 96, 144]
    v, how = fit_sm90_pull_pair([_root(p) for p in SM90_PULL_PAIR_FIT_TRACES], fold)["sm90_pull_pair_ns"]
    assert v == statistics.median(got) == 3916.0
    assert load_hardware("h200").sm90_pull_pair_ns == v and "pooled 3916 ns" in how
    with pytest.raises(InputError, match="fit_sm90_pull_pair.*two CTAs per SM"):
        fit_sm90_pull_pair([_root("benchmarks/traces/kernel_flash_ep1_t1.npz")], fold)
