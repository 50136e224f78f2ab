"""Routing generators: seeded, deterministic, distinct experts per token, file loading."""

import re

import numpy as np
import pytest

from megamoe.errors import InputError
from megamoe.routing import (
    RoutingSpec,
    generate,
    kernel_routing_name,
    load_routing_file,
    routing_summary,
)


@pytest.mark.parametrize("text", ["uniform", "masked:0.3", "zipf:1.2", "hot:0.6:4", "one_expert"])
def test_generators_are_deterministic_and_distinct(text):
    spec = RoutingSpec.parse(text)
    a = generate(spec, 3, [200, 0, 57], 64, 6, seed=11)
    b = generate(spec, 3, [200, 0, 57], 64, 6, seed=11)
    c = generate(spec, 3, [200, 0, 57], 64, 6, seed=12)
    assert [x.shape for x in a] == [(200, 6), (0, 6), (57, 6)]
    assert all((x == y).all() for x, y in zip(a, b))
    assert any((x != y).any() for x, y in zip(a, c))
    for ids in a:
        assert ids.dtype == np.int64 and ids.min(initial=0) >= -1 and ids.max(initial=0) < 64
        for row in ids:
            v = row[row >= 0]
            assert len(set(v.tolist())) == len(v)


def test_uniform_is_close_to_uniform():
    ids = generate(RoutingSpec(), 1, [20000], 32, 4, 0)[0]
    counts = np.bincount(ids.reshape(-1), minlength=32)
    expected = 20000 * 4 / 32
    assert np.abs(counts - expected).max() < 5 * np.sqrt(expected)


def test_masked_ratio():
    ids = generate(RoutingSpec(kind="masked", masked_ratio=0.25), 1, [10000], 16, 4, 0)[0]
    frac = (ids < 0).mean()
    assert abs(frac - 0.25) < 0.02


def test_hot_sends_traffic_to_rank_zero():
    ids = generate(RoutingSpec(kind="hot", hot_fraction=0.9, hot_experts=8), 4, [2000] * 4, 64, 2, 0)
    s = routing_summary(ids, 64, 4)
    assert s["rank_share"][0] > 0.7


def test_zipf_skews():
    ids = generate(RoutingSpec(kind="zipf", zipf_exponent=1.5), 1, [5000], 64, 2, 0)
    s = routing_summary(ids, 64, 1)
    assert s["expert_load_max"] > 5 * s["expert_load_mean"]


def test_parse_errors():
    with pytest.raises(InputError, match=r"^routing: expected uniform \| masked\[:RATIO\] \| zipf\[:S\] \| "
                       r"hot\[:FRACTION\[:N\]\] \| one_expert \| file:PATH, got gaussian$"):
        RoutingSpec.parse("gaussian")
    with pytest.raises(InputError, match="^routing: .*got one_expert:2$"):
        RoutingSpec.parse("one_expert:2")
    with pytest.raises(InputError, match="routing.masked_ratio"):
        RoutingSpec.parse("masked:abc")
    with pytest.raises(InputError, match="routing.masked_ratio"):
        RoutingSpec.parse("masked:1.5")


