"""GPU-free tests of the kernel-path selection (``megamoe.kernel.select``) and of the ctypes ABI
of both paths.

The compute capability is monkeypatched (no GPU here); the SM100 library is built with nvcc
and loaded with ctypes on this CPU machine (it links the CUDA runtime statically and its
host entry points that do not touch a device run without one). Nothing here executes
kernel code.
"""

import ctypes
import dataclasses
import importlib
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from megamoe.errors import InputError

select = importlib.import_module("megamoe.kernel.select")
runtime = importlib.import_module("megamoe.kernel.runtime")
kbuild = importlib.import_module("megamoe.kernel.build")
CSRC = Path(__file__).resolve().parents[1] / "csrc" / "megamoe"
SUPPORTED = "9.x (sm_90a, H100/H200) or 10.0 (sm_100a, B200)"


def _need_sm100_build():
    if kbuild.find_nvcc() is None:
        pytest.skip("nvcc not installed")
    if kbuild.find_cutlass_include() is None:
        pytest.skip("CUTLASS/CuTe headers not found (pip install nvidia-cutlass)")


# ------------------------------------------------------------------ selection


@pytest.mark.parametrize("cc,arch,prefix,executed", [((9, 0), "sm_90a", "megamoe_sm90", True),
                                                      ((10, 0), "sm_100a", "megamoe_sm100", False)])
def test_select_supported_capabilities(monkeypatch, cc, arch, prefix, executed):
    monkeypatch.setattr(select, "device_capability", lambda device=None: cc)
    p = select.path_for_device("cuda:0")
    assert p is select.PATHS[arch]
    assert (p.arch, p.prefix, p.symbol("launch")) == (arch, prefix, f"{prefix}_launch")
    assert p.launch_missing is None  # MegaMoEKernel launches both paths
    assert (p.unverified is None) == executed  # ... but SM100 has never run
    if not executed:
        assert p.unverified == select.SM100_UNVERIFIED and "NEVER EXECUTED" in p.unverified
    want = runtime.Params if arch == "sm_90a" else select._sm100_params()
    assert p.params_type is want
    assert p.entries[f"{prefix}_launch"][0](p) == [ctypes.POINTER(want), ctypes.c_void_p]
    if arch == "sm_100a":
        assert [f for f, _ in want._fields_] == ["base", "block_k", "pull_bytes", "sf_pool_rows", "reserved"]
        assert want._fields_[0][1] is runtime.Params


@pytest.mark.parametrize("cc", [(8, 0), (12, 0), (10, 3), (7, 5)])
def test_unsupported_capability_is_one_line_input_error(monkeypatch, cc):
    monkeypatch.setattr(select, "device_capability", lambda device=None: cc)
    with pytest.raises(InputError) as ei:
        select.path_for_device()
    msg = str(ei.value)
    assert msg == f"device.compute_capability: expected {SUPPORTED}, got {cc[0]}.{cc[1]}"
    assert "\n" not in msg


def test_selection_is_build_arch_for_capability():
    """One rule: the table answers exactly where build.arch_for_capability does."""
    for major in range(6, 13):
        for minor in range(10):
            try:
                arch = kbuild.arch_for_capability(major, minor)
            except kbuild.KernelBuildError:
                with pytest.raises(InputError):
                    select.select_path(major, minor)
                continue
            assert select.select_path(major, minor).arch == arch
    assert set(select.PATHS) == set(kbuild.SOURCES) == set(kbuild.LIBNAMES)


class _FakeLib:
    pass


@pytest.fixture
def fake_loader(monkeypatch):
    """Record which arch MegaMoEKernel loads, without building anything."""
    calls = []

    def fake(arch="sm_90a"):
        calls.append(arch)
        return _FakeLib()

    monkeypatch.setattr(runtime, "load_library", fake)
    return calls


def _kernel(device="cuda:0", weights="small"):
    if weights == "small":
        from megamoe.kernel.check import make_weights
        weights = runtime.prepare_weights(*make_weights(8, 256, 128, "cpu"))
    return runtime.MegaMoEKernel(num_experts=8, topk=2, hidden=256, inter=128, max_tokens=16, weights=weights,
                                 num_sms=4, device=device)


