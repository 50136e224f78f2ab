"""Python side of the compiled kernel in ``csrc/``: build, buffers, launch, trace decoding.

Public API::

    from megamoe.kernel import build, MegaMoEKernel, prepare_weights, decode_trace

    lib = build(arch="sm_90a")                 # nvcc, cached; works without a GPU
    k = MegaMoEKernel(num_experts=256, topk=6, hidden=4096, inter=2048,
                      max_tokens=8192, weights=prepare_weights(w1, w1_sf, w2, w2_sf))
    y = k(x_fp8, x_sf, topk_idx, topk_weights)            # BF16 [T, H]
    y, trace = k(x_fp8, x_sf, topk_idx, topk_weights, trace=True)

The loader is ctypes over a plain shared library (C ABI, ``csrc/megamoe/params.h``), not a
torch extension: the library has no torch ABI dependency (the failure mode that stops
sgl-deep-gemm on the GPU machines here), builds ahead of time with nvcc alone on a machine
without a GPU, and loads in any torch process.
"""

from .build import build, BuildResult, KernelBuildError, library_path
from .runtime import MegaMoEKernel, KernelError, prepare_weights, cuda_available, design_from_plan
from .trace import decode_trace, TRACE_ROLES, TRACE_KINDS

__all__ = ["build", "BuildResult", "KernelBuildError", "library_path", "MegaMoEKernel", "KernelError",
           "prepare_weights", "cuda_available", "design_from_plan", "decode_trace", "TRACE_ROLES", "TRACE_KINDS"]
from .ep import LocalGroup, MegaMoEKernelEP  # noqa: E402,F401