def test_file_routing(tmp_path):
    good = np.array([[0, 1], [2, -1], [3, 0]], dtype=np.int32)
    np.save(tmp_path / "r0.npy", good)
    np.save(tmp_path / "r1.npy", good[:1])
    got = load_routing_file(str(tmp_path / "r{rank}.npy"), 2, 4, 2)
    assert [g.tolist() for g in got] == [good.tolist(), good[:1].tolist()]
    np.save(tmp_path / "all.npy", np.stack([good, good]))
    assert len(load_routing_file(str(tmp_path / "all.npy"), 2, 4, 2)) == 2
    np.save(tmp_path / "bad_range.npy", np.array([[0, 4]]))
    with pytest.raises(InputError, match=r"routing.file: expected ids in \[-1, 4\)"):
        load_routing_file(str(tmp_path / "bad_range.npy"), 1, 4, 2)
    for name in ("text.npz", "text.npy"):  # a text file under a NumPy name: why, not numpy's pickle text
        (tmp_path / name).write_text("0 1\n2 3\n")
        with pytest.raises(InputError, match=r"^routing\.file: expected a readable \.npy/\.npz/\.pt integer array, "
                                             r"got .*text\.np[yz] \(ValueError: not a NumPy file \(an \.npz is a zip "
                                             r"archive, an \.npy starts with a NumPy header\)\)$"):
            load_routing_file(str(tmp_path / name), 1, 4, 2)
    # a real NumPy file holding an object array: said so, not "not a NumPy file"
    np.save(tmp_path / "obj.npy", np.array([[1, "a"]], dtype=object), allow_pickle=True)
    np.savez(tmp_path / "obj.npz", topk_idx=np.array([[1, "a"]], dtype=object))
    for name in ("obj.npy", "obj.npz"):
        with pytest.raises(InputError, match=r"^routing\.file: expected .*, got .*obj\.np[yz] \(ValueError: an object "
                                             r"\(pickled\) array; save the ids as an integer array\)$"):
            load_routing_file(str(tmp_path / name), 1, 4, 2)
    np.save(tmp_path / "bad_shape.npy", np.zeros((3, 3), dtype=np.int64))
    with pytest.raises(InputError, match=r"shape \[T, 2\]"):
        load_routing_file(str(tmp_path / "bad_shape.npy"), 1, 4, 2)
    np.save(tmp_path / "bad_dtype.npy", np.zeros((3, 2), dtype=np.float32))
    with pytest.raises(InputError, match="integer array"):
        load_routing_file(str(tmp_path / "bad_dtype.npy"), 1, 4, 2)
    with pytest.raises(InputError, match="existing"):
        load_routing_file(str(tmp_path / "missing.npy"), 1, 4, 2)


def test_pt_file(tmp_path):
    torch = pytest.importorskip("torch")
    torch.save(torch.tensor([[1, 0]]), tmp_path / "x.pt")
    assert load_routing_file(str(tmp_path / "x.pt"), 1, 4, 2)[0].tolist() == [[1, 0]]


def test_pt_file_without_torch_says_torch_is_needed(tmp_path, monkeypatch):
    import builtins

    (tmp_path / "x.pt").write_bytes(b"not read")
    real = builtins.__import__

    def no_torch(name, *a, **k):
        if name == "torch":
            raise ModuleNotFoundError("No module named 'torch'")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_torch)
    with pytest.raises(InputError) as e:
        load_routing_file(str(tmp_path / "x.pt"), 1, 4, 2)
    assert str(e.value) == (f"routing.file: expected an .npy/.npz file, or torch installed to read a .pt file, got "
                            f"{tmp_path / 'x.pt'} (torch is not installed)")


@pytest.mark.parametrize("spec,left", [(RoutingSpec(kind="zipf", zipf_exponent=1e9), 1),
                                       (RoutingSpec(kind="hot", hot_fraction=1.0, hot_experts=2), 2)])
def test_degenerate_probabilities_are_an_input_error(spec, left):
    """k distinct experts per token need k experts with a nonzero probability: zipf with a
    huge exponent leaves only expert 0's weight (1 / 2^1e9 underflows), hot:1:2 only 2."""
    with pytest.raises(InputError, match=rf"routing\.{spec.kind}: .*top_k = 6 .*\({left} left\)"):
        generate(spec, 1, [8], 64, 6, 0)
    with pytest.raises(InputError, match="routing.zipf_exponent"):
        RoutingSpec(kind="zipf", zipf_exponent=float("inf"))


def test_routing_file_rows_must_name_distinct_experts(tmp_path):
    p = tmp_path / "dup.npy"
    np.save(p, np.array([[1, 2, -1, -1], [3, 3, 0, 1]]))
    with pytest.raises(InputError, match=r"row 1 = \[3, 3, 0, 1\]"):
        load_routing_file(str(p), 1, 8, 4)