def test_megamoe_kernel_on_sm90_loads_the_sm90_library(monkeypatch, fake_loader):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(select, "device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda d: SimpleNamespace(major=9, minor=0, multi_processor_count=132))
    k = _kernel()
    assert fake_loader == ["sm_90a"]
    assert type(k) is runtime.MegaMoEKernel  # not the SM100 subclass
    # the SM90 object keeps the weights and scales in its TMA tile layout
    from megamoe import layouts
    from megamoe.kernel.check import make_weights
    ck = make_weights(8, 256, 128, "cpu")
    w = k.weights
    assert tuple(w.w1.shape) == (8, 2, 2, 128, 64) and tuple(w.w2_sf.shape) == (8, 2, 1, 128, 4)
    back = layouts.untransform_weights_for_sm90((w.w1, w.w1_sf), (w.w2, w.w2_sf))
    # (the scale tiles hold the weight fold's table offsets; its row exponents give the row scales)
    o1, r1 = layouts.fold_e2m1_scales_for_sm90(ck[0], ck[1])
    o2, r2 = layouts.fold_e2m1_scales_for_sm90(ck[2], ck[3])
    for got, want in zip((*back[0], *back[1]), (ck[0], o1, ck[2], o2)):
        assert torch.equal(got, want)
    assert torch.equal(layouts.deinterleave_gate_up(w.w1_row_scale), torch.exp2(r1.double() - 133).float())
    assert torch.equal(w.w2_row_scale, torch.exp2(r2.double() - 133).float())
    assert torch.equal(w.fold_table, layouts.sm90_fold_table())
    assert k.path is select.PATHS["sm_90a"] and isinstance(k.lib, _FakeLib)
    assert k.num_sms == 4
    # positional arguments (device is the 14th) select the same way
    w = runtime.prepare_weights(*make_weights(8, 256, 128, "cpu"))
    k = runtime.MegaMoEKernel(8, 2, 256, 128, 16, w, None, 4, None, None, None, 10.0, None, "cuda:0")
    assert type(k) is runtime.MegaMoEKernel and fake_loader == ["sm_90a", "sm_90a"]
    with pytest.raises(InputError, match=r"^weights: expected prepare_weights\(\.\.\.\) \(checkpoint layout\), got NoneType"):
        _kernel(weights=None)
    # the SwiGLU clamp: a finite number > 0, or None (no clamp: inf)
    assert _kernel().clamp == float("inf")
    for bad in (float("nan"), float("inf"), 0.0, -1.0, "abc"):
        with pytest.raises(InputError, match=r"^clamp: expected a finite number > 0, or None for no clamp, got "):
            runtime.MegaMoEKernel(num_experts=8, topk=2, hidden=256, inter=128, max_tokens=16,
                                  weights=runtime.prepare_weights(*make_weights(8, 256, 128, "cpu")), clamp=bad,
                                  num_sms=4, device="cuda:0")
    assert runtime.MegaMoEKernel(num_experts=8, topk=2, hidden=256, inter=128, max_tokens=16,
                                 weights=runtime.prepare_weights(*make_weights(8, 256, 128, "cpu")), clamp=7,
                                 num_sms=4, device="cuda:0").clamp == 7.0
    # checkpoint tensors: uint8, three dimensions, named when not (a float scale tensor used to
    # pass and be reinterpreted as bytes; a 2-D w1 was a bare unpacking ValueError)
    ck = list(make_weights(8, 256, 128, "cpu"))
    with pytest.raises(InputError, match=r"^weights\.w1_sf: expected dtype torch\.uint8, got torch\.float32$"):
        runtime.prepare_weights(ck[0], ck[1].float(), ck[2], ck[3])
    with pytest.raises(InputError, match=r"^weights\.w1: expected 3 dimensions, got shape \(256, 128\)$"):
        runtime.prepare_weights(ck[0][0], ck[1], ck[2], ck[3])
    with pytest.raises(InputError, match=r"^weights\.w2: expected dtype torch\.uint8, got torch\.int8$"):
        runtime.prepare_weights(ck[0], ck[1], ck[2].view(torch.int8), ck[3])
    # 254 is the largest finite UE8M0 byte (2^127), 255 is NaN: the SM90 kernel takes every byte
    # up to 254 (its row scale 2^(s_max - 133) and the fold offsets are computed on the host)
    for field, idx in (("w1_sf", 1), ("w2_sf", 3)):
        ck = list(make_weights(8, 256, 128, "cpu"))
        ck[idx][3, 5, 1] = 254
        _kernel(weights=runtime.prepare_weights(*ck))
        ck[idx][3, 5, 1] = 255
        with pytest.raises(InputError, match=rf"^weights\.{field}: expected UE8M0 bytes <= 254 \(255 is NaN\), "
                                             r"got a byte 255$"):
            _kernel(weights=runtime.prepare_weights(*ck))


# ------------------------------------------------------------------ the SM100 launch (no B200: a recording library)


class _RecordingSm100Lib:
    """Stands in for libmegamoe_sm100.so. megamoe_sm100_launch records a copy of the
    Sm100Params it is given (and the stream) and returns ``rc``; the device-free entry points
    forward to the real library when one is given (built here with nvcc), else accept."""

    def __init__(self, real=None, rc=0):
        self.real, self.rc, self.calls = real, rc, []

    def megamoe_sm100_launch(self, q, stream):
        obj = q._obj  # ctypes.byref(Sm100Params)
        self.calls.append((type(obj), type(obj).from_buffer_copy(obj), stream.value))
        return self.rc

    def megamoe_sm100_check_config(self, *args):
        return self.real.megamoe_sm100_check_config(*args) if self.real is not None else 0

    def megamoe_sm100_error_string(self, rc):
        return self.real.megamoe_sm100_error_string(rc) if self.real is not None else f"fake error {rc}".encode()


STREAM = 0x5A5A0


@pytest.fixture(params=["fake", "real-checks"])
def sm100_env(request, monkeypatch, fresh_libs):
    """A 10.0 device with 148 SMs (capability and properties monkeypatched), tensors on the CPU,
    runtime.load_library returning a recording library; "real-checks" answers
    megamoe_sm100_check_config / error_string with the real sm_100a library."""
    torch = pytest.importorskip("torch")
    real = None
    if request.param == "real-checks":
        _need_sm100_build()
        real = runtime.load_library("sm_100a")
    lib = _RecordingSm100Lib(real)
    loads = []
    monkeypatch.setattr(select, "device_capability", lambda device=None: (10, 0))
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda d: SimpleNamespace(major=10, minor=0, multi_processor_count=148))
    monkeypatch.setattr(runtime, "load_library", lambda arch="sm_90a": loads.append(arch) or lib)
    sm100 = importlib.import_module("megamoe.kernel.sm100")
    monkeypatch.setattr(sm100, "current_stream", lambda torch, device: STREAM)
    return SimpleNamespace(lib=lib, loads=loads, torch=torch, sm100=sm100, real=real)


