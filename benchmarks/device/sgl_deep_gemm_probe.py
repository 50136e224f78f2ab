"""sgl-deep-gemm's SM90 ``fp8_mega_moe`` (DeepGEMM's SM90 mega MoE: FP8 weights with 128 x 128
block scales; issue 5's third peer) beside this kernel and FlagGems, interleaved, on one GPU
(EP1, V4-Flash shape).

Each set-up step prints ok or its error and is written to the JSON at once: the shim (if
given), the import, a one-rank NCCL group, its symmetric buffer
(``get_symm_buffer_for_sm90_mega_moe``), the weight transform; then per token count its
pre-dispatch (BF16 -> FP8 per 128 into the buffer) and first kernel call (JIT compile). Its
output is checked against FP32 math on its own weights (``FP8BlockWeights.reference`` of
``kernel_bench.py``, the weights FlagGems runs on too) at ``--check-tokens``, and a second
call must give bitwise the same output. Then ABBA rounds over this kernel on two kernel objects,
FlagGems (if ``flag_gems`` imports) and sgl-deep-gemm's kernel alone (its input already in the
symmetric buffer) and with its pre-dispatch: each time the steady-state time per call (five
calls back to back between one event pair, :func:`megamoe.kernel.timing.cuda_steady_us`).
sgl-deep-gemm gets ``num_tokens_bound = tokens`` (its schedule chosen per call, as ours is).

The PyPI wheels and the lent H200s' torch 2.11 (2026-12-02, benchmarks/NOTES_kernel.md,
benchmarks/results/peer_sgl_deep_gemm_h200.json): 0.2.5's ``_C.so`` (and, by ``nm``, 0.2.3's)
was built against a newer torch. It imports eight functions torch 2.11 does not export. ``--shim`` loads libraries
with RTLD_GLOBAL first: ``torch_abi_shim.cpp`` (forwarders and the log capture for the imports
on the load and launch paths) and the aborting stubs that ``missing_symbol_stubs.py`` writes for
the rest (each built with g++). Its operators then register, but under another dispatch key
(the DispatchKey numbering differs), which ``--redispatch CPU`` calls them through. Its host
code then runs and stops at its own check of the symmetric buffer's size, most likely because
its inline tensor accessors read torch 2.11's TensorImpl with another torch's layout. So 0.2.5 does not run
here; 0.2.2 (apache-tvm-ffi 0.1.11) fails creating its symmetric buffer ("tensor does not have
a device"). The script runs the comparison as is wherever the wheel matches the torch.

Usage: PYTHONPATH=$PWD:/tmp/sgl python3 benchmarks/device/sgl_deep_gemm_probe.py OUT.json
[--shim libtorch_abi_shim.so --shim libstubs.so] [--tokens 1,16,...] [--rounds 6] [--check-tokens 64,1024],
with the wheel installed by ``pip install --no-index --no-deps --target /tmp/sgl``.
"""
import ctypes
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from megamoe.errors import OneLineArgumentParser
from megamoe.kernel.timing import alternating_rounds, cuda_steady_us, token_counts
from megamoe.outputs import check_output_path


