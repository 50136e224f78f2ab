"""Does sgl-deep-gemm's SM90 ``fp8_mega_moe`` (DeepGEMM's SM90 mega MoE, FP8 weights with
128 x 128 block scales; issue 5's third peer) run on this GPU machine? EP1, V4-Flash shape.

Each step prints ok or its error and is written to ``$OUT/sgl_probe.json`` at once: the
import, a one-rank NCCL group, its symmetric buffer (``get_symm_buffer_for_sm90_mega_moe``;
where that fails, the buffer's slicer again on a DLPack capsule and on a ``tvm_ffi`` tensor),
the weight transform, then per token count its pre-dispatch and kernel. If the kernel runs,
it is timed back to back (five calls between one event pair, best of three rounds) beside
this project's kernel in the same process. Run with the wheels on the path, e.g. carried to
the device and installed with ``pip install --no-index --no-deps --target /tmp/sgl``:
``PYTHONPATH=$PWD:/tmp/sgl python3 benchmarks/device/sgl_deep_gemm_probe.py``.

On the lent H200s (torch 2.11, 2026-12-02, benchmarks/results/peer_sgl_deep_gemm_h200.json):
0.2.5 does not load (``_C.so``: undefined symbol ``c10::cuda::CUDAErrorLogCapture``, a newer
torch's); 0.2.2 (with apache-tvm-ffi 0.1.11) imports, but its buffer's slicer fails ("tensor
does not have a device") on the torch tensor and on a ``tvm_ffi`` tensor, and refuses a
DLPack capsule, so its kernel never ran. shared/anchors/README.md saw the same.
"""
import json
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist

sys.path.insert(0, os.getcwd())
OUT = os.environ.get("OUT", "/tmp")
res = {"steps": {}, "times": {}}


def dump():
    with open(os.path.join(OUT, "sgl_probe.json"), "w") as f:
        json.dump(res, f, indent=1)


def step(name, fn):
    t0 = time.time()
    try:
        v = fn()
        res["steps"][name] = f"ok ({time.time() - t0:.1f} s)"
        print(name, res["steps"][name], flush=True)
        dump()
        return v, True
    except Exception as e:  # noqa: BLE001
        res["steps"][name] = f"{type(e).__name__}: {str(e)[:600]}"
        print(name, "FAILED", res["steps"][name], flush=True)
        traceback.print_exc()
        dump()
        return None, False


dg, ok = step("import deep_gemm", lambda: __import__("deep_gemm"))
if not ok:
    sys.exit(0)
res["deep_gemm_version"] = getattr(dg, "__version__", "?")
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29517")
torch.cuda.set_device(0)
step("init_process_group", lambda: dist.init_process_group("nccl", rank=0, world_size=1,
                                                              device_id=torch.device("cuda", 0)))
group = dist.group.WORLD
E, K, H, I = 256, 6, 4096, 2048
TMAX = 8192
buf, ok = step("get_symm_buffer_for_sm90_mega_moe",
               lambda: dg.get_symm_buffer_for_sm90_mega_moe(group, E, TMAX, K, H, I))
if not ok:  # the anchors' failure: slice_input_buffers on the torch tensor (tvm-ffi); try other handles
    import torch.distributed._symmetric_memory as symm_mem
    from deep_gemm.utils.math import align
    tmax = align(TMAX, dg._C.get_token_alignment_for_mega_moe())
    (n, slicer), _ = step("get_symm_buffer_size", lambda: dg._C.get_symm_buffer_size_for_sm90_mega_moe(
        1, E, tmax, K, H, I, True, "swiglu"))
    b = symm_mem.empty(n, dtype=torch.int8, device="cuda")
    h = symm_mem.rendezvous(b, group=group)
    b.zero_()
    convs = {"dlpack capsule": lambda t: torch.utils.dlpack.to_dlpack(t)}
    try:
        import tvm_ffi
        convs["tvm_ffi.from_dlpack"] = lambda t: tvm_ffi.from_dlpack(t)
    except Exception as e:  # noqa: BLE001
        res["steps"]["import tvm_ffi"] = f"{type(e).__name__}: {e}"
    for name, conv in convs.items():
        sl, ok = step(f"slice_input_buffers({name})", lambda c=conv: slicer(c(b)))
        if ok:
            buf = object.__new__(dg.SM90SymmBuffer)
            buf.group, buf.num_experts, buf.num_max_tokens_per_rank, buf.num_topk = group, E, tmax, K
            buf.hidden, buf.intermediate_hidden, buf.buffer, buf.handle = H, I, b, h
            fl = dg._from_dlpack_if_needed
            (x, x_sf, ti, tw, a1, a1s, a2, a2s) = sl
            buf.x, buf.x_sf = fl(x, torch.float8_e4m3fn), fl(x_sf)
            buf.topk_idx, buf.topk_weights = fl(ti), fl(tw)
            break
