"""Which compiled kernel path a CUDA device gets: one table, arch -> library and C entry points.

A device's compute capability picks the arch (:func:`megamoe.kernel.build.arch_for_capability`:
9.x -> ``sm_90a``, 10.0 -> ``sm_100a``); :data:`PATHS` maps the arch to everything the runtime
needs to load that arch's library (``megamoe.kernel.build.LIBNAMES``): the ``extern "C"`` entry
points with their ctypes signatures, the ctypes mirror of the C parameter struct (checked
against the library's ``<prefix>_abi_size()`` when it is loaded), whether
:class:`megamoe.kernel.MegaMoEKernel` can launch it and what about it was never verified.
:func:`megamoe.kernel.runtime.load_library` binds a library from this table;
:class:`~megamoe.kernel.MegaMoEKernel` selects through :func:`path_for_device`.

* ``sm_90a`` (H100/H200): ``megamoe_sm90_*`` with ``megamoe.kernel.runtime.Params``
  (``csrc/megamoe/params.h``); launched by ``MegaMoEKernel`` (EP=1) and ``MegaMoEKernelEP``.
* ``sm_100a`` (B200): ``megamoe_sm100_*`` with ``megamoe.design_sm100.params_type()`` (the
  ``Sm100Params`` of ``csrc/megamoe/kernel_sm100.cu``: ``Params`` + block_k, pull_bytes,
  sf_pool_rows, reserved). The library builds and its entry points bind without a GPU;
  ``MegaMoEKernel`` launches it through :class:`megamoe.kernel.sm100.MegaMoEKernelSm100`
  (launch numbers, SM100 weight layout, workspace, ``Sm100Params``, ``megamoe_sm100_launch``).
  **The kernel has never executed** (:data:`SM100_UNVERIFIED`): no SM100 GPU was available;
  only GPU-free checks of the launch exist.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import InputError
from .build import KernelBuildError, arch_for_capability

_c = ctypes
#: What was never verified about the SM100 path (the text of the warning
#: :class:`megamoe.kernel.sm100.UnverifiedKernelWarning` that constructing it emits).
SM100_UNVERIFIED = (
    "the SM100 (sm_100a) MegaMoE kernel has NEVER EXECUTED: no SM100 GPU was available to this "
    "project, so its correctness and speed are unverified. Verified without a GPU only: it "
    "compiles (no spills), its SASS holds the tcgen05/TMEM instructions, and the Python launch "
    "(plan numbers, SM100 weight layout, workspace sizes, every Sm100Params field, the "
    "megamoe_sm100_launch call) is checked against the plan and the kernel source; see "
    "docs/kernel.md, 'SM100 path'")


@dataclass(frozen=True)
class KernelPath:
    """One compiled kernel path: the arch it is built for and its C ABI.

    Attributes:
        arch: build arch (``megamoe.kernel.build.SOURCES`` key).
        capability: compute capabilities it runs on, as text (``arch_for_capability``'s rule).
        gpu: the GPUs meant, for messages.
        prefix: entry-point prefix (``megamoe_sm90``): ``<prefix>_launch``, ``<prefix>_abi_size``...
        params: ctypes mirror of the C parameter struct the launch entry point takes.
        entries: required ``extern "C"`` symbol -> (argtypes or None to leave unset, restype).
        optional: symbols bound only if the library has them (older builds).
        launch_missing: None if ``MegaMoEKernel`` launches this path, else what is missing.
        unverified: None if the path has run on its GPU, else what was never verified.
    """
    arch: str
    capability: str
    gpu: str
    prefix: str
    params: Callable[[], type]
    entries: dict = field(default_factory=dict)
    optional: dict = field(default_factory=dict)
    launch_missing: str | None = None
    unverified: str | None = None

    @property
    def params_type(self) -> type:
        return self.params()

    def symbol(self, suffix: str) -> str:
        return f"{self.prefix}_{suffix}"

    def bind(self, lib) -> None:
        """Set argtypes/restype of every entry point of this path on a loaded ``ctypes.CDLL``.

        Raises:
            AttributeError: a required entry point is missing from the library.
        """
        for table, required in ((self.entries, True), (self.optional, False)):
            for name, (args, res) in table.items():
                if not required and not hasattr(lib, name):
                    continue
                f = getattr(lib, name)
                if args is not None:
                    f.argtypes = args(self) if callable(args) else list(args)
                f.restype = res


def _sm90_params() -> type:
    from .runtime import Params
    return Params


@functools.cache
def _sm100_params() -> type:
    from ..design_sm100 import params_type
    return params_type()


def _launch_args(path: KernelPath) -> list:
    return [_c.POINTER(path.params_type), _c.c_void_p]


PATHS: dict[str, KernelPath] = {
    "sm_90a": KernelPath(
        arch="sm_90a", capability="9.x", gpu="H100/H200", prefix="megamoe_sm90", params=_sm90_params,
        entries={
            "megamoe_sm90_launch": (_launch_args, _c.c_int),
            "megamoe_sm90_smem_bytes": ([_c.c_int, _c.c_int, _c.c_int], _c.c_longlong),
            "megamoe_sm90_wgmmas_in_flight": ([_c.c_int], _c.c_int),
            "megamoe_sm90_producer_warps": ([_c.c_int], _c.c_int),
            "megamoe_sm90_role_registers": ([_c.c_int], _c.c_int),
            "megamoe_sm90_error_string": ([_c.c_int], _c.c_char_p),
            "megamoe_sm90_abi_size": (None, _c.c_int),
        },
        optional={
            "megamoe_sm90_preload": ([], _c.c_int),
            "megamoe_sm90_l1_x_fold_k": ([_c.c_int], _c.c_int),  # (v7.6 on)
            "megamoe_sm90_combine_slots": ([_c.c_int], _c.c_int),  # (v8.0 on)
            "megamoe_sm90_relay_release": ([_c.c_int], _c.c_int),  # (v8.1 on)
            "megamoe_sm90_wide_walk": ([_c.c_int, _c.c_int], _c.c_int),  # (v8.7 on)
            "megamoe_sm90_combine_slots_wide": ([], _c.c_int),  # (v8.8 on)
            "megamoe_sm90_local_count": ([_c.c_int, _c.c_int, _c.c_int], _c.c_int),  # (v8.9 on)
            "megamoe_sm90_walk_in_epilogue": ([_c.c_int], _c.c_int),  # (v9.0 on)
            "megamoe_sm90_block_descriptors": ([_c.c_int], _c.c_int),  # (v9.1 on)
            "megamoe_sm90_role_registers_at": ([_c.c_int, _c.c_int], _c.c_int),  # (v9.2 on)
            "megamoe_sm90_wgmma_n_step": ([_c.c_int], _c.c_int),  # (v9.12 on)
            "megamoe_sm90_untraced_instance": ([_c.c_int], _c.c_int),  # (v9.13 on)
            "megamoe_sm90_block_tickets": ([_c.c_int], _c.c_int),  # (v9.3 on)
            "megamoe_sm90_first_fill": ([_c.c_int, _c.c_int], _c.c_int),  # (v9.8 on)
            "megamoe_ipc_malloc": ([_c.POINTER(_c.c_void_p), _c.c_ulonglong, _c.c_int], _c.c_int),
            "megamoe_ipc_handle": ([_c.c_void_p, _c.c_void_p], _c.c_int),
            "megamoe_ipc_open": ([_c.c_void_p, _c.POINTER(_c.c_void_p), _c.c_int], _c.c_int),
        }),
    "sm_100a": KernelPath(
        arch="sm_100a", capability="10.0", gpu="B200", prefix="megamoe_sm100", params=_sm100_params,
        entries={
            "megamoe_sm100_launch": (_launch_args, _c.c_int),
            "megamoe_sm100_abi_size": ([], _c.c_int),
            "megamoe_sm100_stage_bytes": ([_c.c_int, _c.c_int], _c.c_longlong),
            "megamoe_sm100_smem_bytes": ([_c.c_int] * 4, _c.c_longlong),
            "megamoe_sm100_tmem_cols": ([_c.c_int, _c.c_int], _c.c_int),
            "megamoe_sm100_check_config": ([_c.c_int] * 7 + [_c.c_longlong, _c.c_int, _c.c_int], _c.c_int),
            "megamoe_sm100_error_string": ([_c.c_int], _c.c_char_p),
        },
        unverified=SM100_UNVERIFIED),
}


def supported() -> str:
    """``"9.x (sm_90a, H100/H200) or 10.0 (sm_100a, B200)"``."""
    return " or ".join(f"{p.capability} ({p.arch}, {p.gpu})" for p in PATHS.values())


def select_path(major: int, minor: int) -> KernelPath:
    """The kernel path for compute capability ``major.minor``.

    Raises:
        InputError: no kernel for that capability (one line naming it and what is supported).
    """
    try:
        arch = arch_for_capability(major, minor)
    except KernelBuildError:
        raise InputError("device.compute_capability", supported(), f"{major}.{minor}") from None
    return PATHS[arch]


def device_capability(device=None) -> tuple[int, int]:
    """``(major, minor)`` of a CUDA device (torch); tests replace this function.

    Raises:
        InputError: torch sees no CUDA device (a CPU-only torch, no GPU, or a bad index)."""
    import torch
    expected = f"a CUDA GPU visible to torch ({supported()})"
    if not torch.cuda.is_available():
        raise InputError("device", expected, f"none (torch {torch.__version__}, CUDA available: no)")
    try:
        return tuple(torch.cuda.get_device_capability(device))
    except (AssertionError, RuntimeError, ValueError) as e:
        raise InputError("device", expected,
                         f"{device} ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None


def path_for_device(device=None) -> KernelPath:
    """:func:`select_path` for a CUDA device's compute capability.

    Raises:
        InputError: no CUDA device, or no kernel for its compute capability."""
    major, minor = device_capability(device)
    return select_path(major, minor)
