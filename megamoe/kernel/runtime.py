"""Load the compiled library, own the buffers, launch, check errors, return the trace."""

from __future__ import annotations

import ctypes
import inspect
import math
from dataclasses import dataclass

import numpy as np

from .. import design_sm90
from ..errors import InputError, is_int, require
from .build import KernelBuildError, build
from .select import PATHS, path_for_device
from .trace import fetch_records, record_buffers, trace_capacity

_LIBS: dict = {}  # arch -> loaded, bound ctypes.CDLL


class KernelError(RuntimeError):
    """The kernel reported an error (a timed-out wait, overflow) or could not launch."""


ERROR_NAMES = {
    1: "timeout waiting for a pool block's arrival count (dispatch -> L1)",
    2: "timeout waiting for a pool block's arrival-mask bits (L1 epilogue -> L2)",
    3: "timeout waiting for every CTA's expert counts (count barrier)",
    4: "timeout in the grid sync before combine (waits 2x the timeout: downstream of every other wait)",
    5: "timeout in a shared-memory pipeline barrier (producer <-> consumer; waits 1.5x the timeout: downstream "
       "of the arrival, mask and count waits)",
    6: "pool capacity too small for the routed items",
    7: "topk_idx holds an expert outside [-1, num_experts)",
    8: "timeout in an NVLink barrier (expert parallelism)",
    9: "source-index table overflow (more than max_tokens items from one rank to one expert) or an entry "
       "outside the source buffer (a peer that failed this call: reset every rank)",
}
#: Waits downstream of others wait longer, so the wait that names the cause raises first
#: (common.cuh): the final grid sync 2x the timeout, a shared-memory pipeline barrier 1.5x.
WAIT_FACTOR = {4: 2.0, 5: 1.5}
NVL_BARRIER_NAMES = {1: "dispatch (after the source-index exchange)", 2: "combine (after the L2 write-back)"}


def format_error(err, timeout_ns: int) -> str:
    """Readable text of the kernel's error words ``[code, cta, role, expert, m, n, k, observed]``."""
    code = int(err[0])
    role = ROLE_NAMES[err[2]] if err[2] < 3 else str(err[2])
    ex = lambda v: -1 if v == 0xFFFFFFFF else int(v)  # noqa: E731
    if code == 8:
        return (f"megamoe kernel error 8: timeout in NVLink barrier {ex(err[3])} "
                f"({NVL_BARRIER_NAMES.get(ex(err[3]), '?')}) on rank {ex(err[4])}: rank {ex(err[5])} never arrived "
                f"({int(err[7])} of its CTAs arrived) [cta {err[1]}, role {role}] after "
                f"{timeout_ns / 1e9:g} s timeout")
    waited = timeout_ns * WAIT_FACTOR.get(code, 1.0)
    return (f"megamoe kernel error {code}: {ERROR_NAMES.get(code, 'unknown')} "
            f"[cta {err[1]}, role {role}, expert {ex(err[3])}, m_block {ex(err[4])}, "
            f"n_block {ex(err[5])}, k {ex(err[6])}, observed {err[7]}] after "
            f"{waited / 1e9:g} s")
ROLE_NAMES = ("dispatch", "producer", "consumer")


class Params(ctypes.Structure):
    """ctypes mirror of ``megamoe::Params`` (csrc/megamoe/params.h); every field 8 bytes."""
    _fields_ = [(n, ctypes.c_int64) for n in (
        "num_tokens", "hidden", "inter", "num_experts", "topk", "block_m", "num_stages", "experts_per_wave",
        "num_sms", "pool_rows", "timeout_ns", "trace_cap", "fault_inject")] + [("clamp", ctypes.c_double)] + [
        (n, ctypes.c_void_p) for n in (
            "x", "x_sf", "topk_idx", "topk_w", "w1", "w1_sf", "w2", "w2_sf", "l1_pool", "l1_pool_sf", "l2_pool",
            "l2_pool_sf", "pool_token", "pool_slot", "pool_weight", "expert_count", "arrival", "mask",
            "grid_sync", "error", "item_pos", "combine_buf", "y", "trace", "trace_count", "progress")] + [
        (n, ctypes.c_int64) for n in (
            "combine_rows", "device", "num_ranks", "rank", "off_x", "off_x_sf", "off_topk_w", "off_src_idx",
            "off_recv_count", "off_combine", "off_flag")] + [
        (n, ctypes.c_void_p) for n in ("peer_base", "send_count", "cta_hist", "pool_rank", "epoch_counter",
                                       "w1_row_scale", "w2_row_scale", "fold_table",
                                       "l1_pool_fsx", "l2_pool_fsx", "item_order")] + [("ctas_per_sm", ctypes.c_int64)]


def cuda_available() -> bool:
    try:
        import torch
        return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9
    except Exception:
        return False


