"""The SM100 (B200, compute capability 10.0) launch of :class:`megamoe.kernel.MegaMoEKernel`.

**Never executed.** No SM100 GPU has run this code or the kernel it launches
(``csrc/megamoe/kernel_sm100.cu``); what is verified, on a machine without a GPU, is listed in
``docs/kernel.md`` ("SM100 path") and checked by ``tests/test_kernel_select.py`` /
``tests/test_kernel_sm100.py``: the launch numbers, the weight layout, the workspace sizes, every
field of the parameter struct and the call of ``megamoe_sm100_launch``. Constructing the kernel
emits an :class:`UnverifiedKernelWarning` saying so.

``MegaMoEKernel(...)`` on a 10.0 device returns a :class:`MegaMoEKernelSm100` (same arguments,
same call ``k(x, x_sf, topk_idx, topk_weights)``). The four pieces of the SM100 launch:

1. **Launch numbers per call** -- :func:`megamoe.design_sm100.design_for` (equal, field by field,
   to ``design_sm100.config_from_plan`` of a ``deepgemm-sm100`` plan for the same call); a
   config from a plan can be passed instead as ``design=``.
2. **Weights** -- :func:`to_sm100_weights`: the checkpoint :class:`~megamoe.kernel.runtime.Weights`
   of ``prepare_weights`` go through :func:`megamoe.layouts.transform_weights_for_mega_moe`
   once, at construction (gate/up interleave every 8 rows; scales packed four per int32,
   MN-major, UTCCP-transposed): :class:`Sm100Weights`.
3. **Workspace** -- :func:`workspace_spec`: the SM90 buffers, except that the two pool scale
   buffers are ``[K/128][sf_pool_rows][4]`` bytes with every pool block padded to
   ``align(block_m, 128)`` rows in UTCCP row order (``UtccpSfRow`` in ``roles_shared.cuh``).
4. **Parameters and launch** -- :func:`pack_params` fills ``Sm100Params``
   (:func:`megamoe.design_sm100.params_type`) and :meth:`MegaMoEKernelSm100.__call__` passes it to
   ``megamoe_sm100_launch`` on the current stream.
"""

from __future__ import annotations

import contextlib
import ctypes
import warnings
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from .. import design_sm100, layouts
from ..errors import InputError, require
from . import runtime as _runtime
from .runtime import KernelError, MegaMoEKernel, Weights, output_tensor
from .select import PATHS, SM100_UNVERIFIED, device_capability, path_for_device
from .trace import record_buffers, trace_capacity

ARCH = "sm_100a"


class UnverifiedKernelWarning(UserWarning):
    """The kernel being constructed has never executed on its target GPU (SM100)."""


# ------------------------------------------------------------------ weights


@dataclass
class Sm100Weights:
    """Weights in the SM100 kernel's layout (``layouts.transform_weights_for_mega_moe``).

    Attributes:
        w1: ``uint8 [E, 2I, H/2]`` packed E2M1, gate/up rows interleaved every 8, contiguous.
        w1_sf: ``int32 [E, 2I, H/128]`` (four UE8M0 per word along K), MN-major: strides
            ``(H/128 * 2I, 1, 2I)``, rows UTCCP-transposed in each 128; the kernel reads word
            ``(e * H/128 + kb) * 2I + row`` from ``data_ptr()``.
        w2: ``uint8 [E, H, I/2]`` contiguous.
        w2_sf: ``int32 [E, H, I/128]``, strides ``(I/128 * H, 1, H)``, UTCCP rows.
    """
    w1: object
    w1_sf: object
    w2: object
    w2_sf: object

    def checkpoint(self) -> Weights:
        """The MXFP4 checkpoint layout back (``layouts.untransform_weights_for_mega_moe``)."""
        (w1, s1), (w2, s2) = layouts.untransform_weights_for_mega_moe((self.w1, self.w1_sf), (self.w2, self.w2_sf))
        return Weights(w1, s1, w2, s2)