def test_one_expert_routes_every_token_to_expert_3():
    """Slot 0 is expert 3 on every row; the other k - 1 slots are distinct, never 3, and
    uniform over the other E - 1 experts (expected count T (k - 1) / (E - 1) each)."""
    T, E, k = 12000, 32, 4
    spec = RoutingSpec.parse("one_expert")
    assert spec.kind == "one_expert" and spec.describe() == "one_expert"
    ids = generate(spec, 2, [T, 5], E, k, 0)
    assert [x.shape for x in ids] == [(T, k), (5, k)]
    a = ids[0]
    assert (a[:, 0] == 3).all() and not (a[:, 1:] == 3).any()
    assert all(len(set(row.tolist())) == k for row in a)
    counts = np.bincount(a[:, 1:].reshape(-1), minlength=E)
    others = np.delete(counts, 3)
    expected = T * (k - 1) / (E - 1)
    assert np.abs(others - expected).max() < 5 * np.sqrt(expected)
    # EP8: rank 0 holds experts 0..3: slot 0 always, each other slot with probability 3/31
    share = routing_summary(ids[:1], E, 8)["rank_share"][0]
    assert abs(share - (1 + (k - 1) * 3 / (E - 1)) / k) < 0.01
    with pytest.raises(InputError, match=r"^routing.one_expert: expected a shape with more than 3 experts"):
        generate(spec, 1, [4], 3, 2, 0)


def test_one_expert_and_zipf_have_the_kernel_generators_distributions():
    """`megamoe run` draws with megamoe.kernel.check.make_inputs; its one_expert and zipf are
    the simulator's one_expert and zipf:1 up to the expert order (zipf: the simulator permutes
    the experts, the kernel's generator does not), so the sorted per-expert loads agree."""
    pytest.importorskip("torch")
    from megamoe.kernel.check import make_inputs
    T, E, k = 20000, 32, 4
    for name in ("one_expert", "zipf"):
        kern = make_inputs(T, E, k, 32, "cpu", seed=1, routing=name)[2].numpy().astype(np.int64)
        sim = generate(RoutingSpec.parse(name), 1, [T], E, k, 0)[0]
        ck, cs = (np.sort(np.bincount(x.reshape(-1), minlength=E))[::-1] for x in (kern, sim))
        assert np.abs(ck - cs).max() < 6 * np.sqrt(ck.max()), (name, ck, cs)
        if name == "one_expert":
            assert (kern[:, 0] == 3).all() and (sim[:, 0] == 3).all()
        else:  # the kernel's most popular experts are 0, 1, 2, ... in order
            assert np.argmax(np.bincount(kern.reshape(-1), minlength=E)) == 0


@pytest.mark.parametrize("text,name", [("uniform", "uniform"), ("Uniform", "uniform"), ("zipf", "zipf"),
                                       ("zipf:1", "zipf"), ("zipf:1.0", "zipf"), ("one_expert", "one_expert")])
def test_kernel_routing_name_maps_the_shared_names(text, name):
    assert kernel_routing_name(text) == name
    assert kernel_routing_name(RoutingSpec.parse(text)) == name


@pytest.mark.parametrize("text,msg", [
    ("masked:0.2", r"^routing: expected uniform, zipf\[:1\] or one_expert for megamoe run --routing .*got masked:0.2$"),
    ("hot", r"^routing: expected uniform, zipf\[:1\] or one_expert for megamoe run --routing .*got hot$"),
    ("file:ids.npy", r"^routing: expected .* masked, hot and file: are simulate-only\), got file:ids.npy$"),
    ("zipf:1.2", r"^routing.zipf_exponent: expected 1 for megamoe run --routing .*got 1.2$"),
    ("bogus", r"^routing: expected uniform, zipf\[:1\] or one_expert for megamoe run --routing .*got bogus$"),
])
def test_kernel_routing_name_refuses_what_the_kernel_generator_does_not_make(text, msg):
    with pytest.raises(InputError, match=msg):
        kernel_routing_name(text)


def test_kernel_generator_refuses_other_routing_names():
    """`megamoe.kernel.check.make_inputs` (the generator behind `megamoe run`) names the field."""
    pytest.importorskip("torch")
    from megamoe.kernel.check import make_inputs

    with pytest.raises(InputError, match="routing: expected uniform, zipf or one_expert.*got masked"):
        make_inputs(4, 8, 2, 32, "cpu", routing="masked")


