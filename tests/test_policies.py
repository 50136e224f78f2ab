"""Scheduler policies: built-ins pinned by hand, user files through --policy, bad policies."""

import json
from pathlib import Path

import numpy as np
import pytest

from megamoe import plan as P
from megamoe.cli import main
from megamoe.errors import InputError
from megamoe.policies import (AdaptiveWaves, InterleavedScheduler, RankByRankPull, ScheduleContext,
                              WaveContext, WaveLagScheduler, WaveScheduler, policies_from_specs)
from megamoe.scenario import Scenario
from sim import simulate


def test_rank_by_rank_order():
    assert RankByRankPull().pull_order(np.array([2, 0, 3])).tolist() == [
        [0, 0], [0, 1], [2, 0], [2, 1], [2, 2]]


def test_interleaved_order_by_hand():
    ctx = ScheduleContext(np.array([1, 2, 1]), l1_n_blocks=2, l2_n_blocks=2, experts_per_wave=3, num_sms=4)
    rows = [tuple(r[:4]) for r in InterleavedScheduler().block_list(ctx).tolist()]
    L1, L2 = 1, 2
    assert rows == [(L1, 0, 0, 0), (L1, 0, 0, 1),
                    (L1, 1, 0, 0), (L1, 1, 0, 1), (L1, 1, 1, 0), (L1, 1, 1, 1),
                    (L2, 0, 0, 0), (L2, 0, 0, 1),
                    (L1, 2, 0, 0), (L1, 2, 0, 1),
                    (L2, 1, 0, 0), (L2, 1, 0, 1), (L2, 1, 1, 0), (L2, 1, 1, 1),
                    (L2, 2, 0, 0), (L2, 2, 0, 1)]


def test_wave_lag_order_by_hand():
    """Kernel v9.4's order at two CTAs per SM: each wave's L2 pass after the next wave's L1 pass.
    Experts 0-4 with 1, 0, 2, 1, 1 m blocks, two per wave (waves {0, 1}, {2, 3}, {4}), 2 L1 and 1
    L2 n blocks: L1(0), L1(1), L2(0), L1(2), L2(1), L2(2)."""
    ctx = ScheduleContext(np.array([1, 0, 2, 1, 1]), l1_n_blocks=2, l2_n_blocks=1, experts_per_wave=2, num_sms=4)
    rows = [tuple(r) for r in WaveLagScheduler().block_list(ctx).tolist()]
    L1, L2 = 1, 2
    assert rows == [(L1, 0, 0, 0, 0), (L1, 0, 0, 1, 0),
                    (L1, 2, 0, 0, 1), (L1, 2, 0, 1, 1), (L1, 2, 1, 0, 1), (L1, 2, 1, 1, 1), (L1, 3, 0, 0, 1), (L1, 3, 0, 1, 1),
                    (L2, 0, 0, 0, 0),
                    (L1, 4, 0, 0, 2), (L1, 4, 0, 1, 2),
                    (L2, 2, 0, 0, 1), (L2, 2, 1, 0, 1), (L2, 3, 0, 0, 1),
                    (L2, 4, 0, 0, 2)]
    # the same rows as MegaMoEScheduler's order; one wave: the same order
    plain = [tuple(r) for r in WaveScheduler().block_list(ctx).tolist()]
    assert sorted(plain) == sorted(rows) and plain != rows
    one = ScheduleContext(np.array([1, 0, 2]), l1_n_blocks=2, l2_n_blocks=1, experts_per_wave=3, num_sms=4)
    assert WaveLagScheduler().block_list(one).tolist() == WaveScheduler().block_list(one).tolist()
    none = ScheduleContext(np.zeros(3, np.int64), l1_n_blocks=2, l2_n_blocks=1, experts_per_wave=1, num_sms=4)
    assert WaveLagScheduler().block_list(none).shape == (0, 5)


def test_adaptive_waves_uses_actual_counts():
    # 4 experts with 1,1,6,6 m blocks (block_m 16), 2 L1 n blocks each, 8 SMs:
    # epw=1 -> waves of 2,2,12,12 blocks (min 2 < 8); epw=2 -> 4, 24 (min 4); epw=3 -> one full
    # wave of 1+1+6=8 blocks x2 = 16 >= 8 -> 3
    tpe = np.array([16, 16, 96, 96])
    ctx = WaveContext(4, 56, 1, 256, 128, 16, 128, 8, 10**6, 64, 1, tpe, 4)
    assert AdaptiveWaves().experts_per_wave(ctx) == 3


