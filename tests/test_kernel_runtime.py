"""The SM90 kernel's host side without a GPU: what one call hands the library (every ``Params``
field, from a recording library on a monkeypatched 9.0 device with CPU tensors), its input
checks, and the per-call caches (launch fields, designs) that must never serve stale values."""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import numpy as np
import pytest

from megamoe.errors import InputError

select = importlib.import_module("megamoe.kernel.select")
runtime = importlib.import_module("megamoe.kernel.runtime")
design_sm90 = importlib.import_module("megamoe.design_sm90")

SHAPE = (8, 2, 256, 128, 64)  # E, K, H, I, max_tokens: CPU-sized, every kernel shape rule met


class _RecordingSm90Lib:
    """Stands in for the SM90 library: keeps a copy of every launch's Params and stream."""

    def __init__(self):
        self.calls = []
        self.rc = 0

    def megamoe_sm90_launch(self, p, stream):
        self.calls.append((runtime.Params.from_buffer_copy(p._obj), stream.value))
        return self.rc

    def megamoe_sm90_error_string(self, rc):
        return b"recorded error"


@pytest.fixture
def sm90_env(monkeypatch):
    torch = pytest.importorskip("torch")
    lib = _RecordingSm90Lib()
    monkeypatch.setattr(select, "device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda d: SimpleNamespace(major=9, minor=0, multi_processor_count=132))
    monkeypatch.setattr(runtime, "load_library", lambda arch="sm_90a": lib)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: SimpleNamespace(cuda_stream=77))
    return SimpleNamespace(torch=torch, lib=lib)


def _weights(seed=0):
    from megamoe.kernel.check import make_weights
    E, _, H, I, _ = SHAPE
    return runtime.prepare_weights(*make_weights(E, H, I, "cpu", seed=seed))


def _kernel(num_sms=6, **kw):
    E, K, H, I, T_max = SHAPE
    return runtime.MegaMoEKernel(E, K, H, I, T_max, _weights(), num_sms=num_sms, device="cpu", **kw)


