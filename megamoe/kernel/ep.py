"""Expert parallelism for the SM90 mega-kernel: one process per GPU, NVLink dispatch and
combine inside the kernel (``csrc/megamoe/kernel_sm90.cu``, ``dispatch_role_ep``).

Use inside an existing process group (NCCL, e.g. started with ``torchrun``)::

    import torch.distributed as dist
    from megamoe.kernel.ep import MegaMoEKernelEP, local_weights
    dist.init_process_group("nccl"); torch.cuda.set_device(local_rank)
    k = MegaMoEKernelEP(num_experts=256, topk=6, hidden=4096, inter=2048, max_tokens=8192,
                        weights=local_weights(w1, w1_sf, w2, w2_sf, rank, world))
    y = k(x_fp8, x_sf, topk_idx, topk_weights)     # this rank's tokens, BF16 [T_r, H]

Rank ``r`` owns experts ``[r*E/R, (r+1)*E/R)``. Every rank allocates ONE symmetric buffer with
the same layout (:func:`symmetric_layout`): NVLink barrier flags, receive counts, this rank's
x / scales / top-k weights, the source-index table and the combine buffer. Peers' copies of a
field are at ``peer_base[j] + offset`` (torch ``_symmetric_memory`` rendezvous, CUDA backend;
CUDA IPC handles as a fallback). No NVLink multicast API is used. Pools and counters that
only this rank touches are ordinary allocations.

Per call (all ranks call in lockstep; the call number lives in device memory, so a CUDA
graph of the call replays correctly, see :meth:`MegaMoEKernelEP.capture`): count per expert, write
each item's ``token*K+slot`` into the owner's source-index table (ascending order, the
``src_items`` of :func:`megamoe.plan.route_to_ranks`) and the send counts into the owner's
``recv_count``, NVLink barrier 1 (every CTA of every rank; timeout names rank and barrier),
owners pull the rows from the source ranks in the plan's round-robin min-remaining order
(:func:`megamoe.plan.pull_order`; the pool then matches ``RankPlan.pool_sources`` row for
row), L1 / L2 as EP1, the L2 epilogue writes BF16 rows into the source rank's combine buffer
over NVLink, NVLink barrier 2, each rank reduces its own tokens.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .. import design_sm90
from ..errors import require
from .trace import fetch_records, record_buffers, trace_capacity

if TYPE_CHECKING:
    from .runtime import CallGraph

# Keep NVLink multicast off whatever starts us (the shared GPUs' rule; harmless elsewhere).
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

ALIGN = 256


@dataclass(frozen=True)
class SymLayout:
    """Byte offsets of the symmetric-buffer fields (identical on every rank)."""
    offsets: dict
    sizes: dict
    total: int

    def __getitem__(self, name: str) -> int:
        return self.offsets[name]


def symmetric_layout(num_experts: int, topk: int, hidden: int, max_tokens: int, num_ranks: int) -> SymLayout:
    """Layout of one rank's symmetric buffer; every field 256-byte aligned.

    ``flag`` u64 [R]; ``recv_count`` i32 [E/R, R]; ``x`` u8 [T, H]; ``x_sf`` u8 [T, H/32];
    ``topk_w`` f32 [T, K]; ``src_idx`` i32 [E/R, R, T]; ``combine`` bf16 [K, T, H]
    with ``T = max(max_tokens, 1)``.
    """
    require(num_ranks >= 1 and num_experts % num_ranks == 0, "num_ranks", f"a divisor of {num_experts}", num_ranks)
    T = max(int(max_tokens), 1)
    el = num_experts // num_ranks
    sizes = dict(flag=8 * num_ranks, recv_count=4 * el * num_ranks, x=T * hidden, x_sf=T * hidden // 32,
                 topk_w=4 * T * topk, src_idx=4 * el * num_ranks * T, combine=2 * topk * T * hidden)
    offsets, off = {}, 0
    for name, n in sizes.items():
        offsets[name] = off
        off += -(-n // ALIGN) * ALIGN
    return SymLayout(offsets, sizes, off)


def pull_position(counts, pos: int) -> tuple[int, int]:
    """(source rank, index in that rank's list) of pool position ``pos`` of one expert whose
    source ranks send ``counts`` items: the kernel's in-place evaluation of the round-robin
    min-remaining rule (mirror of the C++ in ``dispatch_role_ep``; equals row ``pos`` of
    :func:`megamoe.plan.pull_order`)."""
    R = len(counts)
    off, rem = 0, int(pos)
    for _ in range(R):
        active = [r for r in range(R) if counts[r] - off > 0]
        if not active:
            break
        L = min(counts[r] - off for r in active)
        if rem < L * len(active):
            return active[rem % len(active)], off + rem // len(active)
        rem -= L * len(active)
        off += L
    raise ValueError(f"position {pos} beyond {sum(counts)} items")


def local_weights(w1, w1_sf, w2, w2_sf, rank: int, num_ranks: int):
    """This rank's experts of global MXFP4 weights (``[E, ...]`` tensors) as kernel
    :class:`~megamoe.kernel.runtime.Weights`."""
    from .runtime import prepare_weights
    E = w1.shape[0]
    require(E % num_ranks == 0, "num_ranks", f"a divisor of num_experts = {E}", num_ranks)
    el = E // num_ranks
    sl = slice(rank * el, (rank + 1) * el)
    return prepare_weights(w1[sl], w1_sf[sl], w2[sl], w2_sf[sl])


def design_ep(num_tokens: int, max_tokens: int, hidden: int, inter: int, num_experts: int, topk: int,
              num_ranks: int, num_sms: int, block_m: int | None = None, experts_per_wave: int | None = None,
              num_stages: int | None = None) -> design_sm90.SM90Design:
    """Launch numbers of one rank, the same rule as ``megamoe.plan.build_plan(design="megamoe-sm90")``:
    :func:`megamoe.design_sm90.design_for` with ``ranks = num_ranks`` and the pool sized for
    ``max_tokens`` from every rank."""
    return design_sm90.design_for(num_tokens, hidden, inter, num_experts, topk, num_sms, ranks=num_ranks,
                                  block_m=block_m, experts_per_wave=experts_per_wave, num_stages=num_stages,
                                  pool_tokens=max(max_tokens, 1))


class _SymmetricBuffer:
    """One uint8 buffer per rank, same size everywhere, and every rank's base address.
    torch ``_symmetric_memory`` (CUDA backend) first; CUDA IPC handles otherwise."""

    def __init__(self, nbytes: int, device, group, lib, transport: str = "auto"):
        import torch
        import torch.distributed as dist
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        self.transport = None
        self.error = None
        if transport in ("auto", "symm_mem"):
            try:
                import torch.distributed._symmetric_memory as symm_mem
                try:
                    symm_mem.set_backend("CUDA")
                except Exception:  # noqa: BLE001  (already chosen, or older torch)
                    pass
                buf = symm_mem.empty(nbytes, dtype=torch.uint8, device=device)
                grp = group if group is not None else dist.group.WORLD
                h = symm_mem.rendezvous(buf, grp)
                ptrs = [int(v) for v in h.buffer_ptrs]
                shift = buf.data_ptr() - ptrs[self.rank]
                require(shift >= 0, "symmetric memory", "tensor inside its allocation", shift)
                self.buf, self.handle = buf, h
                self.bases = [b + shift for b in ptrs]
                self.transport = "torch_symm_mem"
            except Exception as e:  # noqa: BLE001
                self.error = f"{type(e).__name__}: {e}"
                if transport == "symm_mem":
                    raise
        if self.transport is None:
            ptr = ctypes.c_void_p()
            dev = torch.device(device).index
            rc = lib.megamoe_ipc_malloc(ctypes.byref(ptr), nbytes, dev)
            require(rc == 0, "cudaMalloc", "success", rc)
            hnd = ctypes.create_string_buffer(64)
            rc = lib.megamoe_ipc_handle(ptr, hnd)
            require(rc == 0, "cudaIpcGetMemHandle", "success", rc)
            handles = [None] * self.world
            dist.all_gather_object(handles, bytes(hnd.raw), group=group)
            self.bases = []
            for j, hb in enumerate(handles):
                if j == self.rank:
                    self.bases.append(int(ptr.value))
                    continue
                pj = ctypes.c_void_p()
                rc = lib.megamoe_ipc_open(ctypes.create_string_buffer(hb, 64), ctypes.byref(pj), dev)
                require(rc == 0, "cudaIpcOpenMemHandle", "success", rc)
                self.bases.append(int(pj.value))
            # a torch view of the local buffer
            self.buf = _tensor_from_ptr(int(ptr.value), nbytes, device)
            self.transport = "cuda_ipc"

    def view(self, off: int, nbytes: int, dtype, shape):
        import torch
        t = self.buf[off:off + nbytes]
        return t.view(dtype).view(*shape) if dtype != torch.uint8 else t.view(*shape)



def _tensor_from_ptr(ptr: int, nbytes: int, device):
    """A uint8 CUDA tensor over memory we allocated ourselves (never freed: lives as long as
    the process)."""
    import torch

    class _Holder:
        def __init__(self):
            self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False),
                                             "version": 3, "strides": None}
    with torch.cuda.device(device):
        return torch.as_tensor(_Holder(), device=device)


class _LocalBuffer:
    """One rank's 'symmetric' buffer when every rank lives in this process on one GPU."""

    def __init__(self, nbytes: int, device, local):
        import torch
        group, rank = local
        self.buf = torch.zeros(nbytes, dtype=torch.uint8, device=device)
        group.bases[rank] = self.buf.data_ptr()
        self.bases = group.bases  # filled in by LocalGroup once every rank exists
        self.transport = "local_one_gpu"
        self.error = None

    view = _SymmetricBuffer.view


class LocalGroup:
    """R expert-parallel ranks inside ONE process on ONE GPU, each rank's kernel on its own
    stream with ``num_sms`` CTAs (the ranks together must fit the GPU's SMs, one CTA per SM,
    so that all of them are co-resident). Same kernel code and buffer layout as the NVLink
    path, with every 'peer' buffer in this GPU's memory: it tests the EP logic (dispatch,
    source-index table, pull order, barriers and timeouts, combine write-back) without a
    second GPU; it measures nothing about NVLink.

        g = LocalGroup(2, E, K, H, I, max_tokens, [local_weights(*w, r, 2) for r in range(2)], num_sms=66)
        ys = g([(x0, xs0, idx0, w0), (x1, xs1, idx1, w1)])
    """

    def __init__(self, R: int, num_experts: int, topk: int, hidden: int, inter: int, max_tokens: int,
                 weights_per_rank, num_sms: int, **kw):
        import torch
        self.R = R
        self.bases = [0] * R
        self.kernels = [MegaMoEKernelEP(num_experts, topk, hidden, inter, max_tokens, weights_per_rank[r],
                                        num_sms=num_sms, _local=(self, r), **kw) for r in range(R)]
        for k in self.kernels:
            k.peer_base.copy_(torch.tensor(self.bases, dtype=torch.int64))
        self.streams = [torch.cuda.Stream() for _ in range(R)]
        self.reset()

    def reset(self):
        import torch
        torch.cuda.synchronize()
        for k in self.kernels:
            k._zero()

    def __call__(self, inputs, ranks=None, designs=None, trace: bool = False):
        """Launch every rank (or only ``ranks``) concurrently; returns the outputs (None for a
        rank not launched) after synchronizing. Errors: call :meth:`check`."""
        import torch
        ranks = list(range(self.R) if ranks is None else ranks)
        cur = torch.cuda.current_stream()
        outs = [None] * self.R
        # Allocate everything first: an allocation between two ranks' launches may synchronize
        # the device (cudaMalloc / cudaFree), which would serialize ranks that wait for each other.
        des, ys = {}, {}
        for r in ranks:
            k = self.kernels[r]
            des[r] = designs[r] if designs else k.design(inputs[r][0].shape[0])
            k._workspace(des[r])
            ys[r] = torch.empty(inputs[r][0].shape[0], k.H, dtype=torch.bfloat16, device=k.device)
            if trace:
                record_buffers(k, k.num_sms, k._trace_cap(des[r]))  # allocate before the launches
        torch.cuda.synchronize()
        for r in ranks:
            self.streams[r].wait_stream(cur)
        for r in ranks:
            with torch.cuda.stream(self.streams[r]):
                outs[r] = self.kernels[r](*inputs[r], design=des[r], trace=trace, out=ys[r])
        for r in ranks:
            cur.wait_stream(self.streams[r])
        torch.cuda.synchronize()
        if trace:  # local mode defers decoding (a sync between launches would serialize the ranks)
            return outs, [self.kernels[r].fetch_trace() if r in ranks else None for r in range(self.R)]
        return outs

    def check(self):
        for k in self.kernels:
            k.check()


class MegaMoEKernelEP:
    """The mega-kernel on one rank of an expert-parallel group (see module docstring).

    Args:
        num_experts, topk, hidden, inter: the global MoE shape.
        max_tokens: most tokens any rank passes in one call (sizes every buffer).
        weights: this rank's experts (:func:`local_weights`).
        group: process group (default: the world); one process per GPU, NCCL.
        clamp, num_sms, timeout_s: as :class:`~megamoe.kernel.runtime.MegaMoEKernel`.
        transport: ``auto`` (torch symmetric memory, then CUDA IPC), ``symm_mem`` or ``ipc``.
    """

    def __init__(self, num_experts: int, topk: int, hidden: int, inter: int, max_tokens: int, weights,
                 group=None, clamp: float | None = None, num_sms: int | None = None, timeout_s: float = 10.0,
                 device=None, transport: str = "auto", block_m: int | None = None,
                 experts_per_wave: int | None = None, num_stages: int | None = None, _local=None):
        import torch
        import torch.distributed as dist
        from .runtime import check_kernel_shape, clamp_value, load_library, sm90_weights
        self.torch = torch
        self.clamp = clamp_value(clamp)
        self.group = group
        self._local = _local  # (LocalGroup, rank): R ranks in this process (see local_group)
        if _local is None:
            require(dist.is_available() and dist.is_initialized(), "process group",
                    "torch.distributed initialised (NCCL, one process per GPU)", "none")
            self.rank = dist.get_rank(group)
            self.R = dist.get_world_size(group)
        else:
            self.rank, self.R = _local[1], _local[0].R
        self.device = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
        props = torch.cuda.get_device_properties(self.device)
        require(props.major == 9, "device", "compute capability 9.x (sm_90a: the EP kernel is the SM90 one)",
                f"{props.major}.{props.minor}")
        check_kernel_shape(num_experts, topk, hidden, inter, self.R)
        self.E, self.K, self.H, self.I = num_experts, topk, hidden, inter
        self.EL = num_experts // self.R
        require(tuple(weights.w1.shape[:1]) == (self.EL,), "weights", f"{self.EL} local experts", tuple(weights.w1.shape))
        self.max_tokens = max(int(max_tokens), 1)
        self.weights = sm90_weights(weights)
        self.num_sms = num_sms or props.multi_processor_count
        if _local is None:
            sms = [None] * self.R
            dist.all_gather_object(sms, self.num_sms, group=group)
            require(len(set(sms)) == 1, "num_sms", "the same on every rank (NVLink barrier arithmetic)", sms)
        self.fixed = dict(block_m=block_m, experts_per_wave=experts_per_wave, num_stages=num_stages)
        self.timeout_ns = int(timeout_s * 1e9)
        self.fault_inject = 0
        self.lib = load_library()
        if hasattr(self.lib, "megamoe_sm90_preload"):  # no lazy module load (a device sync) at a first launch
            rc = self.lib.megamoe_sm90_preload()
            require(rc == 0, "kernel preload", "cudaSuccess", rc)
        self.layout = symmetric_layout(num_experts, topk, hidden, self.max_tokens, self.R)
        self.sym = _SymmetricBuffer(self.layout.total, self.device, group, self.lib, transport) if _local is None \
            else _LocalBuffer(self.layout.total, self.device, _local)
        self.transport = self.sym.transport
        L, T = self.layout, self.max_tokens
        u8, i32 = torch.uint8, torch.int32
        self.flag = self.sym.view(L["flag"], 8 * self.R, torch.int64, (self.R,))
        self.recv_count = self.sym.view(L["recv_count"], 4 * self.EL * self.R, i32, (self.EL, self.R))
        self.x_buf = self.sym.view(L["x"], T * hidden, u8, (T, hidden))
        self.x_sf_buf = self.sym.view(L["x_sf"], T * hidden // 32, u8, (T, hidden // 32))
        self.topk_w_buf = self.sym.view(L["topk_w"], 4 * T * topk, torch.float32, (T, topk))
        self.src_idx = self.sym.view(L["src_idx"], 4 * self.EL * self.R * T, i32, (self.EL, self.R, T))
        self.combine_buf = self.sym.view(L["combine"], 2 * topk * T * hidden, torch.bfloat16, (topk, T, hidden))
        self.peer_base = torch.tensor(self.sym.bases, dtype=torch.int64, device=self.device)
        d = self.device
        self.send_count = torch.zeros(num_experts, dtype=torch.int64, device=d)
        self.cta_hist = torch.zeros(self.num_sms * num_experts, dtype=i32, device=d)
        self.expert_count = torch.zeros(self.EL, dtype=torch.int64, device=d)
        self.grid_sync = torch.zeros(1, dtype=i32, device=d)
        self.error = torch.zeros(8, dtype=i32, device=d)
        self.item_pos = torch.empty(T * topk, dtype=i32, device=d)
        self.epoch_counter = torch.zeros(1, dtype=torch.int64, device=d)  # calls completed (the kernel adds one)
        self._ws, self._ws_key = {}, None
        self.last_design = None
        if _local is None:
            self.reset()

    # -- state
    def reset(self):
        """Collective: zero the barrier flags and counters on every rank and restart the call
        numbering (after a kernel error, e.g. a rank that never arrived)."""
        import torch.distributed as dist
        torch = self.torch
        torch.cuda.synchronize(self.device)
        if self._local is not None:  # one process: the caller resets every rank (LocalGroup.reset)
            self._zero()
            return
        dist.barrier(group=self.group, device_ids=[self.device.index])  # every rank's kernels ended
        torch.cuda.synchronize(self.device)
        self._zero()
        dist.barrier(group=self.group, device_ids=[self.device.index])

    def _zero(self):
        torch = self.torch
        for t in (self.flag, self.recv_count, self.send_count, self.expert_count, self.grid_sync, self.error,
                  self.epoch_counter):
            t.zero_()
        for k in ("arrival", "mask"):
            if k in self._ws:
                self._ws[k].zero_()
        torch.cuda.synchronize(self.device)

    def _workspace(self, design):
        torch = self.torch
        key = (design.block_m, design.pool_rows)
        if self._ws_key == key:
            return self._ws
        from .runtime import pool_buffers
        self._ws = {}
        self._ws = dict(**pool_buffers(torch, design, self.H, self.I, self.device),
                        pool_rank=torch.full((design.pool_rows,), -1, dtype=torch.int32, device=self.device))
        self._ws_key = key
        return self._ws

    def design(self, num_tokens: int):
        return design_ep(num_tokens, self.max_tokens, self.H, self.I, self.E, self.K, self.R, self.num_sms,
                         **self.fixed)

    def input_buffers(self, num_tokens: int):
        """Views of this rank's inputs inside the symmetric buffer, for a caller that writes its
        activations there directly (the peers read them over NVLink): ``(x float8_e4m3fn
        [T, H], x_sf uint8 [T, H/32] UE8M0, topk_weights float32 [T, topk])``. Passing these
        same views to the call skips its three input copies.

        Raises:
            InputError: ``num_tokens`` outside ``[0, max_tokens]``.
        """
        require(0 <= num_tokens <= self.max_tokens, "num_tokens", f"0..max_tokens={self.max_tokens}", num_tokens)
        T = num_tokens
        return (self.x_buf[:T].view(self.torch.float8_e4m3fn), self.x_sf_buf[:T], self.topk_w_buf[:T])

    def _stage(self, x, x_sf, topk_idx, topk_w) -> int:
        """Check one call's inputs (one-line ``InputError`` naming the field) and copy x, its
        scales and the top-k weights into this rank's symmetric buffer, unless they are already
        there (:meth:`input_buffers`). Returns the token count."""
        from .runtime import check_call_shapes
        torch = self.torch
        T = check_call_shapes(x, x_sf, topk_idx, topk_w, self.H, self.K, self.max_tokens)
        if T:
            for dst, src in ((self.x_buf, x.reshape(T, self.H).view(torch.uint8)), (self.x_sf_buf, x_sf.view(torch.uint8)),
                             (self.topk_w_buf, topk_w.to(torch.float32))):
                if src.data_ptr() != dst.data_ptr() or not src.is_contiguous():
                    dst[:T].copy_(src)
        return T

    def capture(self, num_tokens: int, design=None) -> CallGraph:
        """Collective: a CUDA graph of one call with ``num_tokens`` tokens on this rank.

        The graph reads its inputs from fixed tensors (``CallGraph.x``, ``x_sf``,
        ``topk_weights`` are views of the symmetric buffer, ``topk_idx`` a fixed int32
        tensor) and writes ``CallGraph.y``; the caller fills the inputs, then every rank calls
        ``replay()`` (the same number of times, like calls). One eager call with every slot
        masked runs first on every rank (workspace and launch set-up are not capturable).

        Raises:
            InputError: ``num_tokens`` outside ``[0, max_tokens]``.
        """
        torch = self.torch
        x, x_sf, topk_w = self.input_buffers(num_tokens)
        idx = torch.full((num_tokens, self.K), -1, dtype=torch.int32, device=self.device)
        y = torch.empty(num_tokens, self.H, dtype=torch.bfloat16, device=self.device)
        design = design or self.design(num_tokens)
        self(x, x_sf, idx, topk_w, design=design, out=y)
        self.check()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.device(self.device), torch.cuda.graph(graph, capture_error_mode="thread_local"):
            self(x, x_sf, idx, topk_w, design=design, out=y)
        from .runtime import CallGraph
        return CallGraph(graph, x, x_sf, idx, topk_w, y, self)

    def _fill(self, g, x, x_sf, topk_idx, topk_w) -> None:
        """Stage one call's inputs for ``g`` (a :class:`~megamoe.kernel.runtime.CallGraph` of this
        rank): x, scales and weights into the symmetric buffer, the expert ids into ``g.topk_idx``."""
        self._stage(x, x_sf, topk_idx, topk_w)
        g.topk_idx.copy_(topk_idx.to(g.topk_idx.dtype))

    def __call__(self, x, x_sf, topk_idx, topk_w, design=None, trace: bool = False, out=None):
        """This rank's MoE output BF16 ``[T_r, H]``; every rank must call (same count of calls).
        Inputs already in the symmetric buffer (:meth:`input_buffers`) are not copied."""
        from .runtime import POOL_FIELDS, KernelError, Params, output_tensor
        torch = self.torch
        T = self._stage(x, x_sf, topk_idx, topk_w)
        topk_idx = topk_idx.to(torch.int32).contiguous()
        design = design or self.design(T)
        self.last_design = design
        ws = self._workspace(design)
        y = output_tensor(torch, out, T, self.H, self.device)
        cap = 0
        if trace:
            cap = self._trace_cap(design)
            tr, trc = record_buffers(self, self.num_sms, cap)
        w, L = self.weights, self.layout
        p = Params(num_tokens=T, hidden=self.H, inter=self.I, num_experts=self.E, topk=self.K,
                   block_m=design.block_m, num_stages=design.num_stages, experts_per_wave=design.experts_per_wave,
                   num_sms=design.num_ctas, ctas_per_sm=design.ctas_per_sm, pool_rows=design.pool_rows,
                   timeout_ns=self.timeout_ns, trace_cap=cap,
                   fault_inject=self.fault_inject, clamp=self.clamp,
                   x=self.x_buf.data_ptr(), x_sf=self.x_sf_buf.data_ptr(), topk_idx=topk_idx.data_ptr(),
                   topk_w=self.topk_w_buf.data_ptr(), **w.params(),
                   **{k: ws[k].data_ptr() for k in POOL_FIELDS + ("pool_rank",)},
                   expert_count=self.expert_count.data_ptr(), grid_sync=self.grid_sync.data_ptr(),
                   error=self.error.data_ptr(), item_pos=self.item_pos.data_ptr(),
                   combine_buf=self.combine_buf.data_ptr(), y=y.data_ptr(),
                   trace=tr.data_ptr() if trace else 0, trace_count=trc.data_ptr() if trace else 0, progress=0,
                   combine_rows=self.max_tokens, device=self.device.index, num_ranks=self.R, rank=self.rank,
                   epoch_counter=self.epoch_counter.data_ptr(),  # the call number lives in device memory
                   off_x=L["x"], off_x_sf=L["x_sf"], off_topk_w=L["topk_w"],
                   off_src_idx=L["src_idx"], off_recv_count=L["recv_count"], off_combine=L["combine"],
                   off_flag=L["flag"], peer_base=self.peer_base.data_ptr(), send_count=self.send_count.data_ptr(),
                   cta_hist=self.cta_hist.data_ptr())
        stream = torch.cuda.current_stream(self.device).cuda_stream
        rc = self.lib.megamoe_sm90_launch(ctypes.byref(p), ctypes.c_void_p(stream))
        if rc != 0:
            raise KernelError(f"launch failed on rank {self.rank}: "
                              f"{self.lib.megamoe_sm90_error_string(rc).decode()} (code {rc})")
        if trace:
            self._pending_trace = (tr, trc, cap)
            if self._local is not None:
                return y
            return y, self.fetch_trace()
        return y

    def _trace_cap(self, design) -> int:
        """Records per CTA for ``design`` (EP adds barrier records)."""
        return trace_capacity(design, self.I, self.H, self.num_sms, fixed=16)

    def fetch_trace(self) -> list[dict]:
        """Check and decode this rank's last traced call (records carry this rank)."""
        return fetch_records(self, rank=self.rank)

    def check(self):
        """Synchronize and raise :class:`KernelError` if this rank's last launch reported an
        error; the message names the rank (and, for a barrier timeout, the barrier and the
        rank that never arrived). Call :meth:`reset` on every rank before the next call."""
        from .runtime import KernelError, format_error
        self.torch.cuda.synchronize(self.device)
        err = self.error.cpu().numpy().astype(np.uint32)
        if err[0] != 0:
            raise KernelError(f"[rank {self.rank}] " + format_error(err, self.timeout_ns))

    def pool_sources(self):
        """int64 ``[pool_rows, 3]`` (source rank, token, slot) of each pool row of the last call
        (stale rows beyond each expert's items hold older values)."""
        ws = self._ws
        return self.torch.stack([ws["pool_rank"], ws["pool_token"], ws["pool_slot"]], 1).long().cpu().numpy()

    def pool_contents(self):
        """(l1_pool, scales [rows, H/32], token, slot, source rank) of the last call."""
        ws = self._ws
        R = self._ws_key[1]
        sf = ws["l1_pool_sf"].permute(1, 0, 2).reshape(R, self.H // 32)
        return ws["l1_pool"], sf, ws["pool_token"], ws["pool_slot"], ws["pool_rank"]


def p2p_bandwidth(src_device: int = 0, dst_device: int = 1, nbytes: int = 1 << 30, reps: int = 10) -> dict:
    """Measured device-to-device copy between two GPUs of this process (torch ``copy_``, which
    uses the peer path over NVLink when peer access is possible): one direction, and both
    directions at once (one copy issued from each device), GB/s of payload, wall-clock timed
    between full synchronizations."""
    import time
    import torch
    a = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{src_device}").fill_(1)
    b = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{dst_device}").fill_(2)
    a2 = torch.empty_like(b)
    b2 = torch.empty_like(a)

    def sync():
        torch.cuda.synchronize(src_device)
        torch.cuda.synchronize(dst_device)

    def timed(fn):
        fn()
        sync()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        sync()
        return (time.perf_counter() - t0) / reps

    t1 = timed(lambda: b.copy_(a, non_blocking=True))
    s_src = torch.cuda.Stream(device=src_device)
    s_dst = torch.cuda.Stream(device=dst_device)

    def both():
        with torch.cuda.stream(s_src):
            b.copy_(a, non_blocking=True)
        with torch.cuda.stream(s_dst):
            b2.copy_(a2, non_blocking=True)
    t2 = timed(both)
    ok = bool(torch.equal(b[:1024].cpu(), a[:1024].cpu()))
    return {"p2p_one_way_gbs": nbytes / t1 / 1e9, "p2p_bidirectional_gbs": 2 * nbytes / t2 / 1e9,
            "bytes": nbytes, "reps": reps, "copy_ok": ok,
            "peer_access": bool(torch.cuda.can_device_access_peer(src_device, dst_device))}


# ------------------------------------------------------------------ `megamoe run --ranks R`
def run_ep_main(ranks: int = 2, num_experts: int = 256, topk: int = 6, hidden: int = 4096, inter: int = 2048,
                tokens: int = 64, routing: str = "uniform", clamp: float | None = None, reps: int = 10,
                trace_path: str | None = None, check: bool = True, seed: int = 0) -> int:
    """``megamoe run --ranks R``: one EP scenario on R GPUs. Outside a process group it starts
    ``torchrun --standalone --nproc-per-node R -m megamoe.kernel.ep_launch ...`` and returns its exit
    code; inside one (``RANK`` set) it runs the scenario on this rank: random MXFP4 weights
    (same seed everywhere), ``tokens`` tokens per rank, the EP kernel, timings, and with
    ``check`` the output of every rank compared bitwise with the single-GPU kernel on the
    same global inputs. ``trace_path``: Chrome trace per rank (``<path>.rank<r>.json``)."""
    import subprocess
    import sys
    if "RANK" not in os.environ:
        import torch
        if not torch.cuda.is_available() or torch.cuda.device_count() < ranks:
            print(f"megamoe: error: ranks: expected {ranks} CUDA GPUs (one per rank), got "
                  f"{torch.cuda.device_count() if torch.cuda.is_available() else 0}", file=sys.stderr)
            return 2
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
               "-m", "megamoe.kernel.ep_launch", "--experts", str(num_experts), "--topk", str(topk), "--hidden", str(hidden),
               "--inter", str(inter), "--tokens", str(tokens), "--routing", routing, "--reps", str(reps),
               "--seed", str(seed)] + (["--clamp", str(clamp)] if clamp is not None else []) + \
              (["--trace", trace_path] if trace_path else []) + ([] if check else ["--no-check"])
        return subprocess.call(cmd)
    return _ep_rank_main(num_experts, topk, hidden, inter, tokens, routing, clamp, reps, trace_path, check, seed)


def _ep_rank_main(num_experts, topk, hidden, inter, tokens, routing, clamp, reps, trace_path, check, seed) -> int:
    import json
    import statistics
    import sys
    import torch
    import torch.distributed as dist
    from .check import make_inputs, make_weights
    from .runtime import KernelError, MegaMoEKernel, prepare_weights
    from .timing import cuda_times_us
    from .trace import to_chrome
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rank, R = dist.get_rank(), dist.get_world_size()
    rc = 0
    try:
        w = make_weights(num_experts, hidden, inter, "cuda", seed=seed)
        k = MegaMoEKernelEP(num_experts, topk, hidden, inter, max(tokens, 1), local_weights(*w, rank, R), clamp=clamp)
        gx, gxs, gidx, gw = make_inputs(tokens * R, num_experts, topk, hidden, "cuda", seed=seed + 1, routing=routing)
        sl = slice(rank * tokens, (rank + 1) * tokens)
        x, xs, idx, tw = gx[sl], gxs[sl], gidx[sl], gw[sl]
        y = k(x, xs, idx, tw)
        k.check()
        ts = cuda_times_us(lambda: k(x, xs, idx, tw), reps, before_each=dist.barrier)
        k.check()
        us = statistics.median(ts)
        routed = int((gidx >= 0).sum())
        line = (f"rank {rank}/{R}: {tokens} tokens/rank, {us:.1f} us median of {reps}, "
                f"{2 * routed * hidden * inter * 3 / us / 1e6:.1f} TFLOP/s (all ranks' FLOPs), "
                f"design block_m={k.last_design.block_m} experts_per_wave={k.last_design.experts_per_wave}, "
                f"transport {k.transport}")
        if check:
            one = MegaMoEKernel(num_experts, topk, hidden, inter, tokens * R, prepare_weights(*w), clamp=clamp)
            ref = one(gx, gxs, gidx, gw)
            one.check()
            same = bool(torch.equal(y.view(torch.int16), ref[sl].view(torch.int16)))
            line += f"; bitwise equal to the single-GPU kernel: {same}"
            rc = 0 if same else 1
        lines = [None] * R
        dist.all_gather_object(lines, line)
        if rank == 0:
            print("\n".join(lines))
        if trace_path:
            _, recs = k(x, xs, idx, tw, trace=True)
            with open(f"{trace_path}.rank{rank}.json", "w") as f:
                json.dump(to_chrome(recs), f)
    except KernelError as e:
        print(f"megamoe run (rank {rank}): {e}", file=sys.stderr)
        rc = 1
    codes = [None] * R
    dist.all_gather_object(codes, rc)
    dist.destroy_process_group()
    return max(codes)