def load_library(arch: str = "sm_90a"):
    """Build (cached) and load ``arch``'s library, bind its entry points from
    :data:`megamoe.kernel.select.PATHS` and check its parameter-struct size against the ctypes
    mirror. One library per arch per process. ``MegaMoEKernel`` passes the arch that
    :func:`megamoe.kernel.select.path_for_device` picks; the default is the SM90 library
    (what ``MegaMoEKernelEP`` launches).

    Raises:
        KernelError: the library's ``<prefix>_abi_size()`` differs from the ctypes mirror.
        KernelBuildError: unknown arch, no nvcc (and no cached build), compile error.
    """
    lib = _LIBS.get(arch)
    if lib is None:
        res = build(arch)  # an unknown arch: BuildSetupError (a KernelBuildError) from build()
        try:
            lib = load_library_file(res.path, arch)
        except OSError:  # built elsewhere against other system libraries: rebuild here
            lib = load_library_file(build(arch, force=True).path, arch)
        _LIBS[arch] = lib
    return lib


def load_library_file(path, arch: str = "sm_90a", older_prefix: bool = False):
    """Load one built library file for ``arch`` and bind it like :func:`load_library`, without
    building or caching: e.g. another source tree's build, so that two kernel versions can be
    timed call by call in one process (``benchmarks/device/ab_interleaved.py``; assign the
    result to a kernel object's ``lib``).

    ``older_prefix``: also accept a library whose ``Params`` is shorter than this tree's mirror
    (an older version, to which this tree only appended fields: it reads the leading fields of
    the struct it is handed and ignores the rest). The caller vouches for the prefix; only the
    sizes are checked.

    Raises:
        KernelBuildError: unknown arch.
        OSError: the file is missing or not a loadable library.
        KernelError: the library's ``<prefix>_abi_size()`` differs from this tree's ctypes
            mirror (its ``Params`` layout is another version's), or with ``older_prefix`` is
            larger than it.
    """
    path_info = PATHS.get(arch)
    if path_info is None:
        raise KernelBuildError(f"arch: expected one of {sorted(PATHS)}, got {arch!r}")
    lib = ctypes.CDLL(str(path))
    path_info.bind(lib)
    abi, mirror = getattr(lib, path_info.symbol("abi_size"))(), ctypes.sizeof(path_info.params_type)
    if abi != mirror and not (older_prefix and abi < mirror):
        raise KernelError(f"ABI mismatch ({arch}): {path_info.symbol('abi_size')}() = {abi} B, ctypes mirror "
                          f"{path_info.params_type.__name__} = {mirror} B")
    return lib


@dataclass
class Weights:
    """Kernel weights. ``prepare_weights`` gives the MXFP4 checkpoint layout:
    w1 [E, 2I, H/2] packed E2M1 (gate rows 0..I-1, up rows I..2I-1; element 2i in the low
    nibble), w1_sf [E, 2I, H/32] UE8M0, w2 [E, H, I/2], w2_sf [E, H, I/32]. The SM90 kernel
    object keeps a copy in its TMA tile layout (:func:`sm90_weights`). On a
    compute-capability 10.0 device ``MegaMoEKernel`` transforms them once into the SM100 kernel's
    layout (:class:`megamoe.kernel.sm100.Sm100Weights`, ``layouts.transform_weights_for_mega_moe``)."""
    w1: "object"
    w1_sf: "object"
    w2: "object"
    w2_sf: "object"