def _inputs(torch, T, seed=0):
    E, K, H, _, _ = SHAPE
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (T, H), dtype=torch.uint8, generator=g).view(torch.float8_e4m3fn)
    x_sf = torch.randint(120, 130, (T, H // 32), dtype=torch.uint8, generator=g)
    idx = torch.randint(-1, E, (T, K), dtype=torch.int32, generator=g)
    w = torch.rand(T, K, generator=g)
    return x, x_sf, idx, w


def _expected(k, design, T, x, x_sf, idx, w, y):
    """Every Params field of an untraced call, listed from its sources (not from the cache)."""
    ws, wt = k._ws, k.weights
    f = {"num_tokens": T, "hidden": k.H, "inter": k.I, "num_experts": k.E, "topk": k.K, "block_m": design.block_m,
             "num_stages": design.num_stages, "experts_per_wave": design.experts_per_wave,
             "num_sms": design.num_sms * design.ctas_per_sm, "ctas_per_sm": design.ctas_per_sm,
             "pool_rows": design.pool_rows, "timeout_ns": k.timeout_ns, "trace_cap": 0, "fault_inject": k.fault_inject,
             "x": x.data_ptr(), "x_sf": x_sf.data_ptr(), "topk_idx": idx.data_ptr(), "topk_w": w.data_ptr(), "y": y.data_ptr(),
             "trace": 0, "trace_count": 0, "progress": 0, "combine_rows": T, "device": -1, "num_ranks": 1, "rank": 0,
             "w1": wt.w1.data_ptr(), "w1_sf": wt.w1_sf.data_ptr(), "w2": wt.w2.data_ptr(), "w2_sf": wt.w2_sf.data_ptr(),
             "w1_row_scale": wt.w1_row_scale.data_ptr(), "w2_row_scale": wt.w2_row_scale.data_ptr(),
             "fold_table": wt.fold_table.data_ptr()}
    for name in runtime.POOL_FIELDS + ("expert_count", "grid_sync", "error", "item_pos", "item_order", "combine_buf"):
        f[name] = ws[name].data_ptr()
    return f


def _assert_params(p, expected, clamp):
    got = {name: getattr(p, name) or 0 for name, _ in runtime.Params._fields_}  # a NULL c_void_p reads None
    for name, v in expected.items():
        assert got[name] == v, name
    assert got["clamp"] == pytest.approx(clamp)
    untouched = set(got) - set(expected) - {"clamp"}
    assert all(got[n] == 0 for n in untouched), {n: got[n] for n in untouched if got[n]}  # the EP fields


def test_sm90_call_hands_the_library_every_field_and_the_cache_follows_changes(sm90_env):
    torch, lib = sm90_env.torch, sm90_env.lib
    k = _kernel()
    E, K, H, I, T_max = SHAPE

    def call(T, seed=0, **kw):
        x, x_sf, idx, w = _inputs(torch, T, seed)
        y = k(x, x_sf, idx, w, **kw)
        p, stream = lib.calls[-1]
        assert stream == 77 and tuple(y.shape) == (T, H) and y.dtype == torch.bfloat16
        xu = x.view(torch.uint8)
        _assert_params(p, _expected(k, k.last_design, T, xu, x_sf, idx, w, y), k.clamp)
        return p

    p1 = call(3)
    assert k.last_design == design_sm90.design_for(3, H, I, E, K, num_sms=6)
    # block_m 16 without the wide walk: two CTAs on each of the 6 SMs, the grid 12 CTAs
    assert (k.last_design.ctas_per_sm, p1.num_sms, p1.ctas_per_sm) == (2, 12, 2)
    ws1 = k._ws
    call(3, seed=1)  # new inputs, same design and workspace: only the input / output addresses move
    call(T_max)  # another design (more pool rows): a new workspace, whose addresses the launch must carry
    assert k._ws is not ws1
    call(3)
    k.weights = runtime.sm90_weights(_weights(seed=3))  # same design, new weights object: its addresses
    call(3)
    k._ws_key = None  # same design, a new workspace (as after a reset): its addresses
    call(3)
    d = design_sm90.design_for(3, H, I, E, K, num_sms=6, num_stages=6)
    assert d != k.last_design
    p5 = call(3, design=d)
    assert p5.num_stages == 6 and p1.num_stages != 6
    k.fault_inject, k.timeout_ns = 4, 123  # per-call fields are read at every call
    p6 = call(3)
    assert (p6.fault_inject, p6.timeout_ns) == (4, 123)
    assert len(lib.calls) == 8


def test_sm90_progress_words_must_cover_every_cta(sm90_env):
    # The debug progress words are written at blockIdx.x * 32 + slot: at two CTAs per SM (3 tokens
    # on 6 SMs: 12 CTAs) a buffer of 32 words per SM is half too short (session 54: the profile
    # script's buffer overran into the next allocation). Refused before any launch.
    torch, lib = sm90_env.torch, sm90_env.lib
    k = _kernel()
    x, x_sf, idx, w = _inputs(torch, 3)
    k.progress = torch.zeros(6 * 32, dtype=torch.int32)
    with pytest.raises(InputError, match=r"^progress: expected an int32 CUDA tensor with at least 384 elements "
                                         r"\(32 per CTA, 12 CTAs\), got torch.int32 on cpu with 192 elements$"):
        k(x, x_sf, idx, w)
    k.progress = torch.zeros(12 * 32, dtype=torch.int64)
    with pytest.raises(InputError, match=r"^progress: .* got torch.int64 on cpu with 384 elements$"):
        k(x, x_sf, idx, w)
    assert lib.calls == []
    k.progress = torch.zeros(12 * 32, dtype=torch.int32)
    k(x, x_sf, idx, w)
    assert lib.calls[-1][0].progress == k.progress.data_ptr()
    k.progress = None
    k(x, x_sf, idx, w)
    assert not lib.calls[-1][0].progress


def test_sm90_call_inputs_are_checked_before_launch(sm90_env):
    torch, lib = sm90_env.torch, sm90_env.lib
    k = _kernel()
    _, K, H, _, T_max = SHAPE
    x, x_sf, idx, w = _inputs(torch, 3)
    bad = [
        ((x[:, :-1], x_sf, idx, w), {}, rf"^x: expected \[T, {H}\] float8_e4m3fn, got \(3, {H - 1}\)$"),
        (_inputs(torch, T_max + 1), {}, rf"^x: expected at most max_tokens={T_max} rows, got {T_max + 1}$"),
        ((x, x_sf[:, :-1], idx, w), {}, rf"^x_sf: expected \[3, {H // 32}\] UE8M0, got \(3, {H // 32 - 1}\)$"),
        ((x, x_sf, idx[:2], w), {}, rf"^topk_idx: expected \[3, {K}\], got \(2, {K}\)$"),
        ((x, x_sf, idx, w[:, :1]), {}, rf"^topk_weights: expected \[3, {K}\], got \(3, 1\)$"),
        ((x.view(torch.uint8).to(torch.int16), x_sf, idx, w), {}, r"^x\.dtype: expected float8_e4m3fn, got torch\.int16$"),
        ((x, x_sf.float(), idx, w), {}, r"^x_sf\.dtype: expected uint8 \(UE8M0\), got torch\.float32$"),
        ((x, x_sf, idx, w), {"trace": "yes"}, r"^trace: expected False, True or 'device', got yes$"),
        ((x, x_sf, idx, w), {"out": torch.empty(3, H, dtype=torch.float32)},
         (rf"^out: expected a contiguous bfloat16 \[3, {H}\] tensor on the call's CUDA device, "
         rf"got a contiguous float32 \[3, {H}\] tensor on cpu$")),
        ((x, x_sf, idx, w), {"out": torch.empty(H, 3, dtype=torch.bfloat16).t()},
         (rf"^out: expected a contiguous bfloat16 \[3, {H}\] tensor on the call's CUDA device, "
         rf"got a non-contiguous bfloat16 \[3, {H}\] tensor on cpu$")),
        ((x, x_sf, idx, w), {"out": "y"},
         rf"^out: expected a contiguous bfloat16 \[3, {H}\] tensor on the call's CUDA device, got str$"),
        (([1, 2], x_sf, idx, w), {}, r"^x: expected a torch tensor, got list$"),
        ((x, x_sf, idx.numpy(), w), {}, r"^topk_idx: expected a torch tensor, got ndarray$"),
        ((x[0, 0], x_sf, idx, w), {}, rf"^x: expected \[T, {H}\] float8_e4m3fn, got \(\)$"),
    ]
    for args, kw, msg in bad:
        with pytest.raises(InputError, match=msg):
            k(*args, **kw)
    assert lib.calls == []
    out = torch.empty(3, H, dtype=torch.bfloat16)
    assert k(x, x_sf, idx, w, out=out) is out
    assert lib.calls[-1][0].y == out.data_ptr()


def test_sm90_launch_error_is_a_kernel_error(sm90_env):
    k = _kernel()
    sm90_env.lib.rc = -5
    with pytest.raises(runtime.KernelError, match=r"^launch failed: recorded error \(code -5\)$"):
        k(*_inputs(sm90_env.torch, 2))


def test_design_for_is_cached_by_argument_and_still_checks():
    E, K, H, I, _ = SHAPE
    a = design_sm90.design_for(5, H, I, E, K, num_sms=6)
    assert design_sm90.design_for(5, H, I, E, K, num_sms=6) is a  # one lookup per kernel call
    b = design_sm90.design_for(5, H, I, E, K, num_sms=6, block_m=64)
    assert b.block_m == 64 and a.block_m != 64
    for _ in range(2):  # an error is not cached as a result
        with pytest.raises(InputError, match=r"^block_m: expected None \(the rule\) or one of \(16, 32, 64, 128\), got 48$"):
            design_sm90.design_for(5, H, I, E, K, num_sms=6, block_m=48)
    # every count is an integer of its range: a zero is not read as "the rule", a float or a
    # string is not taken as a number, an empty expert count is not a ZeroDivisionError
    bad = [
        ({"block_m": 0}, r"^block_m: expected None \(the rule\) or one of \(16, 32, 64, 128\), got 0$"),
        ({"block_m": 64.0}, r"^block_m: expected None \(the rule\) or one of \(16, 32, 64, 128\), got 64\.0$"),
        ({"block_m": "64"}, r"^block_m: expected None \(the rule\) or one of \(16, 32, 64, 128\), got '64'$"),
        ({"experts_per_wave": 0}, r"^experts_per_wave: expected None \(the rule\) or an integer >= 1, got 0$"),
        ({"experts_per_wave": -3}, r"^experts_per_wave: expected None \(the rule\) or an integer >= 1, got -3$"),
        ({"pool_tokens": -1}, r"^pool_tokens: expected None \(the rule\) or an integer >= 0, got -1$"),
        ({"num_experts": 0}, r"^num_experts: expected an integer >= 1, got 0$"),
        ({"ranks": 0}, r"^ranks: expected an integer >= 1, got 0$"),
        ({"num_tokens": -5}, r"^num_tokens: expected an integer >= 0, got -5$"),
        ({"topk": 0}, r"^topk: expected an integer >= 1, got 0$"),
        ({"num_sms": 0}, r"^num_sms: expected an integer >= 1, got 0$"),
        ({"num_sms": True}, r"^num_sms: expected an integer >= 1, got True$"),
        # and the counts agree with each other and with the kernel's 128 x 128 tiles
        ({"hidden": H + 64}, rf"^hidden: expected a multiple of 128, got {H + 64}$"),
        ({"inter": 100}, r"^inter: expected a multiple of 128, got 100$"),
        ({"ranks": 3}, rf"^ranks: expected a divisor of num_experts \({E}\), got 3$"),
        ({"ranks": 2 * E}, rf"^ranks: expected a divisor of num_experts \({E}\), got {2 * E}$"),
        ({"topk": E + 1}, rf"^topk: expected at most num_experts \({E}\), got {E + 1}$"),
        ({"experts_per_wave": E + 1}, rf"^experts_per_wave: expected at most the rank's {E} local experts, got {E + 1}$"),
        # (two CTAs per SM here, block_m 16: (115712 - 3072) // 11264 = 10 stages fit half an SM)
        ({"num_stages": 8.0}, r"^num_stages: expected an integer in \[4, 10\] .*, got 8\.0$"),
        ({"ctas_per_sm": 2.0}, r"^ctas_per_sm: expected 1 or 2 \(or unset: the kernel's rule\), got 2\.0$"),
        ({"ctas_per_sm": 2, "block_m": 32}, r"^ctas_per_sm: expected 1 at block_m 32, .*got 2$"),
    ]
    args = {"num_tokens": 5, "hidden": H, "inter": I, "num_experts": E, "topk": K, "num_sms": 6}
    for kw, msg in bad:
        with pytest.raises(InputError, match=msg):
            design_sm90.design_for(**{**args, **kw})
    with pytest.raises(TypeError, match="unhashable"):
        design_sm90.design_for(**{**args, "num_tokens": [5]})
    assert design_sm90.design_for(**{**args, "num_stages": np.int64(8)}).num_stages == 8  # a NumPy integer is one
    with pytest.raises(InputError, match=r"^block_m: expected one of \(16, 32, 64, 128\), got 17$"):
        design_sm90.stages_for(17, E)


def test_capture_checks_its_token_count(sm90_env):
    k = _kernel()
    for bad in (0, -1, SHAPE[4] + 1, 2.0, True):
        with pytest.raises(InputError, match=rf"^num_tokens: expected an integer in \[1, {SHAPE[4]}\], got "):
            k.capture(bad)
    assert sm90_env.lib.calls == []


def test_call_graph_fill_copies_checked_inputs_into_its_tensors(sm90_env):
    """CallGraph.fill (no graph needed): the inputs land in the graph's tensors, bytes as given."""
    torch = sm90_env.torch
    k = _kernel()
    _, K, H, _, _ = SHAPE
    T = 4
    g = runtime.CallGraph(None, torch.zeros(T, H, dtype=torch.float8_e4m3fn), torch.zeros(T, H // 32, dtype=torch.uint8),
                          torch.full((T, K), -1, dtype=torch.int32), torch.zeros(T, K), torch.empty(T, H), k)
    x, x_sf, idx, w = _inputs(torch, T, seed=5)
    g.fill(x, x_sf, idx.long(), w.double())
    assert torch.equal(g.x.view(torch.uint8), x.view(torch.uint8)) and torch.equal(g.x_sf, x_sf)
    assert torch.equal(g.topk_idx, idx) and g.topk_idx.dtype == torch.int32
    assert torch.equal(g.topk_weights, w.double().float())
    with pytest.raises(InputError, match=r"^x: expected 4 rows \(the captured token count\), got 3$"):
        g.fill(*_inputs(torch, 3))
    with pytest.raises(InputError, match=r"^x_sf: expected"):
        g.fill(x, x_sf[:, :3], idx, w)
    assert sm90_env.lib.calls == []
