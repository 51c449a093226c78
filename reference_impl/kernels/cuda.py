"""CUDA kernel providers ("cuda") for the built-in CUDA platform.

Registers a "cuda" implementation of every op of the norm, activation, rotary and fp8-quant
families, calling the `reference_cuda` torch library (csrc/cuda/: plain-pointer .cu kernels and a
torch binding). `supported` is True only when torch has CUDA, a GPU is present and the library
built and loaded; that build happens here, at import, which only the CUDA platform does
(`CudaPlatform.import_ir_kernels`). Anywhere else (the CPU wheel, no GPU, no nvcc, a failed
build) the provider is registered with supported=False and the reason is logged, so dispatch
uses the next provider. The .cu sources are compile-checked without a GPU by
`python -m reference_impl.kernels._build_cuda` (tests/kernels/test_cuda_build.py).
"""

from __future__ import annotations

import logging

from reference_impl import ir
from reference_impl.kernels import _build_cuda
from reference_impl.kernels._cpp_provider import OPS, register_kernel_provider

logger = logging.getLogger(__name__)

PROVIDER = "cuda"


def _prepare() -> str | None:
    """Build and load the library where it can run; the reason it cannot, or None."""
    problem = _build_cuda.runtime_problem()
    if problem is not None:
        return problem
    try:
        _build_cuda.load()
    except Exception as exc:  # a compiler error must not break platform import
        return f"building the CUDA kernels failed: {exc}"
    return None


UNSUPPORTED_REASON = _prepare()
SUPPORTED = UNSUPPORTED_REASON is None
if not SUPPORTED:
    # Expected without CUDA (info); a failed build where CUDA exists deserves a warning.
    (logger.warning if _build_cuda.runtime_problem() is None else logger.info)(
        "reference CUDA kernels are off (%s); IR ops use their next provider", UNSUPPORTED_REASON)

CHECKS = register_kernel_provider(PROVIDER, supported=SUPPORTED, library=_build_cuda.ops, device_type="cuda")


def default_priority() -> dict[str, list[str]]:
    """The CUDA platform's IR priority: CUDA kernel, then Triton where registered, then native."""
    priority = {}
    for op in OPS:
        order = [PROVIDER]
        if "triton" in getattr(ir.ops, op).impls:
            order.append("triton")
        priority[op] = order + ["native"]
    return priority


__all__ = ["PROVIDER", "SUPPORTED", "UNSUPPORTED_REASON", "OPS", "default_priority"]