# (E, K, H, I, max_tokens): small enough for CPU tensors, every shape constraint of the kernel met
SHAPE = (8, 2, 512, 256, 64)


def _ckpt(E, H, I, seed=0):
    import torch
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, 256, (E, 2 * I, H // 2), dtype=torch.uint8, generator=g),
            torch.randint(100, 140, (E, 2 * I, H // 32), dtype=torch.uint8, generator=g),
            torch.randint(0, 256, (E, H, I // 2), dtype=torch.uint8, generator=g),
            torch.randint(100, 140, (E, H, I // 32), dtype=torch.uint8, generator=g))


def _sm100_kernel(env, shape=SHAPE, **kw):
    E, K, H, I, T_max = shape
    ck = _ckpt(E, H, I)
    with pytest.warns(env.sm100.UnverifiedKernelWarning, match="NEVER EXECUTED"):
        k = runtime.MegaMoEKernel(E, K, H, I, T_max, runtime.prepare_weights(*ck), device="cpu", **kw)
    return k, ck


def _inputs(torch, T, E, K, H, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 120, (T, H), dtype=torch.uint8, generator=g).view(torch.float8_e4m3fn)
    x_sf = torch.randint(110, 130, (T, H // 32), dtype=torch.uint8, generator=g)
    idx = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)]).to(torch.int32) if T else \
        torch.zeros(0, K, dtype=torch.int32)
    w = torch.rand(T, K, generator=g, dtype=torch.float32)
    return x, x_sf, idx, w


def _plan_config(k, T, idx):
    """config_from_plan of the deepgemm-sm100 plan of this call (same tokens, max tokens, SMs)."""
    import numpy as np

    from megamoe import design_sm100
    from megamoe import plan as P
    plan = P.build_plan(num_experts=k.E, top_k=k.K, hidden=k.H, intermediate=k.I, num_ranks=1, tokens_per_rank=[T],
                        max_tokens_per_rank=k.max_tokens, topk_idx=[np.asarray(idx, dtype=np.int64)],
                        num_sms=k.num_sms, design="deepgemm-sm100")
    return plan, design_sm100.config_from_plan(plan)


def _expected_fields(k, cfg, T, x, x_sf, idx, w, y, trace_cap=0, tr=None, trc=None):
    """Every Sm100Params field (base fields by name) and the value it must hold."""
    ptr = lambda t: t.data_ptr() or None  # noqa: E731  (ctypes reads a null c_void_p as None; T = 0: empty tensors)
    ws = k._ws
    base = dict(
        num_tokens=T, hidden=k.H, inter=k.I, num_experts=k.E, topk=k.K, block_m=cfg.block_m,
        num_stages=cfg.num_stages, experts_per_wave=cfg.experts_per_wave, num_sms=cfg.num_sms,
        pool_rows=cfg.pool_tokens, timeout_ns=k.timeout_ns, trace_cap=trace_cap, fault_inject=0, clamp=k.clamp,
        x=ptr(x), x_sf=ptr(x_sf), topk_idx=ptr(idx), topk_w=ptr(w),
        w1=ptr(k.weights.w1), w1_sf=ptr(k.weights.w1_sf), w2=ptr(k.weights.w2), w2_sf=ptr(k.weights.w2_sf),
        **{n: ptr(ws[n]) for n in ("l1_pool", "l1_pool_sf", "l2_pool", "l2_pool_sf", "pool_token", "pool_slot",
                                   "pool_weight", "expert_count", "arrival", "mask", "grid_sync", "error",
                                   "item_pos", "combine_buf", "item_order")},
        y=ptr(y), trace=ptr(tr) if tr is not None else None, trace_count=ptr(trc) if trc is not None else None,
        progress=None, combine_rows=T, device=-1, num_ranks=1, rank=0,
        off_x=0, off_x_sf=0, off_topk_w=0, off_src_idx=0, off_recv_count=0, off_combine=0, off_flag=0,
        peer_base=None, send_count=None, cta_hist=None, pool_rank=None, epoch_counter=None,
        w1_row_scale=None, w2_row_scale=None, fold_table=None,  # the SM90 weight fold: not read by SM100
        l1_pool_fsx=None, l2_pool_fsx=None,  # nor the SM90 FP32 token scales
        ctas_per_sm=0)  # nor the SM90 CTAs per SM (0: one)
    ext = dict(block_k=cfg.block_k, pull_bytes=cfg.bytes_per_pull, sf_pool_rows=cfg.sf_pool_rows, reserved=0)
    return base, ext


def _assert_params(q, base, ext):
    names = [n for n, _ in runtime.Params._fields_]
    assert set(base) == set(names), set(names) ^ set(base)  # every field of params.h's Params is checked
    assert [n for n, _ in type(q)._fields_] == ["base", *ext]
    for n in names:
        assert getattr(q.base, n) == base[n], (n, getattr(q.base, n), base[n])
    for n, v in ext.items():
        assert getattr(q, n) == v, (n, getattr(q, n), v)


def test_megamoe_kernel_on_sm100_is_the_sm100_kernel_and_warns(sm100_env):
    """On 10.0, MegaMoEKernel(...) loads (builds, binds, ABI-checks) the sm_100a library, returns
    the SM100 kernel, and warns that the kernel has never executed."""
    k, _ = _sm100_kernel(sm100_env)
    assert type(k) is sm100_env.sm100.MegaMoEKernelSm100 and isinstance(k, runtime.MegaMoEKernel)
    assert sm100_env.loads == ["sm_100a"] and k.lib is sm100_env.lib and k.path is select.PATHS["sm_100a"]
    assert k.num_sms == 148 and sm100_env.lib.calls == []  # nothing launched at construction


@pytest.mark.parametrize("T", [0, 1, 5, 17, 40, 64])
def test_sm100_launch_fills_every_sm100params_field(sm100_env, T):
    """One call = one megamoe_sm100_launch(&Sm100Params, stream) with every field equal to what
    it must be: numbers = the deepgemm-sm100 plan's for this call (config_from_plan, and the
    plan's fields), shape, pointers = data_ptr() of the inputs, weights, workspace and output;
    the EP fields those of an EP=1 launch; the current stream."""
    torch = sm100_env.torch
    k, _ = _sm100_kernel(sm100_env)
    E, K, H, _, _ = SHAPE
    x, x_sf, idx, w = _inputs(torch, T, E, K, H)
    y = k(x, x_sf, idx, w)
    assert len(sm100_env.lib.calls) == 1
    st, q, stream = sm100_env.lib.calls[0]
    assert st is select.PATHS["sm_100a"].params_type and stream == STREAM
    plan, cfg = _plan_config(k, T, idx)
    assert k.last_design == cfg
    r = plan.ranks[0]
    assert (q.base.block_m, q.block_k, q.base.num_stages, q.base.experts_per_wave, q.base.num_sms, q.base.pool_rows,
            q.pull_bytes) == (r.config.block_m, r.config.block_k, r.num_stages, r.experts_per_wave, plan.num_sms,
                              plan.pool_tokens, plan.bytes_per_pull)
    assert tuple(y.shape) == (T, H) and y.dtype == torch.bfloat16
    _assert_params(q, *_expected_fields(k, cfg, T, x, x_sf, idx, w, y))


def test_sm100_launch_numbers_follow_the_token_count(sm100_env):
    """Token counts that pick different block_m: each call's numbers are its own plan's, the
    workspace follows the config (scale pools re-sized), and the pointers follow."""
    torch = sm100_env.torch
    shape = (16, 4, 512, 256, 2048)
    k, _ = _sm100_kernel(sm100_env, shape)
    E, K, H, _, _ = shape
    seen = set()
    for T in (1, 40, 100, 200, 300, 600, 2048):
        x, x_sf, idx, w = _inputs(torch, T, E, K, H, seed=T)
        y = k(x, x_sf, idx, w)
        _, q, _ = sm100_env.lib.calls[-1]
        _, cfg = _plan_config(k, T, idx)
        _assert_params(q, *_expected_fields(k, cfg, T, x, x_sf, idx, w, y))
        assert tuple(k._ws["l1_pool_sf"].shape) == (H // 128, cfg.sf_pool_rows, 4)
        seen.add(cfg.block_m)
    assert seen == {16, 32, 64, 96, 128, 192}


def test_sm100_weights_handed_to_the_kernel_are_the_transform(sm100_env):
    """The memory at Sm100Params.w1 .. w2_sf is, byte for byte, layouts.transform_weights_for_mega_moe
    of the checkpoint given to prepare_weights (scales in their MN-major storage order: the
    producer reads int32 word (e * K/128 + kb) * N + row); the inverse transform of what the
    kernel holds gives the checkpoint back."""
    torch = sm100_env.torch
    from megamoe import layouts
    k, ck = _sm100_kernel(sm100_env)
    E, K, H, I, _ = SHAPE
    k(*_inputs(torch, 9, E, K, H))
    _, q, _ = sm100_env.lib.calls[0]
    (w1, s1), (w2, s2) = layouts.transform_weights_for_mega_moe((ck[0], ck[1]), (ck[2], ck[3]))
    for field, want, n, kd in (("w1_sf", s1, 2 * I, H), ("w2_sf", s2, H, I)):
        raw = ctypes.string_at(getattr(q.base, field), E * (kd // 128) * n * 4)
        words = torch.frombuffer(bytearray(raw), dtype=torch.int32).view(E, kd // 128, n)
        assert torch.equal(words.permute(0, 2, 1), want)  # [e][kb][row] storage = MN-major
    for field, want in (("w1", w1), ("w2", w2)):
        raw = ctypes.string_at(getattr(q.base, field), want.numel())
        assert raw == want.contiguous().numpy().tobytes()
    for got, want in zip((k.weights.w1, k.weights.w1_sf, k.weights.w2, k.weights.w2_sf), (w1, s1, w2, s2)):
        assert torch.equal(got, want) and got.stride() == want.stride()
    (b1, bs1), (b2, bs2) = layouts.untransform_weights_for_mega_moe((k.weights.w1, k.weights.w1_sf),
                                                                     (k.weights.w2, k.weights.w2_sf))
    for got, want in zip((b1, bs1, b2, bs2), ck):
        assert torch.equal(got, want)


def test_sm100_workspace_is_the_spec(sm100_env):
    """The allocated workspace is sm100.workspace_spec (sizes derived from kernel_sm100.cu's
    indexing in tests/test_kernel_sm100.py) -- shapes, dtypes, initial values -- and is reused
    while the config's pool is unchanged."""
    torch = sm100_env.torch
    k, _ = _sm100_kernel(sm100_env)
    E, K, H, I, T_max = SHAPE
    k(*_inputs(torch, 3, E, K, H))
    cfg = k.last_design
    spec = sm100_env.sm100.workspace_spec(cfg, T_max, H, I, E, K)
    assert set(k._ws) == set(spec)
    for n, (shape, dt, init) in spec.items():
        t = k._ws[n]
        assert tuple(t.shape) == shape and t.dtype == getattr(torch, dt) and t.is_contiguous(), n
        if init is not None:
            assert bool((t == init).all()), n
    assert tuple(k._ws["l1_pool_sf"].shape) == (H // 128, cfg.sf_pool_rows, 4)
    assert tuple(k._ws["l2_pool_sf"].shape) == (I // 128, cfg.sf_pool_rows, 4)
    before = {n: t.data_ptr() for n, t in k._ws.items()}
    k(*_inputs(torch, 4, E, K, H))
    assert k.last_design == cfg and {n: t.data_ptr() for n, t in k._ws.items()} == before


def test_sm100_launch_with_a_plans_config_and_trace(sm100_env):
    """design=config_from_plan(plan) is launched as given; trace='device' passes the record
    buffers ([num_sms, cap, 6] int64, counts [2, num_sms]: from each CTA's bottom, and from its top where
    the SM90 consumer writes; the SM100 kernel uses the first row) and the capacity."""
    torch = sm100_env.torch
    from megamoe import design_sm100
    k, _ = _sm100_kernel(sm100_env)
    E, K, H, I, _ = SHAPE
    x, x_sf, idx, w = _inputs(torch, 12, E, K, H)
    _, cfg = _plan_config(k, 12, idx)
    cfg = design_sm100.SM100KernelConfig(**{**cfg.as_dict(), "num_stages": 2, "experts_per_wave": 3})
    y = k(x, x_sf, idx, w, trace="device", design=cfg)
    _, q, _ = sm100_env.lib.calls[0]
    tr, trc = k._tr
    cap = k._pending_trace[2]
    assert tuple(tr.shape) == (cfg.num_sms, cap, 6) and tr.dtype == torch.int64 and tuple(trc.shape) == (2, cfg.num_sms)
    blocks = (cfg.pool_tokens // cfg.block_m) * (2 * I // 128 + H // 128)  # trace.trace_capacity's bound
    assert cap == 8 + 4 * -(-blocks // cfg.num_sms) + 64
    _assert_params(q, *_expected_fields(k, cfg, 12, x, x_sf, idx, w, y, trace_cap=cap, tr=tr, trc=trc))
    with pytest.raises(InputError, match="^design"):
        k(x, x_sf, idx, w, design=runtime.design_sm90.design_for(12, H, I, E, K, num_sms=148))


def test_sm100_launch_error_is_a_kernel_error(sm100_env):
    torch = sm100_env.torch
    k, _ = _sm100_kernel(sm100_env)
    sm100_env.lib.rc = -3
    E, K, H, _, _ = SHAPE
    with pytest.raises(runtime.KernelError, match=r"^launch failed: .* \(code -3\)$") as ei:
        k(*_inputs(torch, 2, E, K, H))
    if sm100_env.real is not None:
        assert "not every 2-CTA cluster fits" in str(ei.value)


@pytest.mark.filterwarnings("ignore:the SM100 .* NEVER EXECUTED")
def test_sm100_inputs_and_numbers_are_checked_before_launch(sm100_env):
    torch = sm100_env.torch
    E, K, H, I, T_max = SHAPE
    k, _ = _sm100_kernel(sm100_env)
    x, x_sf, idx, w = _inputs(torch, 3, E, K, H)
    with pytest.raises(InputError, match="^x_sf"):
        k(x, x_sf[:, :-1], idx, w)
    with pytest.raises(InputError, match="^num_tokens|^x"):
        k(*_inputs(torch, T_max + 1, E, K, H))
    with pytest.raises(InputError, match="^out"):
        k(x, x_sf, idx, w, out=torch.empty(3, H, dtype=torch.float32))
    with pytest.raises(InputError, match="^num_sms"):  # 2-CTA clusters
        runtime.MegaMoEKernel(E, K, H, I, T_max, None, num_sms=147, device="cpu")
    with pytest.raises(InputError, match="^weights"):
        runtime.MegaMoEKernel(E, K, H, I, T_max, runtime.prepare_weights(*_ckpt(E, H, 2 * I)), device="cpu")
    assert sm100_env.lib.calls == []
    if sm100_env.real is not None:  # the library's own check: 512 experts is more than its lane cache holds
        with pytest.raises(InputError, match="unsupported shape or plan numbers"):
            runtime.MegaMoEKernel(512, K, H, I, T_max, None, device="cpu")


def test_sm100_pool_contents_reads_the_utccp_rows(sm100_env):
    """pool_contents() un-permutes the L1 scale pool: a scale word stored where the dispatch stores
    it (u32 word kb * sf_pool_rows + UtccpSfRow(row), roles_shared.cuh, transcribed here) comes
    back at pool row `row`."""
    torch = sm100_env.torch
    k, _ = _sm100_kernel(sm100_env)
    E, K, H, _, _ = SHAPE
    k(*_inputs(torch, 30, E, K, H))
    cfg = k.last_design
    bm, S, sfm = cfg.block_m, cfg.sf_pool_rows, -(-cfg.block_m // 128) * 128
    words = k._ws["l1_pool_sf"].view(-1).view(torch.int32)
    want = torch.zeros(cfg.pool_tokens, H // 128, dtype=torch.int32)
    for row in range(0, cfg.pool_tokens, 7):
        r = row % bm
        srow = (row // bm) * sfm + (r & ~127) + (r & 31) * 4 + ((r >> 5) & 3)
        for kb in range(H // 128):
            v = (row * 131 + kb * 17) % (1 << 30)
            words[kb * S + srow] = v
            want[row, kb] = v
    _, sf, _, _ = k.pool_contents()
    got = sf.contiguous().view(torch.int32).view(cfg.pool_tokens, H // 128)
    assert torch.equal(got[::7], want[::7])


@pytest.mark.parametrize("cc", [(8, 0), (12, 0)])
def test_megamoe_kernel_on_other_gpus_raises_before_loading(monkeypatch, fake_loader, cc):
    pytest.importorskip("torch")
    monkeypatch.setattr(select, "device_capability", lambda device=None: cc)
    with pytest.raises(InputError, match=rf"got {cc[0]}\.{cc[1]}$"):
        _kernel()
    assert fake_loader == []


# ------------------------------------------------------------------ C sources vs ctypes


def _strip_comments(src: str) -> str:
    return re.sub(r"//[^\n]*", "", re.sub(r"/\*.*?\*/", "", src, flags=re.DOTALL))


def _struct_fields(src: str, name: str) -> list[tuple[str, str]]:
    """(field, kind) of ``struct <name> { ... };`` with kind int64 / double / ptr / a struct name."""
    body = re.search(r"struct\s+" + name + r"\s*\{(.*?)\};", _strip_comments(src), re.DOTALL).group(1)
    out = []
    for decl in (" ".join(d.split()) for d in body.split(";")):
        if not decl:
            continue
        if "*" in decl:
            kind, names = "ptr", decl.rsplit("*", 1)[1]
        else:
            m = re.fullmatch(r"(int64_t|double|\w+) (.+)", decl)
            kind, names = {"int64_t": "int64", "double": "double"}.get(m.group(1), m.group(1)), m.group(2)
        out += [(n.strip(), kind) for n in names.split(",")]
    return out


def _ctypes_fields(st) -> list[tuple[str, str]]:
    kinds = {ctypes.c_int64: "int64", ctypes.c_double: "double", ctypes.c_void_p: "ptr"}
    return [(n, kinds.get(t, t.__name__)) for n, t in st._fields_]


def test_sm90_params_mirror_matches_params_h_field_for_field():
    src = (CSRC / "params.h").read_text()
    assert _ctypes_fields(runtime.Params) == _struct_fields(src, "Params")


def test_sm100_params_mirror_matches_kernel_source_field_for_field():
    """Sm100Params (kernel_sm100.cu) = Params base + 4 int64 words; the ctypes mirror the
    SM100 path binds has the same fields in the same order and kinds, and 8-byte fields only,
    so the size is the field count times 8 (no padding)."""
    st = select.PATHS["sm_100a"].params_type
    c_fields = _struct_fields((CSRC / "kernel_sm100.cu").read_text(), "Sm100Params")
    assert c_fields == [("base", "Params"), ("block_k", "int64"), ("pull_bytes", "int64"),
                        ("sf_pool_rows", "int64"), ("reserved", "int64")]
    assert _ctypes_fields(st) == c_fields
    base = _struct_fields((CSRC / "params.h").read_text(), "Params")
    assert ctypes.sizeof(st) == 8 * (len(base) + len(c_fields) - 1)


_C_TYPES = {"int": ctypes.c_int, "long long": ctypes.c_longlong, "unsigned long long": ctypes.c_ulonglong,
            "const char*": ctypes.c_char_p, "void*": ctypes.c_void_p, "const void*": ctypes.c_void_p,
            "void**": ctypes.POINTER(ctypes.c_void_p)}


def _c_signatures(src: str) -> dict[str, tuple[str, list[str]]]:
    """name -> (return type, [parameter types]) of every ``megamoe_*`` function definition."""
    out = {}
    pat = re.compile(r"^((?:const )?[a-z ]+?\*?) (megamoe_\w+)\(([^)]*)\)\s*\{", re.MULTILINE)
    for m in pat.finditer(_strip_comments(src)):
        params = [] if m.group(3).strip() in ("", "void") else [
            re.sub(r"\s*\*\s*", "*", re.sub(r"\s+\w+$", "", p.strip())) for p in m.group(3).split(",")]
        out[m.group(2)] = (m.group(1).strip(), params)
    return out


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_bound_signatures_match_the_extern_c_definitions(arch):
    p = select.PATHS[arch]
    sigs = _c_signatures((CSRC / kbuild.SOURCES[arch]).read_text())
    struct = {"sm_90a": "const Params*", "sm_100a": "const Sm100Params*"}[arch]
    types = dict(_C_TYPES, **{struct: ctypes.POINTER(p.params_type)})
    for name, (args, res) in {**p.entries, **p.optional}.items():
        assert name in sigs, f"{name} not defined in {kbuild.SOURCES[arch]}"
        c_res, c_args = sigs[name]
        assert res is types[c_res], (name, c_res)
        if args is not None:
            assert (args(p) if callable(args) else list(args)) == [types[a] for a in c_args], (name, c_args)
    # every extern "C" entry point of the arch's prefix is in the table
    assert {n for n in sigs if n.startswith(p.prefix + "_")} <= set(p.entries) | set(p.optional)


# ------------------------------------------------------------------ the SM100 library on this machine


@pytest.fixture
def fresh_libs(monkeypatch):
    monkeypatch.setattr(runtime, "_LIBS", {})


def test_sm100_library_loads_and_binds_without_a_gpu(fresh_libs):
    """load_library("sm_100a") builds (or reuses) libmegamoe_sm100.so, binds the table's
    signatures and passes the ABI check: megamoe_sm100_abi_size() == sizeof(ctypes mirror)."""
    _need_sm100_build()
    from megamoe import design_sm100 as d100
    lib = runtime.load_library("sm_100a")
    st = select.PATHS["sm_100a"].params_type
    assert lib.megamoe_sm100_abi_size() == ctypes.sizeof(st) == ctypes.sizeof(runtime.Params) + 4 * 8
    assert lib.megamoe_sm100_launch.argtypes == [ctypes.POINTER(st), ctypes.c_void_p]
    assert runtime.load_library("sm_100a") is lib  # one per arch per process
    # the bound host entry points answer (no device touched)
    assert lib.megamoe_sm100_smem_bytes(128, 128, 4, 256) == d100.smem_bytes(128, 128, 4, 256)
    assert lib.megamoe_sm100_stage_bytes(16, 256) == d100.stage_bytes(16, 256)
    assert lib.megamoe_sm100_tmem_cols(192, 128) == d100.tmem_columns(192, 128)
    assert lib.megamoe_sm100_check_config(128, 128, 4, 8, 256, 4096, 2048, 1 << 33, 4096, 148) == 0
    assert lib.megamoe_sm100_check_config(48, 128, 4, 8, 256, 4096, 2048, 4608, 4096, 148) == -1
    assert lib.megamoe_sm100_error_string(-6) == b"the SM100 kernel needs a compute capability 10.x device (sm_100a)"


def test_abi_mismatch_is_a_kernel_error(monkeypatch, fresh_libs):
    _need_sm100_build()

    class Short(ctypes.Structure):
        _fields_ = [("base", runtime.Params), ("block_k", ctypes.c_int64)]

    bad = dataclasses.replace(select.PATHS["sm_100a"], params=lambda: Short)
    monkeypatch.setitem(select.PATHS, "sm_100a", bad)
    want = (rf"ABI mismatch \(sm_100a\): megamoe_sm100_abi_size\(\) = {ctypes.sizeof(runtime.Params) + 32} B, "
            rf"ctypes mirror Short = {ctypes.sizeof(runtime.Params) + 8} B$")
    with pytest.raises(runtime.KernelError, match=want):
        runtime.load_library("sm_100a")
    assert "sm_100a" not in runtime._LIBS


def test_unknown_arch():
    with pytest.raises(kbuild.KernelBuildError, match="expected one of"):
        runtime.load_library("sm_80")


def test_megamoe_kernel_without_a_cuda_device_is_an_input_error(monkeypatch):
    """No CUDA device visible (a CPU-only torch): one-line InputError naming the device, not
    torch's AssertionError from inside the capability query (found by a fresh-user pass)."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(InputError, match=r"^device: expected a CUDA GPU visible to torch \(9\.x \(sm_90a.*got none"):
        runtime.MegaMoEKernel(8, 2, 256, 128, 16, weights=None)
    with pytest.raises(InputError, match=r"^device: expected a CUDA GPU"):
        select.path_for_device()