def test_scenario_topk_idx_is_checked_like_a_routing_file():
    """Scenario(topk_idx=...) takes one int [T_r, top_k] array per rank with ids in
    [-1, num_experts) and distinct ids per row: the same checks as a routing file."""
    from megamoe.scenario import Scenario

    ok = [np.array([[0, 1, 2, 3, 4, 5], [-1, -1, 7, 8, 9, 10]])]
    sc = Scenario(shape="deepseek-v4-flash", num_ranks=1, topk_idx=ok)
    assert sc.tokens_list() == [2] and sc.routing_ids()[0].dtype == np.int64
    cases = [
        ([np.array([[0, 1, 2, 3, 4, 256]])], r"^topk_idx\[0\]: expected ids in \[-1, 256\), got ids in \[0, 256\]"),
        ([np.array([[0, 1, 2, 3, 4]])], r"^topk_idx\[0\]: expected shape \[T, 6\], got shape \[1, 5\]"),
        ([np.zeros((1, 6))], r"^topk_idx\[0\]: expected an integer array, got dtype float64"),
        ([np.array([[0, 1, 2, 3, 4, 4]])], r"^topk_idx\[0\]: expected distinct expert ids"),
        (np.array([[0, 1, 2, 3, 4, 5]]), r"^topk_idx: expected a list of 1 array \(one per rank\), got ndarray"),
        ([ok[0], ok[0]], r"^topk_idx: expected a list of 1 array \(one per rank\), got 2 arrays"),
        (["abc"], r"^topk_idx\[0\]: expected an integer array, got dtype <U3"),
    ]
    for ids, msg in cases:
        with pytest.raises(InputError, match=msg):
            Scenario(shape="deepseek-v4-flash", num_ranks=1, topk_idx=ids)


@pytest.mark.parametrize("path", ["/tmp/x_{rank}_{foo}.npy", "/tmp/x_{rank}{.npy", "/tmp/x_{ranks}.npy",
                                  "/tmp/x}.npy", "/tmp/{}.npy"])
def test_routing_file_braces_other_than_rank_are_refused(path):
    """``{rank}`` is the only placeholder of a routing file path: any other brace is an
    InputError on routing.file at parse time (str.format used to raise KeyError / ValueError)."""
    msg = r"^routing\.file: expected a path whose only placeholder is \{rank\} \(no other \{ or \}\), got "
    with pytest.raises(InputError, match=msg + re.escape(path) + "$"):
        RoutingSpec.parse("file:" + path)
    with pytest.raises(InputError, match=msg):
        load_routing_file(path, 2, 8, 2)


def test_routing_file_rank_placeholder_is_replaced_literally(tmp_path):
    ids = np.array([[0, 1], [2, 3]])
    for r in range(2):
        np.save(tmp_path / f"ids_{r}.npy", ids + r)
    got = generate(RoutingSpec.parse(f"file:{tmp_path}/ids_{{rank}}.npy"), 2, [], 8, 2, 0)
    assert [g.tolist() for g in got] == [ids.tolist(), (ids + 1).tolist()]


@pytest.mark.parametrize("kw, msg", [
    (dict(kind="hot", hot_experts=2.5), r"^routing\.hot_experts: expected an integer >= 1, got 2\.5$"),
    (dict(kind="hot", hot_experts=True), r"^routing\.hot_experts: expected an integer >= 1, got True$"),
    (dict(kind="hot", hot_experts="4"), r"^routing\.hot_experts: expected an integer >= 1, got '4'$"),
    (dict(kind="masked", masked_ratio="0.5"), r"^routing\.masked_ratio: expected a ratio in \[0, 1\], got '0\.5'$"),
    (dict(kind="masked", masked_ratio=float("nan")), r"^routing\.masked_ratio: expected a ratio in \[0, 1\], got nan$"),
    (dict(kind="zipf", zipf_exponent=None), r"^routing\.zipf_exponent: expected a finite number >= 0, got None$"),
    (dict(kind="hot", hot_fraction="x"), r"^routing\.hot_fraction: expected a fraction in \[0, 1\], got 'x'$"),
    (dict(kind=None), r"^routing: expected one of uniform, masked, zipf, hot, one_expert, file, got None$"),
    (dict(kind="file", path=None), r"^routing\.file: expected a path string, got None$"),
])
def test_routing_spec_field_types(kw, msg):
    with pytest.raises(InputError, match=msg):
        RoutingSpec(**kw)