if buf is None:
    sys.exit(0)
res["buffer"] = {k: [str(getattr(buf, k).dtype), list(getattr(buf, k).shape)] for k in ("x", "x_sf", "topk_idx", "topk_weights")}
dump()
g = torch.Generator(device="cuda").manual_seed(6)
w1 = (torch.randn(E, 2 * I, H, device="cuda", generator=g, dtype=torch.bfloat16) * 0.05).to(torch.float8_e4m3fn)
w2 = (torch.randn(E, H, I, device="cuda", generator=g, dtype=torch.bfloat16) * 0.05).to(torch.float8_e4m3fn)
s1 = torch.rand(E, 2 * I // 128, H // 128, device="cuda", generator=g) + 0.5
s2 = torch.rand(E, H // 128, I // 128, device="cuda", generator=g) + 0.5
(l1, l2), ok = step("transform_weights_for_mega_moe_sm90", lambda: dg.transform_weights_for_mega_moe_sm90((w1, s1), (w2, s2)))
if not ok:
    sys.exit(0)
from megamoe.kernel import MegaMoEKernel, prepare_weights
from megamoe.kernel.check import make_inputs, make_weights
from megamoe.kernel.timing import cuda_steady_us

ours = MegaMoEKernel(E, K, H, I, TMAX, prepare_weights(*make_weights(E, H, I, "cuda", seed=11)))
for T in (64, 1024, 8192):
    x8, xs, idx, tw = make_inputs(T, E, K, H, "cuda", seed=100 + T)
    xb = (x8.view(torch.float8_e4m3fn).float().reshape(T, -1, 32)
          * torch.pow(2.0, xs.float() - 127.0)[..., None]).reshape(T, H).to(torch.bfloat16)
    idx_dg = idx.to(buf.topk_idx.dtype)
    y = torch.empty(T, H, device="cuda", dtype=torch.bfloat16)

    def pre(T=T, xb=xb, idx_dg=idx_dg, tw=tw):
        dg.mega_moe_pre_dispatch_sm90(xb, idx_dg, tw, buf.x, buf.x_sf, buf.topk_idx, buf.topk_weights, T)

    def moe(y=y):
        dg.fp8_mega_moe(y, l1, l2, buf)

    _, ok = step(f"T={T} pre_dispatch", lambda: (pre(), torch.cuda.synchronize()))
    if not ok:
        break
    _, ok = step(f"T={T} fp8_mega_moe (first call, JIT)", lambda: (moe(), torch.cuda.synchronize()))
    if not ok:
        break
    res["times"][T] = {
        "sgl_moe_us": min(cuda_steady_us(moe, 5, rounds=3)),
        "sgl_pre_plus_moe_us": min(cuda_steady_us(lambda pre=pre, moe=moe: (pre(), moe()), 5, rounds=3)),
        "ours_us": min(cuda_steady_us(lambda c=(x8, xs, idx, tw): ours(*c), 5, rounds=3)),
        "sgl_y_finite": bool(torch.isfinite(y.float()).all()),
    }
    print(T, res["times"][T], flush=True)
    dump()
dist.destroy_process_group()
