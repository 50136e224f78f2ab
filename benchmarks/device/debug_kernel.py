"""Debug: launch one small case on a side stream and watch the progress words while it runs."""
import sys, time
import torch
sys.path.insert(0, ".")
from megamoe.kernel import MegaMoEKernel, prepare_weights, KernelError
from megamoe.kernel.check import make_weights, make_inputs, reference_sm90, compare

def snap(k, label):
    s2 = torch.cuda.Stream()
    with torch.cuda.stream(s2):
        pr = k.progress.to("cpu", non_blocking=True)
        er = k._ws["error"].to("cpu", non_blocking=True)
        ar = k._ws["arrival"].to("cpu", non_blocking=True)
        mk = k._ws["mask"].to("cpu", non_blocking=True)
        ec = k._ws["expert_count"].to("cpu", non_blocking=True)
    s2.synchronize()
    print(f"--- {label}: error {er.tolist()}")
    print("arrival nz", [(i, a) for i, a in enumerate(ar.tolist()) if a][:12], "mask nz", [(i, hex(m & 0xffffffffffffffff)) for i, m in enumerate(mk.tolist()) if m][:12])
    print("expert_count hi", sorted(set(int(v) >> 32 for v in ec.tolist())), "lo nz", [(i, int(v) & 0xffffffff) for i, v in enumerate(ec.tolist()) if int(v) & 0xffffffff][:12])
    rows = pr.view(-1, 32).tolist()
    def dec(v):
        return f"{v >> 28}/{(v >> 16) & 0xfff}/{(v >> 8) & 0xff}/{v & 0xff}"
    for c, r in enumerate(rows):
        if c < 8 or c >= 131:
            print(f"cta {c:3d} warps " + " ".join(f"{v & 0xffffffff:08x}" for v in r[24:32]))
            print(f"cta {c:3d} disp {r[0]:#x} prodblk {dec(r[1])} prod_it {r[2]} prod_done {r[3]:#x} consblk {dec(r[4])} cons_it {r[5]} epi {r[6]:#x} tail {r[7]}")

def run(E, K, H, I, T, **kw):
    w = make_weights(E, H, I, "cuda", seed=7)
    k = MegaMoEKernel(E, K, H, I, max(T, 1), prepare_weights(*w), timeout_s=2.0, **kw)
    k.progress = torch.zeros(k.design(T).num_ctas * 32, dtype=torch.int32, device="cuda")  # 32 words per CTA
    x, xs, idx, tw = make_inputs(T, E, K, H, "cuda", seed=1)
    print(f"== E={E} K={K} H={H} I={I} T={T} design={k.design(T)} idx={idx[:2].tolist()}", flush=True)
    torch.cuda.synchronize()
    sA = torch.cuda.Stream()
    with torch.cuda.stream(sA):
        y = k(x, xs, idx, tw)
    time.sleep(0.3)
    snap(k, "t=0.3s")
    time.sleep(4.0)
    snap(k, "t=4.3s")
    sys.stdout.flush()
    try:
        sA.synchronize()
        k.check()
        print("OK", compare(y, reference_sm90(x, xs, idx, tw, *w, block_m=k.last_design.block_m)))
        return True
    except KernelError as e:
        print("ERR", e)
        return False

torch.cuda.init()
ok = run(8, 2, 256, 128, 1)
ok = run(256, 6, 4096, 2048, 1) and ok
print("ALL OK" if ok else "FAILURES")