def test_routing_parse_hot_n_must_be_an_integer():
    with pytest.raises(InputError, match=r"^routing\.hot_experts: expected an integer, got 2\.5$"):
        RoutingSpec.parse("hot:0.5:2.5")
    with pytest.raises(InputError, match=r"^routing: expected a RoutingSpec or its CLI spelling .*got 42$"):
        RoutingSpec.parse(42)
    # an empty parameter is refused, not read as the default (zipf: is not zipf:1)
    for text, field in (("zipf:", "zipf_exponent"), ("hot:", "hot_fraction"), ("hot:0.5:", "hot_experts"),
                        ("masked:", "masked_ratio")):
        with pytest.raises(InputError, match=rf"^routing\.{field}: expected (a number|an integer), got ''$"):
            RoutingSpec.parse(text)
    with pytest.raises(InputError, match=r"^routing: expected uniform \| masked.*, got uniform:$"):
        RoutingSpec.parse("uniform:")


@pytest.mark.parametrize("args, msg", [
    (dict(tokens_per_rank=[-1]), r"^tokens_per_rank: expected integers >= 0 \(one per rank\), got -1$"),
    (dict(tokens_per_rank=[2.5]), r"^tokens_per_rank: expected integers >= 0 \(one per rank\), got 2\.5$"),
    (dict(tokens_per_rank=[4, 4]), r"^tokens_per_rank: expected a list of 1 token count \(one per rank\), got 2 values$"),
    (dict(tokens_per_rank=4), r"^tokens_per_rank: expected a list of 1 token count \(one per rank\), got 4$"),
    (dict(seed=-1), r"^seed: expected an integer >= 0, got -1$"),
    (dict(seed="abc"), r"^seed: expected an integer >= 0, got 'abc'$"),
    (dict(num_ranks=0), r"^num_ranks: expected an integer >= 1, got 0$"),
    (dict(top_k=9), r"^top_k: expected <= num_experts \(8\), got 9$"),
    (dict(spec="uniform"), r"^routing: expected a RoutingSpec, got str$"),
])
def test_generate_checks_its_arguments(args, msg):
    kw = dict(spec=RoutingSpec(), num_ranks=1, tokens_per_rank=[4], num_experts=8, top_k=2, seed=0)
    with pytest.raises(InputError, match=msg):
        generate(**{**kw, **args})


@pytest.mark.parametrize("kw, msg", [
    (dict(tokens_per_rank=64.5), r"^tokens: expected integers in \[0, 131072\] per rank, got 64\.5$"),
    (dict(tokens_per_rank="64"), r"^tokens: expected integers in \[0, 131072\] per rank, got '64'$"),
    (dict(tokens_per_rank=float("nan")), r"^tokens: expected integers in \[0, 131072\] per rank, got nan$"),
    (dict(tokens_per_rank=True), r"^tokens: expected integers in \[0, 131072\] per rank, got True$"),
    (dict(tokens_per_rank=[64, 64.0]), r"^tokens: expected integers in \[0, 131072\] per rank, got 64\.0$"),
    (dict(tokens_per_rank=np.zeros((2, 1), int)), r"^tokens: expected one integer or a 1-D list with one per rank"),
    (dict(shape=123), r"^shape: expected a preset name, an E,k,H,I string or a MoEShape, got 123$"),
    (dict(shape=None), r"^shape: expected a preset name, an E,k,H,I string or a MoEShape, got None$"),
    (dict(seed=-1), r"^seed: expected an integer >= 0, got -1$"),
    (dict(seed=1.5), r"^seed: expected an integer >= 0, got 1\.5$"),
    (dict(seed="abc"), r"^seed: expected an integer >= 0, got 'abc'$"),
    (dict(seed=None), r"^seed: expected an integer >= 0, got None$"),
    (dict(hardware=None), r"^hardware: expected a preset name \(b200, h100, h20, h200\) or a \.toml path, got None$"),
    (dict(hardware=""), r"^hardware: expected a preset name \(b200, h100, h20, h200\) or a \.toml path, got ''$"),
    (dict(routing=42), r"^routing: expected a RoutingSpec or its CLI spelling \(e\.g\. 'uniform', 'zipf:1\.2'\), got 42$"),
    (dict(reserved_sms=2.5), r"^reserved_sms: expected an integer >= 0, got 2\.5$"),
    (dict(reserved_sms=-1), r"^reserved_sms: expected an integer >= 0, got -1$"),
    (dict(design="sm90"), r"^design: expected deepgemm-sm100 or megamoe-sm90, got sm90$"),
    (dict(l2_wait="block"), r"^l2_wait: expected k_block or pool_block, got block$"),
    (dict(l2_wait=None), r"^l2_wait: expected k_block or pool_block, got None$"),
    (dict(num_ranks=True), r"^ranks: expected an integer >= 1, got True$"),
    (dict(num_ranks=8.0), r"^ranks: expected an integer >= 1, got 8\.0$"),
    (dict(max_tokens_per_rank=True), r"^max_tokens: expected an integer in \[1, 131072\], got True$"),
    (dict(block_m=True), r"^block_m: expected a positive integer, got True$"),
    (dict(num_stages=2.0), r"^num_stages: expected a positive integer, got 2\.0$"),
    (dict(policies=None), r"^policies: expected a list of policy specs or objects"),
    (dict(policies="rank-by-rank"), r"^policies: expected a list of policy specs or objects .*got rank-by-rank$"),
])
def test_scenario_field_types_and_ranges(kw, msg):
    """Every Scenario field is checked at construction under its own name: nothing is rounded
    (64.5 tokens was truncated to 64), converted ('64') or left to fail later (numpy / simulate)."""
    from megamoe.scenario import Scenario

    with pytest.raises(InputError, match=msg):
        Scenario(**kw)