def test_policies_change_the_plan_and_the_simulation():
    base = Scenario(shape="deepseek-v4-flash", num_ranks=8, tokens_per_rank=128)
    other = Scenario(shape="deepseek-v4-flash", num_ranks=8, tokens_per_rank=128,
                     policies=["fixed-waves:2", "rank-by-rank"])
    pb, po = base.plan(148, P.SM100_SMEM_CAPACITY), other.plan(148, P.SM100_SMEM_CAPACITY)
    assert pb.ranks[0].experts_per_wave != 2 and po.ranks[0].experts_per_wave == 2
    assert po.ranks[0].pull_order(0).tolist() == RankByRankPull().pull_order(po.ranks[0].recv_counts[0]).tolist()
    assert simulate(other).summary["time_us"] != simulate(base).summary["time_us"]


def test_user_policy_file_through_cli(tmp_path):
    f = tmp_path / "my_policy.py"
    f.write_text(
        "class TwoPerWave:\n"
        "    name = 'two-per-wave'\n"
        "    def experts_per_wave(self, ctx):\n"
        "        return 2\n")
    out = tmp_path / "o.json"
    rc = main(["simulate", "--shape", "deepseek-v4-flash", "--tokens", "32", "--policy",
               f"{f}:TwoPerWave", "--json", str(out)])
    assert rc == 0
    d = json.loads(out.read_text())
    assert d["plan"]["policies"] == {"wave": "two-per-wave"}
    assert all(r["experts_per_wave"] == 2 for r in d["plan"]["ranks"])


def test_readme_example_policy_file(tmp_path):
    """The README's plug-in example, examples/my_policies.py:MyWaves: a quarter of the local
    experts per wave (DeepSeek-V4-Pro, EP8: 384 / 8 = 48 local experts -> 12, within the pool)."""
    out = tmp_path / "o.json"
    root = Path(__file__).resolve().parents[1]
    rc = main(["simulate", "--policy", "rank-by-rank", "--policy", f"{root / 'examples' / 'my_policies.py'}:MyWaves",
               "--json", str(out)])
    assert rc == 0
    d = json.loads(out.read_text())
    assert d["plan"]["policies"]["wave"] == "my-waves"
    local = d["plan"]["ranks"][0]
    assert all(r["experts_per_wave"] == 12 for r in d["plan"]["ranks"]), local


@pytest.mark.parametrize("body,msg", [
    ("    def experts_per_wave(self, ctx):\n        return 'two'\n", "Bad.experts_per_wave: expected an int"),
    ("    def experts_per_wave(self, ctx):\n        return 10**6\n", "Bad.experts_per_wave: expected in [1, 32]"),
    ("    def pull_order(self, counts):\n        import numpy as np\n        return np.zeros((1, 2), dtype=np.int64)\n",
     "Bad.pull_order: expected shape"),
    ("    def block_list(self, ctx):\n        import numpy as np\n        return np.zeros((0, 5), dtype=np.int32)\n",
     "Bad.block_list: expected every (phase, expert, m, n) block exactly once"),
    ("    pass\n", "policy Bad: expected a method"),
])
def test_bad_policies_name_policy_and_method(tmp_path, body, msg):
    f = tmp_path / "bad.py"
    f.write_text("class Bad:\n" + body)
    with pytest.raises(InputError) as ei:
        simulate(Scenario(shape="deepseek-v4-flash", tokens_per_rank=64, policies=[f"{f}:Bad"]))
    assert msg in str(ei.value)


def test_two_policies_of_one_kind_rejected():
    with pytest.raises(InputError, match="one wave policy"):
        policies_from_specs(["fixed-waves:2", "adaptive-waves"])


def test_fixed_override_and_policy_for_the_same_decision_conflict():
    from megamoe.scenario import Scenario
    with pytest.raises(InputError, match="block_m: expected either a fixed block_m or a block_config policy"):
        Scenario(block_m=128, policies=["block-m:64"])
    with pytest.raises(InputError, match="experts_per_wave: expected either"):
        Scenario(experts_per_wave=8, policies=["fixed-waves:4"])