def main() -> int:
    ap = OneLineArgumentParser(description="sgl-deep-gemm's SM90 fp8_mega_moe beside this kernel (module docstring)")
    ap.add_argument("out", type=Path, help="JSON file to write (rewritten after every step)")
    ap.add_argument("--shim", type=Path, action="append", default=[],
                    help="shared library loaded with RTLD_GLOBAL before deep_gemm (repeatable, loaded in order)")
    ap.add_argument("--redispatch", default=None,
                    help="call deep_gemm's operators through this dispatch key (e.g. CPU: where its registrations "
                         "landed on an older torch) instead of the tensors' own")
    ap.add_argument("--tokens", default="8192,1024,64,4096,256,16,1", help="comma-separated token counts (default %(default)s)")
    ap.add_argument("--rounds", type=int, default=6, help="ABBA rounds per token count, >= 2 (default %(default)s)")
    ap.add_argument("--check-tokens", default="64,1024", help="token counts whose output is checked (default %(default)s)")
    a = ap.parse_args()
    with ap.input_errors():
        tokens = token_counts(a.tokens)
        check = set(token_counts(a.check_tokens, "check-tokens"))
    if a.rounds < 2:
        ap.error(f"rounds: expected an integer >= 2, got {a.rounds}")
    with ap.input_errors():
        check_output_path("out", a.out)
    if not check.issubset(tokens):
        ap.error(f"check-tokens: expected token counts among --tokens ({a.tokens}), got {a.check_tokens!r}")
    for shim in a.shim:
        if not shim.is_file():
            ap.error(f"shim: expected an existing shared library, got {str(shim)!r}")
    import torch
    import torch.distributed as dist
    from kernel_bench import (  # the FP8 weights' shape is the run's
        E,
        FlagGemsFP8,
        FP8BlockWeights,
        H,
        I,
        K,
        dequantized_bf16,
    )

    if a.redispatch is not None and not isinstance(getattr(torch._C.DispatchKey, a.redispatch, None),
                                                   torch._C.DispatchKey):
        ap.error(f"redispatch: expected a torch dispatch key name (e.g. CPU), got {a.redispatch!r}")
    from megamoe.kernel.timing import require_sm90_gpu

    require_sm90_gpu(ap)

    res = {"steps": {}, "tokens": {}, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "torch": torch.__version__, "shape": {"E": E, "K": K, "H": H, "I": I}, "rounds": a.rounds}

    def dump():
        a.out.write_text(json.dumps(res, indent=1))

    def step(name, fn):
        t0 = time.time()
        try:
            v = fn()
            res["steps"][name] = f"ok ({time.time() - t0:.1f} s)"
            print(name, res["steps"][name], flush=True)
            dump()
            return v, True
        except Exception as e:  # noqa: BLE001 -- the probe reports every failure and goes on or stops
            res["steps"][name] = f"{type(e).__name__}: {str(e)[:600]}"
            print(name, "FAILED", res["steps"][name], flush=True)
            traceback.print_exc()
            dump()
            return None, False

    for shim in a.shim:
        _, ok = step(f"load shim {shim.name}", lambda shim=shim: ctypes.CDLL(str(shim), mode=ctypes.RTLD_GLOBAL))
        if not ok:
            return 1
    dg, ok = step("import deep_gemm", lambda: __import__("deep_gemm"))
    if not ok:
        return 1
    res["deep_gemm_version"] = getattr(dg, "__version__", "?")
    res["dispatch_table fp8_mega_moe"] = torch._C._dispatch_dump("deep_gemm::fp8_mega_moe")[:1500]
    if a.redispatch is not None:
        def through_key():
            keys = torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, a.redispatch))
            ops = type(dg._C)

            def getattr_(self, name):
                op = getattr(torch.ops.deep_gemm, name).default
                f = lambda *args, **kw: op.redispatch(keys, *args, **kw)
                setattr(self, name, f)
                return f
            ops.__getattr__ = getattr_
            for name in list(vars(dg._C)):  # the operators bound during the import
                delattr(dg._C, name)
        _, ok = step(f"redispatch through {a.redispatch}", through_key)
        if not ok:
            return 1
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    torch.cuda.set_device(0)
    step("init_process_group", lambda: dist.init_process_group("nccl", rank=0, world_size=1,
                                                                  device_id=torch.device("cuda", 0)))
    buf, ok = step("get_symm_buffer_for_sm90_mega_moe",
                   lambda: dg.get_symm_buffer_for_sm90_mega_moe(dist.group.WORLD, E, max(tokens), K, H, I))
    if not ok:
        return 1
    fw = FP8BlockWeights()
    (l1, l2), ok = step("transform_weights_for_mega_moe_sm90",
                        lambda: dg.transform_weights_for_mega_moe_sm90((fw.w1, fw.s1), (fw.w2, fw.s2)))
    if not ok:
        return 1
    try:
        fg = FlagGemsFP8()
        res["flaggems"] = __import__("flag_gems").__version__
    except ImportError as e:
        fg = None
        res["flaggems"] = f"not run: {e}"
    from megamoe.kernel import MegaMoEKernel, prepare_weights
    from megamoe.kernel.build import library_path
    from megamoe.kernel.check import make_inputs, make_weights

    res["build"] = library_path("sm_90a").parent.name
    w = prepare_weights(*make_weights(E, H, I, "cuda", seed=11))
    objs = [MegaMoEKernel(E, K, H, I, max(tokens), w) for _ in range(2)]
    for T in tokens:
        x8, xs, idx, tw = make_inputs(T, E, K, H, "cuda", seed=100 + T)
        xb = dequantized_bf16(x8, xs)
        idx_dg = idx.to(buf.topk_idx.dtype)
        y = torch.empty(T, H, device="cuda", dtype=torch.bfloat16)

        def pre(T=T, xb=xb, idx_dg=idx_dg, tw=tw):
            dg.mega_moe_pre_dispatch_sm90(xb, idx_dg, tw, buf.x, buf.x_sf, buf.topk_idx, buf.topk_weights, T)

        def moe(y=y, T=T):
            dg.fp8_mega_moe(y, l1, l2, buf, num_tokens_bound=T)

        row = res["tokens"].setdefault(T, {})
        _, ok = step(f"T={T} pre_dispatch", lambda: (pre(), torch.cuda.synchronize()))
        if not ok:
            break
        _, ok = step(f"T={T} fp8_mega_moe (first call, JIT)", lambda: (moe(), torch.cuda.synchronize()))
        if not ok:
            break
        y1 = y.clone()
        moe()
        torch.cuda.synchronize()
        row["sgl_repeat_bitwise"] = bool(torch.equal(y1.view(torch.int16), y.view(torch.int16)))
        row["sgl_finite"] = bool(torch.isfinite(y.float()).all())
        if T in check:
            ref = fw.reference(xb, idx, tw)
            row["sgl_rel_l2_vs_fp32"] = float((y.float() - ref).norm() / ref.norm())
            if fg is not None:
                yf = fg(xb, idx, tw)
                row["flaggems_rel_l2_vs_fp32"] = float((yf.float() - ref).norm() / ref.norm())
        fns = {"ours@0": lambda c=(x8, xs, idx, tw): objs[0](*c), "ours@1": lambda c=(x8, xs, idx, tw): objs[1](*c),
               "sgl": moe, "sgl+pre": lambda: (pre(), moe())}
        if fg is not None:
            fns["flaggems"] = lambda c=(xb, idx, tw): fg(*c)
        for fn in fns.values():  # warm-up (Triton compile, first launches)
            fn()
        per_round = alternating_rounds(fns, a.rounds, lambda fn: cuda_steady_us(fn, 5, rounds=1)[0],
                                       after_round=lambda: [k.check() for k in objs])
        ours = [(r["ours@0"] * r["ours@1"]) ** 0.5 for r in per_round]
        row.update({"ours_us": statistics.median(ours), "block_m": objs[0].last_design.block_m,
                    "rounds_raw": per_round})
        for name in fns:
            if not name.startswith("ours"):
                ratios = [o / r[name] for o, r in zip(ours, per_round)]
                row[f"{name}_us"] = statistics.median(r[name] for r in per_round)
                row[f"ours/{name}"] = [statistics.median(ratios), min(ratios), max(ratios)]
        print(f"T={T:5d} ours {row['ours_us']:8.1f} us  " + "  ".join(
            f"{n} {row[n + '_us']:8.1f} ({row['ours/' + n][0]:.3f})" for n in fns if not n.startswith("ours")) +
              (f"  rel L2 sgl {row['sgl_rel_l2_vs_fp32']:.2e}" if T in check else ""), flush=True)
        dump()
    res["ran"] = any("ours_us" in r for r in res["tokens"].values())
    dump()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