def _check_sf(sf, name: str, e: int, n: int, k: int) -> None:
    import torch
    shape, strides = (e, n, k // 128), ((k // 128) * n, 1, n)
    require(sf.dtype == torch.int32, name, "int32 (four UE8M0 per word)", str(sf.dtype))
    require(tuple(sf.shape) == shape, name, f"shape {shape}", tuple(sf.shape))
    require(tuple(sf.stride()) == strides, name, f"MN-major strides {strides} (layouts.to_mn_major)",
            tuple(sf.stride()))


def check_sm100_weights(w: Sm100Weights, num_experts: int, hidden: int, inter: int) -> None:
    """Shapes, dtypes and strides the kernel's address arithmetic assumes.

    Raises:
        InputError: naming the tensor.
    """
    import torch
    E, H, I = num_experts, hidden, inter
    for name, t, shape in (("weights.w1", w.w1, (E, 2 * I, H // 2)), ("weights.w2", w.w2, (E, H, I // 2))):
        require(t.dtype in (torch.uint8, torch.int8), name, "uint8 or int8 (packed E2M1)", str(t.dtype))
        require(tuple(t.shape) == shape and t.is_contiguous(), name, f"contiguous {shape}",
                (tuple(t.shape), tuple(t.stride())))
    _check_sf(w.w1_sf, "weights.w1_sf", E, 2 * I, H)
    _check_sf(w.w2_sf, "weights.w2_sf", E, H, I)
    devs = {t.device for t in (w.w1, w.w1_sf, w.w2, w.w2_sf)}
    require(len(devs) == 1, "weights", "all four tensors on one device", sorted(map(str, devs)))


def to_sm100_weights(weights, num_experts: int, hidden: int, inter: int) -> Sm100Weights:
    """The weights the SM100 kernel reads.

    Args:
        weights: checkpoint :class:`~megamoe.kernel.runtime.Weights` (``prepare_weights``):
            transformed with ``layouts.transform_weights_for_mega_moe``; or :class:`Sm100Weights`
            already in the kernel layout: checked and used as they are.
    Raises:
        InputError: anything else, or shapes that do not match the kernel's.
    """
    if isinstance(weights, Sm100Weights):
        w = weights
    elif isinstance(weights, Weights):
        (w1, s1), (w2, s2) = layouts.transform_weights_for_mega_moe((weights.w1, weights.w1_sf),
                                                                     (weights.w2, weights.w2_sf))
        w = Sm100Weights(w1, s1, w2, s2)
    else:
        raise InputError("weights", "prepare_weights(...) (checkpoint layout) or megamoe.kernel.sm100.Sm100Weights",
                         type(weights).__name__)
    check_sm100_weights(w, num_experts, hidden, inter)
    return w


# ------------------------------------------------------------------ workspace


def sf_pool_row(row, block_m: int):
    """Row of the SM100 pool scale buffer holding pool row ``row`` (``UtccpSfRow`` of
    ``roles_shared.cuh``): pool block ``row // block_m`` owns ``align(block_m, 128)`` rows, and
    row ``r`` inside it is stored at ``utccp_row(r) = (r & ~127) + (r & 31) * 4 + ((r >> 5) & 3)``.
    Works on ints and integer arrays."""
    r = row % block_m
    return (row // block_m) * design_sm100.sf_block_m(block_m) + (r & ~127) + (r & 31) * 4 + ((r >> 5) & 3)


def workspace_spec(cfg, max_tokens: int, hidden: int, inter: int, num_experts: int, topk: int) -> dict:
    """name -> (shape, dtype name, initial value or None) of every SM100 workspace buffer.

    As SM90 (``runtime.MegaMoEKernel._workspace``) except the pool scale buffers:
    ``[K/128][sf_pool_rows][4]`` UE8M0 bytes (K = hidden for L1, inter for L2), zero-filled once
    so that the padding rows of each pool block (``block_m .. align(block_m, 128)``, never
    written, copied into TMEM for the padding token columns) hold finite scales.
    """
    R, S, bm = cfg.pool_tokens, cfg.sf_pool_rows, cfg.block_m
    T, H, I, E, K = max_tokens, hidden, inter, num_experts, topk
    nblk = R // bm
    return dict(
        l1_pool=((R, H), "uint8", None), l1_pool_sf=((H // 128, S, 4), "uint8", 0),
        l2_pool=((R, I), "uint8", None), l2_pool_sf=((I // 128, S, 4), "uint8", 0),
        pool_token=((R,), "int32", -1), pool_slot=((R,), "int32", -1), pool_weight=((R,), "float32", 0),
        expert_count=((2 * E + 2,), "int64", 0), arrival=((nblk,), "int32", 0), mask=((nblk,), "int64", 0),
        grid_sync=((1,), "int32", 0), error=((8,), "int32", 0),
        item_pos=((max(T * K, 1),), "int32", None), item_order=((max(T * K, 1),), "int32", None),
        combine_buf=((K, T, H), "bfloat16", None),
    )


#: Workspace buffers, in ``Params`` order (the struct fields of the same names).
WORKSPACE_FIELDS = ("l1_pool", "l1_pool_sf", "l2_pool", "l2_pool_sf", "pool_token", "pool_slot", "pool_weight",
                    "expert_count", "arrival", "mask", "grid_sync", "error", "item_pos", "combine_buf",
                    "item_order")


# ------------------------------------------------------------------ parameters


def pack_params(cfg, *, num_tokens: int, hidden: int, inter: int, num_experts: int, topk: int, timeout_ns: int,
                trace_cap: int, fault_inject: int, clamp: float, x, x_sf, topk_idx, topk_w, weights: Sm100Weights,
                ws: dict, y, trace=None, trace_count=None, progress=None):
    """``Sm100Params`` (ctypes, :func:`megamoe.design_sm100.params_type`) for one EP=1 launch:
    the plan numbers of ``cfg`` (:class:`megamoe.design_sm100.SM100KernelConfig`), the shape,
    and the ``data_ptr()`` of every tensor. EP fields as SM90's EP=1 launch (one rank, no peers)."""
    from .runtime import Params
    q = PATHS[ARCH].params_type()
    ptr = lambda t: None if t is None else t.data_ptr()  # noqa: E731
    q.base = Params(
        num_tokens=num_tokens, hidden=hidden, inter=inter, num_experts=num_experts, topk=topk,
        block_m=cfg.block_m, num_stages=cfg.num_stages, experts_per_wave=cfg.experts_per_wave,
        num_sms=cfg.num_sms, pool_rows=cfg.pool_tokens, timeout_ns=timeout_ns, trace_cap=trace_cap,
        fault_inject=fault_inject, clamp=clamp,
        x=ptr(x), x_sf=ptr(x_sf), topk_idx=ptr(topk_idx), topk_w=ptr(topk_w),
        w1=ptr(weights.w1), w1_sf=ptr(weights.w1_sf), w2=ptr(weights.w2), w2_sf=ptr(weights.w2_sf),
        **{k: ptr(ws[k]) for k in WORKSPACE_FIELDS},
        y=ptr(y), trace=ptr(trace), trace_count=ptr(trace_count), progress=ptr(progress),
        combine_rows=num_tokens, device=-1, num_ranks=1, rank=0)
    q.block_k, q.pull_bytes, q.sf_pool_rows, q.reserved = cfg.block_k, cfg.bytes_per_pull, cfg.sf_pool_rows, 0
    return q


def current_stream(torch, device) -> int:
    """The ``cudaStream_t`` of ``device``'s current torch stream (tests replace this)."""
    return torch.cuda.current_stream(device).cuda_stream


def device_guard(torch, device):
    """Context making ``device`` current: ``megamoe_sm100_launch`` launches on the current
    device (``cudaGetDevice``). Tests replace this."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


# ------------------------------------------------------------------ the kernel


class MegaMoEKernelSm100(MegaMoEKernel):
    """:class:`~megamoe.kernel.MegaMoEKernel` on a compute-capability 10.0 device (what
    ``MegaMoEKernel(...)`` returns there). Same arguments and call; ``design=`` takes a
    :class:`megamoe.design_sm100.SM100KernelConfig` (``design_sm100.config_from_plan`` of a
    ``deepgemm-sm100`` plan). ``weights`` may be ``prepare_weights(...)`` (transformed here) or
    :class:`Sm100Weights`. **Never executed on an SM100 GPU.**"""

    def __init__(self, num_experts: int, topk: int, hidden: int, inter: int, max_tokens: int, weights,
                 clamp: float | None = None, num_sms: int | None = None, block_m: int | None = None,
                 num_stages: int | None = None, experts_per_wave: int | None = None, timeout_s: float = 10.0,
                 trace_cap: int | None = None, device=None):
        import torch
        self.torch = torch
        self.device = torch.device(device or "cuda")
        self.path = path_for_device(self.device)
        if self.path.arch != ARCH:
            cc = device_capability(self.device)
            raise InputError("device.compute_capability", f"{PATHS[ARCH].capability} ({ARCH}) for MegaMoEKernelSm100",
                             f"{cc[0]}.{cc[1]}")
        self.lib = _runtime.load_library(ARCH)
        warnings.warn(SM100_UNVERIFIED, UnverifiedKernelWarning, stacklevel=2)
        require(max_tokens >= 1, "max_tokens", ">= 1", max_tokens)
        self._set_common(num_experts, topk, hidden, inter, max_tokens, clamp, num_sms, block_m, num_stages,
                         experts_per_wave, timeout_s, trace_cap)
        self._ws_cfg = None
        # the smallest and the largest call (both block_k values, the smallest and largest block_m): InputError
        # now if the compiled library would refuse them
        for t in sorted({1, max_tokens}):
            self.check_config(self.design(t))
        self.weights = None if weights is None else to_sm100_weights(weights, num_experts, hidden, inter)

    # -- numbers
    def design(self, num_tokens: int):
        """Launch numbers of a call of ``num_tokens`` tokens: ``design_sm100.design_for`` (the
        ``deepgemm-sm100`` plan's numbers for that call)."""
        return design_sm100.design_for(num_tokens, self.max_tokens, self.H, self.I, self.E, self.K, self.num_sms,
                                       **self.fixed)

    def check_config(self, cfg) -> None:
        """The compiled library's own check of the numbers (``megamoe_sm100_check_config``, no GPU).

        Raises:
            InputError: with the library's error text.
        """
        rc = self.lib.megamoe_sm100_check_config(cfg.block_m, cfg.block_k, cfg.num_stages, cfg.experts_per_wave,
                                                 self.E, self.H, self.I, cfg.pool_tokens, cfg.bytes_per_pull,
                                                 cfg.num_sms)
        if rc != 0:
            raise InputError("sm100 launch numbers", "numbers megamoe_sm100_check_config accepts",
                             f"{self.lib.megamoe_sm100_error_string(rc).decode()} (code {rc}) for "
                             f"block_m={cfg.block_m}, block_k={cfg.block_k}, stages={cfg.num_stages}, "
                             f"experts_per_wave={cfg.experts_per_wave}, E={self.E}, H={self.H}, I={self.I}, "
                             f"pool={cfg.pool_tokens}, pull={cfg.bytes_per_pull}, sms={cfg.num_sms}")

    # -- workspace
    def _workspace(self, cfg):
        torch = self.torch
        key = (cfg.block_m, cfg.pool_tokens, cfg.sf_pool_rows)
        if self._ws_key == key:
            return self._ws
        ws = {}
        for name, (shape, dtype, init) in workspace_spec(cfg, self.max_tokens, self.H, self.I, self.E,
                                                         self.K).items():
            dt = getattr(torch, dtype)
            ws[name] = (torch.empty(shape, dtype=dt, device=self.device) if init is None
                        else torch.full(shape, init, dtype=dt, device=self.device))
        self._ws, self._ws_key, self._ws_cfg = ws, key, cfg
        return ws

    # -- launch
    def __call__(self, x, x_sf, topk_idx, topk_w, trace: bool = False, design=None, out=None):
        torch = self.torch
        require(self.weights is not None, "weights", "prepare_weights(...) given to the constructor", None)
        T, x, x_sf, topk_idx, topk_w = self._checked_inputs(x, x_sf, topk_idx, topk_w, trace)
        if design is None:
            design = self.design(T)
        require(isinstance(design, design_sm100.SM100KernelConfig), "design",
                "a megamoe.design_sm100.SM100KernelConfig (design_for / config_from_plan)", type(design).__name__)
        self.check_config(design)
        self.last_design = design
        ws = self._workspace(design)
        y = output_tensor(torch, out, T, self.H, self.device)
        cap, tr, trc = 0, None, None
        if trace:
            cap = self.trace_cap_override or trace_capacity(
                SimpleNamespace(pool_rows=design.pool_tokens, block_m=design.block_m), self.I, self.H,
                design.num_sms, fixed=8)
            tr, trc = record_buffers(self, design.num_sms, cap)
        q = pack_params(design, num_tokens=T, hidden=self.H, inter=self.I, num_experts=self.E, topk=self.K,
                        timeout_ns=self.timeout_ns, trace_cap=cap, fault_inject=self.fault_inject, clamp=self.clamp,
                        x=x, x_sf=x_sf, topk_idx=topk_idx, topk_w=topk_w, weights=self.weights, ws=ws, y=y,
                        trace=tr, trace_count=trc, progress=getattr(self, "progress", None))
        stream = current_stream(torch, self.device)
        with device_guard(torch, self.device):
            rc = self.lib.megamoe_sm100_launch(ctypes.byref(q), ctypes.c_void_p(stream))
        if rc != 0:
            raise KernelError(f"launch failed: {self.lib.megamoe_sm100_error_string(rc).decode()} (code {rc})")
        self._pending_check = True
        if trace:
            self._pending_trace = (tr, trc, cap)
            if trace == "device":
                return y
            return y, self.fetch_trace()
        return y

    def pool_contents(self):
        """(l1_pool rows, l1 scales [rows, H/32] in pool-row order, token, slot) of the last call:
        the scale rows are read back through :func:`sf_pool_row` (UTCCP order, padded blocks)."""
        torch = self.torch
        ws, cfg = self._ws, self._ws_cfg
        R = cfg.pool_tokens
        rows = torch.as_tensor(sf_pool_row(np.arange(R, dtype=np.int64), cfg.block_m), device=self.device)
        sf = ws["l1_pool_sf"].index_select(1, rows).permute(1, 0, 2).reshape(R, self.H // 32)
        return ws["l1_pool"], sf, ws["pool_token"], ws["pool_slot"]