@pytest.mark.parametrize("spec,line", [
    ("fixed-waves:0", "policy: expected fixed-waves:N with an integer N >= 1, got fixed-waves:0"),
    ("fixed-waves:-3", "policy: expected fixed-waves:N with an integer N >= 1, got fixed-waves:-3"),
    ("fixed-waves:x", "policy: expected fixed-waves:N with an integer N >= 1, got fixed-waves:x"),
    ("fixed-waves", "policy: expected fixed-waves:N with an integer N >= 1, got fixed-waves"),
    ("block-m:x", "policy: expected block-m:N with an integer N, got block-m:x"),
])
def test_bad_built_in_arguments_say_what_is_expected(spec, line):
    with pytest.raises(InputError) as e:
        policies_from_specs([spec])
    assert str(e.value) == line


def test_fixed_waves_is_refused_above_its_bounds_not_capped(capsys):
    """`--policy fixed-waves:1000` was silently capped to the 32 local experts (and to what the
    pool holds) while `--experts-per-wave 1000` is refused: both are refused now."""
    assert main(["simulate", "--shape", "deepseek-v4-flash", "--tokens", "64", "--policy", "fixed-waves:1000"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "megamoe: error: policy fixed-waves:1000: expected N in [1, 32] (local experts), got 1000"]
    assert main(["simulate", "--shape", "deepseek-v4-flash", "--tokens", "64", "--experts-per-wave", "1000"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "megamoe: error: experts_per_wave: expected in [1, 32] (local experts), got 1000"]
    assert main(["simulate", "--shape", "deepseek-v4-flash", "--tokens", "64", "--pool-tokens", "70000",
                 "--policy", "fixed-waves:2"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "megamoe: error: policy fixed-waves:2: expected N in [1, 1] (the most experts whose worst-case wave fits "
        "the pool of 70000 tokens at block_m 32), got 2"]
    sc = Scenario(shape="deepseek-v4-flash", tokens_per_rank=64, policies=["fixed-waves:32"])
    assert all(r.experts_per_wave == 32 for r in sc.plan(148, P.SM100_SMEM_CAPACITY).ranks)


def test_sm90_plan_takes_the_wave_lag_order_where_blocks_go_by_ticket():
    """megamoe-sm90 at two CTAs per SM (16 tokens on V4-Flash: block_m 16, 64 experts per wave,
    blocks by ticket) lists its blocks in the wave-lag order (kernel v9.4); at one CTA (1024
    tokens, block_m 32) in MegaMoEScheduler's; a scheduler policy still replaces either."""
    from megamoe.design_sm90 import SMEM_LIMIT_SM90

    def rank(tokens, **kw):
        return Scenario(shape="deepseek-v4-flash", num_ranks=1, tokens_per_rank=tokens, design="megamoe-sm90",
                        hardware="h200", **kw).plan(132, SMEM_LIMIT_SM90).ranks[0]

    two, one = rank(16), rank(1024)
    for rp, lag in ((two, True), (one, False)):
        assert (rp.block_tickets, rp.wave_lag) == (lag, lag)
        ctx = ScheduleContext(rp.m_blocks_per_expert, rp.l1_n_blocks, rp.l2_n_blocks, rp.experts_per_wave, rp.num_sms)
        want = (WaveLagScheduler() if lag else WaveScheduler()).block_list(ctx)
        assert np.array_equal(rp.blocks()[:, :5], want)
    assert two.num_waves == 4 and not np.array_equal(two.blocks()[:, :5], WaveScheduler().block_list(ScheduleContext(
        two.m_blocks_per_expert, two.l1_n_blocks, two.l2_n_blocks, two.experts_per_wave, two.num_sms)))
    forced = rank(16, policies=["wave-scheduler"])
    assert forced.wave_lag and np.array_equal(forced.blocks()[:, :5], WaveScheduler().block_list(ScheduleContext(
        forced.m_blocks_per_expert, forced.l1_n_blocks, forced.l2_n_blocks, forced.experts_per_wave, forced.num_sms)))
