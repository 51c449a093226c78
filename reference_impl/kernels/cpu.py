"""C++ CPU kernel providers ("cpp") for the built-in cpu platform.

Every op of the norm, activation, rotary and fp8-quant families gets a "cpp" implementation that
calls the `reference_cpu` torch library built from csrc/cpu/ (registration and `supports_args`
in `_cpp_provider`). Importing this module only registers: the library is compiled (once,
cached on disk, ~15-40 s on 2 cores) and loaded at the first kernel call, so importing the
platform stays cheap and a process that never calls a kernel never builds. `supported` is
decided here from the toolchain (a C++ compiler, ninja, the sources): without one the provider
is off, dispatch falls back to native, and `_cpp_build.load()` raises `CppKernelBuildError`
naming the missing piece.
"""

from __future__ import annotations

import logging

from reference_impl.kernels import _cpp_build
from reference_impl.kernels._cpp_provider import OPS, register_kernel_provider

logger = logging.getLogger(__name__)

PROVIDER = "cpp"

_problem = _cpp_build.toolchain_problem()
SUPPORTED = _problem is None
if not SUPPORTED:
    (logger.info if _cpp_build.DISABLE_ENV in _problem else logger.warning)(
        "reference C++ CPU kernels are off (%s); IR ops use their next provider", _problem)

CHECKS = register_kernel_provider(PROVIDER, supported=SUPPORTED, library=_cpp_build.ops, device_type="cpu")


def default_priority() -> dict[str, list[str]]:
    """The cpu platform's IR priority: the C++ kernel first, native as the fallback."""
    return {op: [PROVIDER, "native"] for op in OPS}


__all__ = ["PROVIDER", "SUPPORTED", "OPS", "default_priority"]