def test_scenario_accepts_numpy_integers():
    from megamoe.scenario import Scenario

    sc = Scenario(shape="deepseek-v4-flash", num_ranks=np.int64(2), tokens_per_rank=np.array([3, 4]),
                  seed=np.int32(5), reserved_sms=np.int64(1))
    assert sc.tokens_list() == [3, 4] and len(sc.routing_ids()) == 2
    assert type(sc.num_ranks) is int and type(sc.seed) is int and type(sc.reserved_sms) is int
    import json

    json.dumps(sc.to_dict())


def test_a_megamoe_trace_file_is_a_routing_file(tmp_path):
    """file:PATH takes a megamoe trace (.npz with topk_idx_0 .. topk_idx_{R-1}: simulate
    --trace-npz, the kernel's traces) as the routing it holds, one array per rank, so a what-if can
    hold the routing while the seed changes the jitter only; a trace of another rank count, or with
    a gap in its arrays, is refused on routing.file."""
    import numpy as np

    from megamoe.errors import InputError
    from megamoe.routing import load_routing_file
    from megamoe.scenario import Scenario
    from sim import simulate

    sc = Scenario(shape="deepseek-v4-flash", num_ranks=2, tokens_per_rank=[5, 7], seed=3)
    p = tmp_path / "t.npz"
    simulate(sc).trace.save_npz(str(p))
    got = load_routing_file(str(p), 2, 256, 6)
    want = sc.routing_ids()
    assert [a.shape for a in got] == [(5, 6), (7, 6)] and all(np.array_equal(a, b) for a, b in zip(got, want))
    held = Scenario(shape="deepseek-v4-flash", num_ranks=2, routing=f"file:{p}", seed=9)
    assert all(np.array_equal(a, b) for a, b in zip(held.routing_ids(), want))
    with pytest.raises(InputError, match=r"^routing.file: expected a trace of 1 rank \(arrays topk_idx_0 .. "
                                         r"topk_idx_0\), got .*t.npz with 2$"):
        load_routing_file(str(p), 1, 256, 6)
    gap = tmp_path / "gap.npz"
    np.savez(gap, topk_idx_0=want[0], topk_idx_2=want[1])
    with pytest.raises(InputError, match=r"^routing.file: expected a trace's arrays topk_idx_0 .. topk_idx_\{R-1\}, "
                                         r"got .*gap.npz with topk_idx_0, topk_idx_2$"):
        load_routing_file(str(gap), 2, 256, 6)
