"""EP benchmark: the SM90 mega-kernel over R ranks (NVLink dispatch/combine inside the kernel)
vs the unfused expert-parallel path built from public parts (NCCL all-to-all dispatch, torch
FP8 grouped GEMMs + SwiGLU/quant in torch, NCCL all-to-all combine), with the GPUs' measured
P2P (NVLink) and HBM copy bandwidth in the same run.

    python -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/ep_bench.py --out ep.json

V4-Flash shape (E 256, top-6, H 4096, I 2048), uniform random routing, the same tokens per
rank on every rank. Times: median of CUDA-event-timed calls on each rank, the slower rank
reported (each call is collective; a barrier before each call). The kernel's time includes
copying x / scales / top-k weights into the symmetric buffer; `staged_us` is the same call
with the inputs already there (`input_buffers`), `back_to_back_us` calls issued without a
barrier between them (per-call mean), `host_us` the host's own time per call; the
`megamoe_sm90_ep_cuda_graph` row replays the call captured as a CUDA graph
(`MegaMoEKernelEP.capture`, inputs filled in place; checked bitwise against the eager call). Formulas (shared/anchors/README.md):
FLOPs = 2 * routed * H * I * 3 summed over ranks / time; HBM bytes per rank = touched local
experts' weights (FP4 + scales for the kernel, FP8 for the peer) + routed rows in/out;
NVLink bytes = routed items that cross ranks * (H + H/32 + 4 in, 2H back).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from megamoe.errors import OneLineArgumentParser
from megamoe.kernel.build import library_path
from megamoe.kernel.check import make_inputs, make_weights  # noqa: E402
from megamoe.kernel.ep import MegaMoEKernelEP, p2p_bandwidth  # noqa: E402
from megamoe.kernel.runtime import prepare_weights  # noqa: E402
from megamoe.kernel.timing import cuda_steady_us, cuda_times_us  # noqa: E402

E, K, H, I = 256, 6, 4096, 2048


def time_fn(fn, reps, warmup=1):
    ts = cuda_times_us(fn, reps, warmup, before_each=dist.barrier)
    return statistics.median(ts), min(ts)


def back_to_back_us(fn, reps):
    """Mean time per call of ``reps`` calls issued back to back after one barrier (events
    around the whole run): the host's work per call hides behind the GPU's when it is shorter."""
    return cuda_steady_us(fn, reps, rounds=1, warmup=1, before_each=dist.barrier)[0]


def host_us(fn, reps):
    """Median host (Python + launch) time of one call, without waiting for the GPU."""
    ts = []
    for _ in range(reps):
        torch.cuda.synchronize()
        dist.barrier()
        t = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(ts)


class UnfusedEP:
    """Public parts: NCCL all_to_all_single of FP8 rows (+ expert id, top-k weight, token
    index), local sort + torch._scaled_grouped_mm (FP8 x FP8, row-wise scales), SwiGLU and
    per-row FP8 quantization in torch, second grouped GEMM, NCCL all_to_all back, index_add."""

    def __init__(self, rank, R):
        self.rank, self.R, self.EL = rank, R, E // R
        g = torch.Generator(device="cuda").manual_seed(5 + rank)
        self.w1 = (torch.randn(self.EL, 2 * I, H, device="cuda", generator=g, dtype=torch.bfloat16) * 0.05
                   ).to(torch.float8_e4m3fn)
        self.w2 = (torch.randn(self.EL, H, I, device="cuda", generator=g, dtype=torch.bfloat16) * 0.05
                   ).to(torch.float8_e4m3fn)
        self.s1 = torch.ones(self.EL, 2 * I, device="cuda")
        self.s2 = torch.ones(self.EL, H, device="cuda")

    def __call__(self, x, idx, w):
        T = x.shape[0]
        flat = idx.reshape(-1)
        sel = torch.nonzero(flat >= 0).squeeze(1)
        dst = (flat[sel] // self.EL)
        order = torch.argsort(dst, stable=True)
        sel = sel[order]
        send_counts = torch.bincount(dst, minlength=self.R)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts)
        sc, rc = send_counts.tolist(), recv_counts.tolist()
        tok = sel // K
        rows = x.view(torch.uint8)[tok]
        meta = torch.stack([flat[sel].to(torch.float32) - 0.0, w.reshape(-1)[sel].float()], 1)
        rrows = torch.empty(sum(rc), H, dtype=torch.uint8, device="cuda")
        rmeta = torch.empty(sum(rc), 2, dtype=torch.float32, device="cuda")
        dist.all_to_all_single(rrows, rows, rc, sc)
        dist.all_to_all_single(rmeta, meta, rc, sc)
        n = rrows.shape[0]
        out = torch.zeros(n, H, dtype=torch.bfloat16, device="cuda")
        if n:
            le = rmeta[:, 0].long() - self.rank * self.EL
            o2 = torch.argsort(le, stable=True)
            counts = torch.bincount(le, minlength=self.EL)
            offs = torch.cumsum(counts, 0).to(torch.int32)
            xs = rrows[o2].view(torch.float8_e4m3fn)
            sa = torch.ones(n, device="cuda")
            h = torch._scaled_grouped_mm(xs, self.w1.transpose(-2, -1), sa, self.s1, offs=offs,
                                         out_dtype=torch.bfloat16)
            gate, up = h[:, :I].float(), h[:, I:].float()
            a = torch.nn.functional.silu(gate) * up * rmeta[o2, 1:2]
            amax = a.abs().amax(-1, keepdim=True).clamp_min(1e-6)
            s = amax / 448.0
            aq = (a / s).to(torch.float8_e4m3fn)
            o = torch._scaled_grouped_mm(aq, self.w2.transpose(-2, -1), s.squeeze(1), self.s2, offs=offs,
                                         out_dtype=torch.bfloat16)
            out[o2] = o
        back = torch.empty(len(sel), H, dtype=torch.bfloat16, device="cuda")
        dist.all_to_all_single(back, out, sc, rc)
        y = torch.zeros(T, H, dtype=torch.float32, device="cuda")
        y.index_add_(0, tok, back.float())
        return y.to(torch.bfloat16)


def copy_bandwidth():
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda").fill_(3)
    dst = torch.empty_like(src)
    for _ in range(2):
        dst.copy_(src)
    torch.cuda.synchronize()
    a = torch.cuda.Event(enable_timing=True)
    b = torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(10):
        dst.copy_(src)
    b.record()
    b.synchronize()
    return 2 * n * 10 / (a.elapsed_time(b) * 1e-3) / 1e9


def main():
    ap = OneLineArgumentParser()
    ap.add_argument("--tokens", default="1,64,512,2048,8192")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default="kernel_ep2_bench.json")
    ap.add_argument("--trace-tokens", type=int, default=512)
    ap.add_argument("--no-peer", action="store_true")
    args = ap.parse_args()
    tokens = [int(t) for t in args.tokens.split(",")]
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rank, R = dist.get_rank(), dist.get_world_size()
    res = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, ranks=R, shape=dict(E=E, K=K, H=H, I=I),
               date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), rows=[],
               build=library_path("sm_90a").parent.name)  # the source hash the library is cached under
    if rank == 0 and torch.cuda.device_count() >= 2:
        try:
            res["p2p"] = p2p_bandwidth(0, 1, nbytes=1 << 30, reps=10)
        except Exception as e:  # noqa: BLE001
            res["p2p"] = {"error": f"{type(e).__name__}: {e}"}
        print("p2p", res["p2p"], flush=True)
    res["copy_gbs"] = copy_bandwidth()
    dist.barrier()
    w = make_weights(E // R, H, I, "cuda", seed=11 + rank)   # this rank's experts
    kern = MegaMoEKernelEP(E, K, H, I, max(tokens), prepare_weights(*w))
    res["transport"] = kern.transport
    res["symm_mem_error"] = kern.sym.error
    peer = None if args.no_peer else UnfusedEP(rank, R)
    wb_fp4 = 2 * I * H // 2 + H * I // 2 + (2 * I * H + H * I) // 32
    wb_fp8 = 2 * I * H + H * I
    out = Path(args.out)
    for T in tokens:
        x, xs, idx, tw = make_inputs(T, E, K, H, "cuda", seed=100 + 7 * T + rank)
        # routed items per rank, cross-rank items, touched local experts
        all_idx = [None] * R
        dist.all_gather_object(all_idx, idx.cpu().numpy())
        el = E // R
        recv = [sum(int(((a >= r * el) & (a < (r + 1) * el)).sum()) for a in all_idx) for r in range(R)]
        cross = sum(int(((a >= 0) & (a // el != s)).sum()) for s, a in enumerate(all_idx))
        touched = [len(set(np.concatenate([a[(a >= r * el) & (a < (r + 1) * el)] for a in all_idx]).tolist()))
                   for r in range(R)]
        routed = sum(recv)
        flops = 2 * routed * H * I * 3
        nvl_bytes = cross * (H + H // 32 + 4 + 2 * H)

        def failed(impl, e, kernel=None, limit=None):
            """The row of an implementation that raised (this rank's message); the kernel is
            reset so that the next size starts from clean barrier state."""
            if kernel is not None:
                try:
                    kernel.reset()
                except Exception:  # noqa: BLE001
                    pass
            return dict(impl=impl, tokens_per_rank=T, error=f"rank {rank}: {type(e).__name__}: {str(e)[:limit]}")

        def emit(r):
            res["rows"].append(r)
            if rank == 0:
                print(json.dumps({k: v for k, v in r.items() if k != "design"}), flush=True)

        def row(impl, us, wb):
            hbm = max(touched[r] * wb + recv[r] * (H + 2 * I + 2 * H) for r in range(R))
            return dict(impl=impl, tokens_per_rank=T, routed=routed, recv_per_rank=recv, cross_rank_items=cross,
                        us=us, tflops=flops / (us * 1e-6) / 1e12, hbm_gbs_per_rank=hbm / (us * 1e-6) / 1e9,
                        nvlink_gbs=nvl_bytes / (us * 1e-6) / 1e9)
        try:
            y = kern(x, xs, idx, tw)
            kern.check()
            nan = int(torch.isnan(y.float()).sum())
            med, best = time_fn(lambda: kern(x, xs, idx, tw), args.reps)
            kern.check()
            meds = [None] * R
            dist.all_gather_object(meds, (med, best))
            r = row("megamoe_sm90_ep", max(m for m, _ in meds), wb_fp4)
            # Where the call's time goes: host work per call, the same call with the inputs
            # already in the symmetric buffer (no copies), and calls issued back to back.
            xb, xsb, twb = kern.input_buffers(T)
            xb.copy_(x.view(torch.float8_e4m3fn)); xsb.copy_(xs.view(torch.uint8)); twb.copy_(tw)
            staged = lambda: kern(xb, xsb, idx, twb)  # noqa: E731
            diag = dict(host_us=host_us(lambda: kern(x, xs, idx, tw), args.reps),
                        staged_us=time_fn(staged, args.reps)[0],
                        back_to_back_us=back_to_back_us(lambda: kern(x, xs, idx, tw), args.reps),
                        staged_back_to_back_us=back_to_back_us(staged, args.reps))
            kern.check()
            diags = [None] * R
            dist.all_gather_object(diags, diag)
            r.update(us_per_rank=[m for m, _ in meds], nan=nan, design=kern.last_design.as_dict(),
                     **{k: max(d[k] for d in diags) for k in diag}, diag_per_rank=diags)
        except Exception as e:  # noqa: BLE001
            r = failed("megamoe_sm90_ep", e, kern)
        emit(r)
        # the same call captured as a CUDA graph (MegaMoEKernelEP.capture): no host work per call
        if "error" not in r:
            try:
                g = kern.capture(T)
                g.fill(x, xs, idx, tw)
                same = bool(torch.equal(g.replay().view(torch.int16), kern(x, xs, idx, tw).view(torch.int16)))
                kern.check()
                med, best = time_fn(g.replay, args.reps)
                b2b = back_to_back_us(g.replay, args.reps)
                kern.check()
                meds = [None] * R
                dist.all_gather_object(meds, (med, b2b, same))
                rg = row("megamoe_sm90_ep_cuda_graph", max(m for m, _, _ in meds), wb_fp4)
                rg.update(us_per_rank=[m for m, _, _ in meds], back_to_back_us=max(b for _, b, _ in meds),
                          bitwise_vs_eager=all(sm for _, _, sm in meds))
                del g
            except Exception as e:  # noqa: BLE001
                rg = failed("megamoe_sm90_ep_cuda_graph", e, kern)
            emit(rg)
        if peer is not None:
            try:
                xf8 = x.view(torch.float8_e4m3fn)
                med, best = time_fn(lambda: peer(xf8, idx, tw), args.reps)
                meds = [None] * R
                dist.all_gather_object(meds, (med, best))
                rp = row("unfused_nccl_a2a_torch_grouped_mm_fp8", max(m for m, _ in meds), wb_fp8)
                b2b = [None] * R
                dist.all_gather_object(b2b, back_to_back_us(lambda: peer(xf8, idx, tw), args.reps))
                rp.update(us_per_rank=[m for m, _ in meds], back_to_back_us=max(b2b))
            except Exception as e:  # noqa: BLE001
                rp = failed("unfused_nccl_a2a_torch_grouped_mm_fp8", e, limit=300)
            emit(rp)
        if rank == 0:
            out.write_text(json.dumps(res, indent=1))
    # one traced call: pull intervals vs L1 intervals (NVLink traffic overlapped with L1 MMA?)
    try:
        Tt = args.trace_tokens
        x, xs, idx, tw = make_inputs(Tt, E, K, H, "cuda", seed=999 + rank)
        _, recs = kern(x, xs, idx, tw, trace=True)
        pulls = [(r["t_start_ns"], r["t_end_ns"]) for r in recs if r["kind"] == "pull"]
        l1 = [(r["t_start_ns"], r["t_end_ns"]) for r in recs if r["kind"] == "l1_mma"]
        t0 = min(r["t_start_ns"] for r in recs)
        pull_end = max(b for _, b in pulls) if pulls else t0
        first_l1 = min(a for a, _ in l1) if l1 else None
        l1_before_pull_end = sum(1 for a, b in l1 if a < pull_end)
        summ = dict(tokens_per_rank=Tt, records=len(recs), dropped=kern.last_trace_dropped,
                    pull_start_us=(min(a for a, _ in pulls) - t0) / 1e3 if pulls else None,
                    pull_end_us=(pull_end - t0) / 1e3, first_l1_start_us=(first_l1 - t0) / 1e3 if l1 else None,
                    l1_blocks=len(l1), l1_blocks_started_before_last_pull_ended=l1_before_pull_end,
                    end_us=(max(r["t_end_ns"] for r in recs) - t0) / 1e3)
        for kind in ("count", "index_exchange", "nvl_barrier"):
            iv = [(r["t_start_ns"], r["t_end_ns"]) for r in recs if r["kind"] == kind]
            if iv:
                summ[f"{kind}_max_us"] = max(b - a for a, b in iv) / 1e3
        allsum = [None] * R
        dist.all_gather_object(allsum, summ)
        res["trace"] = allsum
        allrecs = [None] * R
        dist.all_gather_object(allrecs, recs)
        if rank == 0:
            import megamoe.kernel.trace as tr
            merged = [r for rr in allrecs for r in rr]
            keep = [r for r in merged if r.get("cta", r["sm"]) < 8 or r["kind"] in ("pull", "nvl_barrier", "index_exchange", "count")]
            out.with_name(f"kernel_ep2_trace_t{Tt}_sm0-7.json").write_text(json.dumps(tr.to_chrome(keep)))
            print("trace", json.dumps(allsum), flush=True)
    except Exception as e:  # noqa: BLE001
        res["trace_error"] = f"rank {rank}: {type(e).__name__}: {e}"
        print(res["trace_error"], flush=True)
    if rank == 0:
        out.write_text(json.dumps(res, indent=1))
        print_table(res)
    dist.barrier()
    dist.destroy_process_group()


def print_table(res):
    print("| tokens/rank | impl | us | TFLOP/s | HBM GB/s/rank | NVLink GB/s | back-to-back us | staged us | host us |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in res["rows"]:
        if "error" in r:
            print(f"| {r['tokens_per_rank']} | {r['impl']} | error: {r['error'][:80]} | | | | | | |")
        else:
            extra = " | ".join(f"{r[k]:.1f}" if k in r else "" for k in ("back_to_back_us", "staged_us", "host_us"))
            print(f"| {r['tokens_per_rank']} | {r['impl']} | {r['us']:.1f} | {r['tflops']:.1f} | "
                  f"{r['hbm_gbs_per_rank']:.0f} | {r['nvlink_gbs']:.1f} | {extra} |")


if __name__ == "__main__":
    main()