def prepare_weights(w1, w1_sf, w2, w2_sf) -> Weights:
    """Validate MXFP4 checkpoint tensors (uint8 on one CUDA device) and make them contiguous.

    Raises:
        InputError: a tensor that is not ``uint8`` with 3 dimensions, or shapes that do not
            fit ``w1 [E, 2I, H/2]`` (one line naming the tensor)."""
    import torch

    from megamoe.formats import _check_tensor
    for name, t in (("w1", w1), ("w1_sf", w1_sf), ("w2", w2), ("w2_sf", w2_sf)):
        _check_tensor(t, f"weights.{name}", dtypes=(torch.uint8,), ndim=3, contiguous=False)
    E, n1, hh = w1.shape
    require(n1 % 2 == 0, "weights.w1", "[E, 2I, H/2]", tuple(w1.shape))
    I, H = n1 // 2, hh * 2
    require(tuple(w1_sf.shape) == (E, 2 * I, H // 32), "weights.w1_sf", f"[{E}, {2 * I}, {H // 32}]",
            tuple(w1_sf.shape))
    require(tuple(w2.shape) == (E, H, I // 2), "weights.w2", f"[{E}, {H}, {I // 2}]", tuple(w2.shape))
    require(tuple(w2_sf.shape) == (E, H, I // 32), "weights.w2_sf", f"[{E}, {H}, {I // 32}]", tuple(w2_sf.shape))
    return Weights(*(t.contiguous().view(torch.uint8) for t in (w1, w1_sf, w2, w2_sf)))


#: Largest weight scale byte the SM90 kernel takes: 254 is the largest finite UE8M0 byte
#: (2^127; 255 is NaN in the OCP MX formats). The kernel's row scale is 2^(s_max - 133).
SM90_MAX_WEIGHT_SCALE_BYTE = 254


@dataclass
class Sm90Weights(Weights):
    """What the SM90 kernel reads (:func:`sm90_weights`): w1 / w2 in the TMA tiles of
    :func:`megamoe.layouts.transform_weights_for_sm90`, w1_sf / w2_sf the same tiles of the
    weight fold's table offsets (``uint8``, 8 d per 32-group,
    :func:`megamoe.layouts.fold_e2m1_scales_for_sm90`), ``w1_row_scale`` float32 ``[E, 2I]``
    (gate/up interleaved every 8 rows) and ``w2_row_scale`` ``[E, H]``: 2^(s_max - 133) per
    row; ``fold_table`` uint8 ``[20, 8]`` (:func:`megamoe.layouts.sm90_fold_table`)."""
    w1_row_scale: object = None
    w2_row_scale: object = None
    fold_table: object = None

    def params(self) -> dict:
        """The Params fields (device addresses) of these weights."""
        return {k: getattr(self, k).data_ptr() for k in ("w1", "w1_sf", "w2", "w2_sf", "w1_row_scale",
                                                         "w2_row_scale", "fold_table")}


def sm90_weights(weights: Weights) -> Sm90Weights:
    """Checkpoint-layout weights -> what the SM90 kernel reads (:class:`Sm90Weights`): every
    tensor cut into the tiles of :func:`megamoe.layouts.transform_weights_for_sm90` (gate/up
    interleave, bits in register-fragment order, one contiguous 8192 + 512-byte tile per 128
    rows x 128 K), so the producer loads a stage's weights and table offsets with two TMA bulk
    copies, and the weight fold (:func:`megamoe.layouts.fold_e2m1_scales_for_sm90`: per row,
    each 32-group's scale relative to the row's largest as a decode-table offset, and the row's
    scale 2^(s_max - 133)). A new copy on the same device: the weights' memory once more.

    Numerics: ``megamoe.reference.Numerics.sm90_kernel()`` (the weight fold is exact when every
    row's nonzero 32-groups lie within 14 binades of its largest; the activations are folded
    per 64-K group by the kernel itself, :func:`megamoe.layouts.fold_e4m3_scales_for_sm90`).

    Raises:
        InputError: ``weights`` is not a :class:`Weights` (``prepare_weights``), N / K are
            not multiples of 128, or a weight scale byte is 255 (NaN)."""
    import torch

    from megamoe.formats import UE8M0_BIAS
    from megamoe.layouts import (
        SM90_FOLD_TOP,
        fold_e2m1_scales_for_sm90,
        interleave_gate_up,
        sm90_fold_table,
        transform_weights_for_sm90,
    )
    require(isinstance(weights, Weights), "weights", "prepare_weights(...) (checkpoint layout)", type(weights).__name__)
    for name, sf in (("weights.w1_sf", weights.w1_sf), ("weights.w2_sf", weights.w2_sf)):
        top = int(sf.max()) if sf.numel() else 0
        require(top <= SM90_MAX_WEIGHT_SCALE_BYTE, name,
                f"UE8M0 bytes <= {SM90_MAX_WEIGHT_SCALE_BYTE} (255 is NaN)", f"a byte {top}")
    o1, r1 = fold_e2m1_scales_for_sm90(weights.w1, weights.w1_sf, "weights.w1")
    o2, r2 = fold_e2m1_scales_for_sm90(weights.w2, weights.w2_sf, "weights.w2")
    (w1, t1), (w2, t2) = transform_weights_for_sm90((weights.w1, o1), (weights.w2, o2))

    def row_scale(r):  # 2^(s_max - 127 - 6) exactly (float64 -> float32 keeps powers of two down to 2^-149)
        return torch.exp2(r.to(torch.float64) - (UE8M0_BIAS + SM90_FOLD_TOP)).to(torch.float32)
    rs1 = interleave_gate_up(row_scale(r1), name="weights.w1_row_scale")
    return Sm90Weights(w1, t1, w2, t2, rs1.contiguous(), row_scale(r2).contiguous(),
                       sm90_fold_table().to(weights.w1.device))


def check_kernel_shape(num_experts: int, topk: int, hidden: int, inter: int, ranks: int = 1) -> None:
    """The SM90 kernel's shape limits (EP1 and EP), pure Python: ``megamoe run`` checks them
    before it looks for a GPU, the kernel objects when they are built.

    Raises:
        InputError: hidden or inter not a multiple of 128 (``shape``), inter above 4096 (64 L1
            N blocks per arrival-mask word, ``shape.inter``), ``topk`` outside 1..num_experts
            (``shape.topk``), ``ranks`` not a divisor of ``num_experts`` (``num_ranks``), or more
            than 256 experts per rank (the scheduler's lane cache; ``shape.num_experts``)."""
    require(hidden % 128 == 0 and inter % 128 == 0, "shape", "hidden and inter multiples of 128", (hidden, inter))
    require(2 * inter // 128 <= 64, "shape.inter", "<= 4096 (64 L1 N blocks per mask word)", inter)
    require(1 <= topk <= num_experts, "shape.topk", f"1..{num_experts} (num_experts)", topk)
    require(ranks >= 1 and num_experts % ranks == 0, "num_ranks", f"a divisor of num_experts = {num_experts}", ranks)
    require(num_experts // ranks <= 256, "shape.num_experts",
            "<= 256 per rank (scheduler lane cache)" + ("" if ranks == 1 else f", with {ranks} ranks"), num_experts)


def clamp_value(clamp) -> float:
    """The SwiGLU clamp the kernel reads: ``None`` (no clamp) -> ``inf``, else a finite number
    > 0 as a float.

    Raises:
        InputError: anything else (NaN, inf, zero, negative, not a number)."""
    if clamp is None:
        return math.inf
    try:
        v = float(clamp)
    except (TypeError, ValueError):
        v = math.nan
    require(math.isfinite(v) and v > 0, "clamp", "a finite number > 0, or None for no clamp", clamp)
    return v


def check_call_shapes(x, x_sf, topk_idx, topk_w, hidden: int, topk: int, max_tokens: int) -> int:
    """The shapes of one kernel call's inputs (EP1 and EP): ``x [T, hidden]`` with ``T <=
    max_tokens``, ``x_sf [T, hidden/32]``, ``topk_idx`` and ``topk_w [T, topk]``. Returns T.

    Raises:
        InputError: the first field whose shape is wrong (one line naming it)."""
    try:
        T = x.shape[0]
        if (x.dim() == 2 and x.shape[1] == hidden and T <= max_tokens and x_sf.shape == (T, hidden // 32)
                and topk_idx.shape == (T, topk) and topk_w.shape == (T, topk)
                and hasattr(x_sf, "dim") and hasattr(topk_idx, "dim") and hasattr(topk_w, "dim")):
            return T  # the common case without building the messages below (host time per call)
    except (AttributeError, IndexError, TypeError):
        pass  # not tensors, or a 0-D x: named below
    for name, t in (("x", x), ("x_sf", x_sf), ("topk_idx", topk_idx), ("topk_weights", topk_w)):
        require(hasattr(t, "dim") and hasattr(t, "shape"), name, "a torch tensor", type(t).__name__)
    require(x.dim() == 2 and x.shape[1] == hidden, "x", f"[T, {hidden}] float8_e4m3fn", tuple(x.shape))
    T = x.shape[0]
    require(T <= max_tokens, "x", f"at most max_tokens={max_tokens} rows", T)
    require(tuple(x_sf.shape) == (T, hidden // 32), "x_sf", f"[{T}, {hidden // 32}] UE8M0", tuple(x_sf.shape))
    require(tuple(topk_idx.shape) == (T, topk), "topk_idx", f"[{T}, {topk}]", tuple(topk_idx.shape))
    require(tuple(topk_w.shape) == (T, topk), "topk_weights", f"[{T}, {topk}]", tuple(topk_w.shape))
    return T


def on_call_device(t, device) -> bool:
    """Whether tensor ``t`` may be handed to a launch on ``device``: on that device, or on CUDA (the
    one rule of the call's inputs, its output buffer and the debug progress words)."""
    return t.device == device or t.device.type == "cuda"


def output_tensor(torch, out, T: int, hidden: int, device):
    """``out`` (a caller's buffer, checked) or a new BF16 ``[T, hidden]`` tensor for a call's output.

    Raises:
        InputError: ``out`` not a contiguous bfloat16 ``[T, hidden]`` tensor on the call's
            device (a CUDA device, or ``device`` as the call's inputs)."""
    if out is None:
        return torch.empty(T, hidden, dtype=torch.bfloat16, device=device)
    if not (isinstance(out, torch.Tensor) and out.shape == (T, hidden) and out.dtype == torch.bfloat16
            and out.is_contiguous() and on_call_device(out, device)):
        got = type(out).__name__
        if isinstance(out, torch.Tensor):
            got = (f"{'a contiguous' if out.is_contiguous() else 'a non-contiguous'} {str(out.dtype)[6:]} "
                   f"{list(out.shape)} tensor on {out.device}")
        raise InputError("out", f"a contiguous bfloat16 [{T}, {hidden}] tensor on the call's CUDA device", got)
    return out


#: The pool buffers of an SM90 launch (one rank or EP), as ``Params`` fields: :func:`pool_buffers`.
POOL_FIELDS = ("l1_pool", "l1_pool_sf", "l1_pool_fsx", "l2_pool", "l2_pool_sf", "l2_pool_fsx", "pool_token",
               "pool_slot", "pool_weight", "arrival", "mask")
#: Those a call writes only for the rows it routes (the L1 ones) or for its blocks (the L2 ones).
POOL_DATA_FIELDS = POOL_FIELDS[:6]


def pool_buffers(torch, design, hidden: int, inter: int, device) -> dict:
    """The expert-contiguous pools of one SM90 launch (``design.pool_rows`` rows of
    ``design.block_m``-row pool blocks), keyed by :data:`POOL_FIELDS`: the FP8 rows ``uint8
    [R, H]`` / ``[R, I]``, their UE8M0 bytes ``uint8 [K/128][R][4]``, the same scales as FP32
    per 64-K group ``float32 [K/128][pool block][2][block_m]`` (``csrc/megamoe/params.h``), each
    row's token / top-k slot (-1: none) and top-k weight, and per pool block the arrival count
    and the L1 N-block mask."""
    R, bm = design.pool_rows, design.block_m
    nblk = R // bm
    u8 = dict(dtype=torch.uint8, device=device)
    f32 = dict(dtype=torch.float32, device=device)
    return dict(
        l1_pool=torch.empty(R, hidden, **u8), l1_pool_sf=torch.empty(hidden // 128, R, 4, **u8),
        l1_pool_fsx=torch.empty(hidden // 128, nblk, 2, bm, **f32),
        l2_pool=torch.empty(R, inter, **u8), l2_pool_sf=torch.empty(inter // 128, R, 4, **u8),
        l2_pool_fsx=torch.empty(inter // 128, nblk, 2, bm, **f32),
        pool_token=torch.full((R,), -1, dtype=torch.int32, device=device),
        pool_slot=torch.full((R,), -1, dtype=torch.int32, device=device),
        pool_weight=torch.zeros(R, **f32),
        arrival=torch.zeros(nblk, dtype=torch.int32, device=device),
        mask=torch.zeros(nblk, dtype=torch.int64, device=device))


class MegaMoEKernel:
    """One EP=1 mega-kernel instance: weights, plan numbers and workspace for up to
    ``max_tokens`` tokens. ``k(x, x_sf, topk_idx, topk_w)`` returns BF16 ``[T, H]``.

    The device's compute capability picks the kernel (:func:`megamoe.kernel.select.path_for_device`):
    on 9.x this class (the SM90 kernel); on 10.0 the constructor returns a
    :class:`megamoe.kernel.sm100.MegaMoEKernelSm100` (same arguments and call; the SM100 kernel,
    **never executed on an SM100 GPU**); anything else raises ``InputError`` before building."""

    def __new__(cls, *args, **kwargs):
        if cls is not MegaMoEKernel:
            return super().__new__(cls)
        try:
            device = inspect.signature(cls.__init__).bind(None, *args, **kwargs).arguments.get("device")
        except TypeError:  # __init__ reports the bad arguments
            return super().__new__(cls)
        import torch
        if path_for_device(torch.device(device or "cuda")).arch == "sm_100a":
            from .sm100 import MegaMoEKernelSm100
            return super().__new__(MegaMoEKernelSm100)
        return super().__new__(cls)

    def __init__(self, num_experts: int, topk: int, hidden: int, inter: int, max_tokens: int, weights: Weights,
                 clamp: float | None = None, num_sms: int | None = None, block_m: int | None = None,
                 num_stages: int | None = None, experts_per_wave: int | None = None, timeout_s: float = 10.0,
                 trace_cap: int | None = None, device=None, ctas_per_sm: int | None = None):
        import torch
        self.torch = torch
        self.device = torch.device(device or "cuda")
        # kernel path by compute capability (megamoe.kernel.select): InputError if none
        self.path = path_for_device(self.device)
        self.lib = load_library(self.path.arch)
        if self.path.launch_missing:
            raise NotImplementedError(self.path.launch_missing)
        check_kernel_shape(num_experts, topk, hidden, inter)
        self._set_common(num_experts, topk, hidden, inter, max_tokens, clamp, num_sms, block_m, num_stages,
                         experts_per_wave, timeout_s, trace_cap)
        # CTAs per SM: None = the plan's rule (design_sm90.ctas_and_experts_per_wave), 1 or 2 to override
        self.fixed["ctas_per_sm"] = ctas_per_sm
        self.weights = sm90_weights(weights)

    def _set_common(self, num_experts, topk, hidden, inter, max_tokens, clamp, num_sms, block_m, num_stages,
                    experts_per_wave, timeout_s, trace_cap) -> None:
        """Shape, plan overrides, timeout and empty workspace: the same for every kernel path."""
        props = self.torch.cuda.get_device_properties(self.device)
        self.E, self.K, self.H, self.I = num_experts, topk, hidden, inter
        self.max_tokens = max_tokens
        self.clamp = clamp_value(clamp)
        self.num_sms = num_sms or props.multi_processor_count
        self.fixed = dict(block_m=block_m, num_stages=num_stages, experts_per_wave=experts_per_wave)
        self.timeout_ns = int(timeout_s * 1e9)
        self.fault_inject = 0
        self._ws = {}
        self._ws_key = None
        self.trace_cap_override = trace_cap
        self.last_design = None

    def _checked_inputs(self, x, x_sf, topk_idx, topk_w, trace):
        """Validate one call's inputs (one-line ``InputError`` naming the field) and return them
        as the kernel reads them: ``(T, x uint8, x_sf uint8, topk_idx int32, topk_w float32)``."""
        torch = self.torch
        T = check_call_shapes(x, x_sf, topk_idx, topk_w, self.H, self.K, self.max_tokens)

        def on_device(t):
            return on_call_device(t, self.device)

        if not (x.dtype in (torch.float8_e4m3fn, torch.uint8) and x_sf.dtype in (torch.uint8, torch.float8_e8m0fnu)
                and on_device(x) and on_device(x_sf) and on_device(topk_idx) and on_device(topk_w)
                and trace in (False, True, "device")):  # the messages are built only for a bad call
            require(x.dtype in (torch.float8_e4m3fn, torch.uint8), "x.dtype", "float8_e4m3fn", str(x.dtype))
            require(x_sf.dtype in (torch.uint8, torch.float8_e8m0fnu), "x_sf.dtype", "uint8 (UE8M0)",
                    str(x_sf.dtype))
            for name, t in (("x", x), ("x_sf", x_sf), ("topk_idx", topk_idx), ("topk_weights", topk_w)):
                require(on_device(t), name, "a CUDA tensor", str(t.device))
            require(trace in (False, True, "device"), "trace", "False, True or 'device'", trace)
        return (T, x.contiguous().view(torch.uint8), x_sf.contiguous().view(torch.uint8),
                topk_idx.to(torch.int32).contiguous(), topk_w.to(torch.float32).contiguous())

    # -- workspace
    def _workspace(self, design):
        torch = self.torch
        key = (design.block_m, design.pool_rows)
        if self._ws_key == key:
            return self._ws
        d = self.device
        T, H, E, K = self.max_tokens, self.H, self.E, self.K
        ws = dict(
            **pool_buffers(torch, design, H, self.I, d),
            expert_count=torch.zeros(2 * E + 2, dtype=torch.int64, device=d),  # + the sums and the count barrier (v8.5), the block ticket (v9.3)
            grid_sync=torch.zeros(1, dtype=torch.int32, device=d),
            error=torch.zeros(8, dtype=torch.int32, device=d),
            item_pos=torch.empty(max(T * K, 1), dtype=torch.int32, device=d),
            item_order=torch.empty(max(T * K, 1), dtype=torch.int32, device=d),
            combine_buf=torch.empty(K, T, H, dtype=torch.bfloat16, device=d),
        )
        self._ws, self._ws_key = ws, key
        return ws

    def _reset_workspace(self, ws=None):
        ws = self._ws if ws is None else ws
        for k in ("expert_count", "arrival", "mask", "error"):
            if k in ws:
                ws[k].zero_()

    def design(self, num_tokens: int):
        return design_sm90.design_for(self.max_tokens if num_tokens == 0 else num_tokens, self.H, self.I, self.E,
                                      self.K, num_sms=self.num_sms, **self.fixed)

    def _launch_fields(self, design, ws) -> dict:
        """The ``Params`` fields that stay the same from call to call for one design, workspace and
        set of weights (shape, plan numbers, weight and workspace addresses), kept between calls.
        Rebuilding them per call, with the design rule and the check messages, cost about two
        thirds of the host's ~100 us per eager call (benchmarks/NOTES_kernel.md, twenty-sixth
        session)."""
        w = self.weights
        c = getattr(self, "_fields_cache", None)
        if c is None or c[0] != design or c[1] is not ws or c[2] is not w:
            f = dict(hidden=self.H, inter=self.I, num_experts=self.E, topk=self.K, block_m=design.block_m,
                     num_stages=design.num_stages, experts_per_wave=design.experts_per_wave, num_sms=design.num_ctas,
                     ctas_per_sm=design.ctas_per_sm, pool_rows=design.pool_rows, device=-1, num_ranks=1, rank=0,
                     **w.params(),
                     **{k: ws[k].data_ptr() for k in POOL_FIELDS + ("expert_count", "grid_sync", "error", "item_pos",
                                                                    "item_order", "combine_buf")})
            c = self._fields_cache = (design, ws, w, f)
        return c[3]

    def _progress_ptr(self, design) -> int:
        """Address of the debug progress words (``self.progress``: int32, 32 per CTA, written by the
        kernel at ``blockIdx.x * 32 + slot``), 0 without them. Raises :class:`InputError` naming
        ``progress`` if the tensor is not an int32 CUDA tensor or holds fewer than
        ``design.num_ctas * 32`` words (two CTAs per SM launch twice the SMs' CTAs)."""
        prog = getattr(self, "progress", None)
        if prog is None:
            return 0
        need = design.num_ctas * 32
        ok = prog.dtype == self.torch.int32 and on_call_device(prog, self.device) and prog.numel() >= need
        require(ok, "progress",
                f"an int32 CUDA tensor with at least {need} elements (32 per CTA, {design.num_ctas} CTAs)",
                f"{prog.dtype} on {prog.device} with {prog.numel()} elements")
        return prog.data_ptr()

    def __call__(self, x, x_sf, topk_idx, topk_w, trace: bool = False, design=None, out=None):
        torch = self.torch
        T, x, x_sf, topk_idx, topk_w = self._checked_inputs(x, x_sf, topk_idx, topk_w, trace)
        design = design or self.design(T)
        self.last_design = design
        ws = self._workspace(design)
        y = output_tensor(torch, out, T, self.H, self.device)
        cap = 0
        if trace:
            cap = self.trace_cap_override or trace_capacity(design, self.I, self.H, design.num_ctas, fixed=8)
            tr, trc = record_buffers(self, design.num_ctas, cap)
        p = Params(**self._launch_fields(design, ws), num_tokens=T, timeout_ns=self.timeout_ns, trace_cap=cap,
                   fault_inject=self.fault_inject, clamp=self.clamp,
                   x=x.data_ptr(), x_sf=x_sf.data_ptr(), topk_idx=topk_idx.data_ptr(), topk_w=topk_w.data_ptr(),
                   y=y.data_ptr(), trace=tr.data_ptr() if trace else 0, trace_count=trc.data_ptr() if trace else 0,
                   progress=self._progress_ptr(design), combine_rows=T)
        stream = torch.cuda.current_stream(self.device).cuda_stream
        rc = self.lib.megamoe_sm90_launch(ctypes.byref(p), ctypes.c_void_p(stream))
        if rc != 0:
            raise KernelError(f"launch failed: {self.lib.megamoe_sm90_error_string(rc).decode()} (code {rc})")
        self._pending_check = True
        if trace:
            self._pending_trace = (tr, trc, cap)
            if trace == "device":  # records stay on the GPU until fetch_trace(): no sync here
                return y
            return y, self.fetch_trace()
        return y

    def capture(self, num_tokens: int, design=None) -> CallGraph:
        """A CUDA graph of one call with ``num_tokens`` tokens: no host work per replay (the
        serving loop's way to run small batches; ``benchmarks/kernel_bench.py`` times it).

        The graph reads its inputs from fixed tensors (``CallGraph.x`` float8_e4m3fn ``[T, H]``,
        ``x_sf`` uint8 ``[T, H/32]``, ``topk_idx`` int32 ``[T, k]``, ``topk_weights`` float32
        ``[T, k]``; filled with :meth:`CallGraph.fill` or in place) and writes ``CallGraph.y``
        (BF16 ``[T, H]``). One eager call with every slot masked runs first (the workspace and the
        launch set-up, shared-memory size and TMA descriptors, are not capturable). Replays and
        eager calls share the workspace: run them on one stream. The graph keeps its workspace
        alive; an error of a replay surfaces through :meth:`CallGraph.check`.

        Raises:
            InputError: ``num_tokens`` not an integer in ``[1, max_tokens]``.
        """
        torch = self.torch
        require(is_int(num_tokens) and 1 <= num_tokens <= self.max_tokens, "num_tokens",
                f"an integer in [1, {self.max_tokens}]", num_tokens)
        T, dev = int(num_tokens), self.device
        x = torch.zeros(T, self.H, dtype=torch.float8_e4m3fn, device=dev)
        x_sf = torch.full((T, self.H // 32), 127, dtype=torch.uint8, device=dev)  # UE8M0 1.0
        idx = torch.full((T, self.K), -1, dtype=torch.int32, device=dev)
        topk_w = torch.zeros(T, self.K, dtype=torch.float32, device=dev)
        y = torch.empty(T, self.H, dtype=torch.bfloat16, device=dev)
        design = design or self.design(T)
        self(x, x_sf, idx, topk_w, design=design, out=y)
        self.check()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.device(dev), torch.cuda.graph(graph, capture_error_mode="thread_local"):
            self(x, x_sf, idx, topk_w, design=design, out=y)
        return CallGraph(graph, x, x_sf, idx, topk_w, y, self, self._ws)

    def _fill(self, g: CallGraph, x, x_sf, topk_idx, topk_w) -> None:
        """Copy one call's inputs (checked as an eager call checks them) into ``g``'s tensors."""
        _, x, x_sf, topk_idx, topk_w = self._checked_inputs(x, x_sf, topk_idx, topk_w, False)
        for dst, src in ((g.x.view(self.torch.uint8), x), (g.x_sf, x_sf), (g.topk_idx, topk_idx),
                         (g.topk_weights, topk_w)):
            if src.data_ptr() != dst.data_ptr():
                dst.copy_(src)

    def fetch_trace(self) -> list[dict]:
        """Synchronize, check, and decode the records of the last ``trace=True`` or
        ``trace="device"`` call (the shared trace schema, see :mod:`megamoe.kernel.trace`).

        Raises:
            KernelError: the launch reported an error.
            InputError: no traced call is pending.
        """
        return fetch_records(self)

    def check(self, workspace=None):
        """Synchronize and raise :class:`KernelError` if the last launch reported an error (the
        launches of ``workspace``, default the last eager call's: :meth:`CallGraph.check` passes
        its own), then zero that workspace's counters so that the next call can run."""
        ws = self._ws if workspace is None else workspace
        self.torch.cuda.synchronize(self.device)
        err = ws["error"].cpu().numpy().astype(np.uint32)
        if err[0] != 0:
            self._reset_workspace(ws)
            raise KernelError(format_error(err, self.timeout_ns))

    def forget_pool_rows(self) -> None:
        """Mark every pool row unfilled (``pool_token`` and ``pool_slot`` -1, as at allocation):
        a call fills only the rows it routes, and rows of earlier calls otherwise stay in the
        pool, where a reader that matches rows by (token, slot), e.g.
        :func:`megamoe.kernel.check.l2_pool_agreement`, would find them. The kernel never reads
        these two arrays. No-op before the first call (nothing allocated yet)."""
        if "pool_token" in self._ws:
            self._ws["pool_token"].fill_(-1)
            self._ws["pool_slot"].fill_(-1)

    def scramble_pool_data(self, seed: int = 0) -> None:
        """Seeded random bytes into the pool data buffers (:data:`POOL_DATA_FIELDS`: FP8 rows,
        UE8M0 bytes, FP32 scales), as memory reused from other tensors may hold (NaN, 2^100). A
        call writes only the rows it routes, so afterwards the rows past a block's valid ones
        hold such bytes: for tests and A/Bs that a call's outputs and time do not depend on
        them (kernel v8.2, benchmarks/NOTES_kernel.md). The token / slot / weight arrays and the
        barriers are left alone. No-op before the first call (nothing allocated yet)."""
        torch = self.torch
        if "l1_pool" not in self._ws:
            return
        gen = torch.Generator(device=self._ws["l1_pool"].device).manual_seed(seed)
        for f in POOL_DATA_FIELDS:
            b = self._ws[f].view(torch.uint8)
            b.copy_(torch.randint(0, 256, b.shape, dtype=torch.uint8, device=b.device, generator=gen))

    def pool_contents(self):
        """(l1_pool rows, l1 scales [rows, H/32], token, slot) of the last call, for tests."""
        ws = self._ws
        R = self._ws_key[1]
        sf = ws["l1_pool_sf"].permute(1, 0, 2).reshape(R, self.H // 32)
        return ws["l1_pool"], sf, ws["pool_token"], ws["pool_slot"]


@dataclass
class CallGraph:
    """A captured kernel call (:meth:`MegaMoEKernel.capture`, and
    :meth:`megamoe.kernel.ep.MegaMoEKernelEP.capture` on every rank): ``fill(...)`` (or write
    ``x`` float8_e4m3fn ``[T, H]``, ``x_sf`` uint8 UE8M0 ``[T, H/32]``, ``topk_idx`` int32 ``[T, k]``
    with -1 masked, ``topk_weights`` float32 ``[T, k]`` in place), then ``replay()`` (EP: on every
    rank, as many times); the output is ``y`` (BF16 ``[T, H]``). Errors surface through
    :meth:`check`. ``workspace`` keeps the buffers the graph was captured with alive (EP: the
    kernel's own, allocated once)."""

    graph: object
    x: object
    x_sf: object
    topk_idx: object
    topk_weights: object
    y: object
    kernel: object
    workspace: object = None

    def fill(self, x, x_sf, topk_idx, topk_weights) -> None:
        """Copy one call's inputs into the graph's input tensors, checked as an eager call checks
        them (a one-line ``InputError``; the token count must be the captured one)."""
        require(x.shape[0] == self.x.shape[0], "x", f"{self.x.shape[0]} rows (the captured token count)",
                x.shape[0])
        self.kernel._fill(self, x, x_sf, topk_idx, topk_weights)

    def replay(self):
        """Launch the captured call on the current stream; returns ``y``."""
        self.graph.replay()
        return self.y

    def check(self) -> None:
        """Synchronize and raise ``KernelError`` if a replay reported an error (the kernel's
        ``check()`` on the workspace this graph was captured with)."""
        if self.workspace is None:
            self.kernel.check()
        else:
            self.kernel.check(self.workspace)


def design_from_plan(plan, rank: int = 0):
    """The kernel's launch numbers from a ``megamoe.plan.Plan`` built with
    ``design="megamoe-sm90"``: block_m, stages, experts per wave, SMs and CTAs per SM come from the plan;
    the pool holds at least the plan's capacity (rounded to block_m) and the kernel's own
    worst case for the plan's max tokens. Pass the result as ``design=`` to a kernel call."""
    rp = plan.ranks[rank]
    bm = rp.config.block_m
    require(bm in design_sm90.BLOCK_MS and rp.config.block_n == design_sm90.BLOCK_N, "plan",
            "a plan built with design='megamoe-sm90'", f"block_m={bm}, block_n={rp.config.block_n}")
    # the simulator's what-ifs, which the kernel is not built for
    require(rp.k_split == 1, "plan", "k_split 1 (split-K is a simulator what-if; the kernel has none)",
            f"k_split={rp.k_split}")
    require(not rp.combine_relay, "plan", "no combine relay (a simulator what-if; the kernel combines after "
            "its last barrier)", "combine_relay=True")
    step = design_sm90.kernel_wgmma_n_step(bm)
    require(rp.wgmma_n_step == step, "plan",
            f"the kernel's WGMMA N step at block_m {bm} ({'whole blocks' if step == bm else step}; "
            "another step is a simulator what-if)", f"wgmma_n_step={rp.wgmma_n_step}")
    max_t = getattr(plan, "max_tokens_per_rank", None) or max(r.num_tokens for r in plan.ranks)
    rows = design_sm90.pool_rows_for(max(max_t, 1), plan.top_k, plan.num_experts, bm, len(plan.ranks))
    used = int(rp.pool_block_offset[-1]) * bm
    rows = max(rows, -(-used // bm) * bm)
    return design_sm90.SM90Design(block_m=bm, block_n=design_sm90.BLOCK_N, block_k=design_sm90.BLOCK_K,
                                  num_stages=rp.num_stages, experts_per_wave=rp.experts_per_wave,
                                  num_sms=plan.num_sms, pool_rows=rows, ctas_per_sm=rp.ctas_per_sm,
                                  smem_bytes=design_sm90.smem_bytes(bm, rp.num_stages, plan.num_experts))
