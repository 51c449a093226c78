"""Whether the Triton provider can run in this process, decided once at import.

Triton itself decides at kernel decoration time whether `@triton.jit` compiles for a GPU or runs
the interpreter (`TRITON_INTERPRET`), so the provider reads the same switch: it is supported when
triton imports and either a CUDA/ROCm device is present or the interpreter is on.
"""

from __future__ import annotations

import functools
import os

import torch


def _probe_triton() -> tuple[bool, str]:
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install raising anything else
        return False, f"triton cannot be imported ({type(exc).__name__}: {exc})"
    return True, ""


def _interpreting() -> bool:
    """Triton's own reading of TRITON_INTERPRET where available, else the plain '1' check."""
    try:
        import triton

        return bool(triton.knobs.runtime.interpret)
    except Exception:
        return os.environ.get("TRITON_INTERPRET") == "1"


HAS_TRITON, _IMPORT_PROBLEM = _probe_triton()
INTERPRET = HAS_TRITON and _interpreting()
HAS_GPU = torch.cuda.is_available()
SUPPORTED = HAS_TRITON and (INTERPRET or HAS_GPU)

if not HAS_TRITON:
    UNSUPPORTED_REASON = _IMPORT_PROBLEM
elif not SUPPORTED:
    UNSUPPORTED_REASON = "no CUDA/ROCm device and TRITON_INTERPRET is not set to 1"
else:
    UNSUPPORTED_REASON = ""

# Largest last dimension a row kernel keeps in one block (fp32 values held per program).
MAX_ROW_BLOCK = 32768


def require() -> None:
    """Raise a clear error when a triton implementation is called directly but cannot run here."""
    if not SUPPORTED:
        raise RuntimeError(f"the triton provider cannot run in this process: {UNSUPPORTED_REASON}")


def device_ok(t: torch.Tensor) -> bool:
    """Tensors must live on the GPU, except under the interpreter (which also takes CPU tensors)."""
    return INTERPRET or t.device.type == "cuda"


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


@functools.lru_cache(maxsize=None)
def hardware_fp8() -> bool:
    """Whether compiled kernels convert float32 to float8_e4m3fn in hardware: NVIDIA sm_89 and
    newer (cvt.rn.satfinite.e4m3x2.f32: nearest-even, NaN kept). Never under the interpreter,
    whose float8 conversion mis-rounds; there the kernels round with integer arithmetic."""
    if INTERPRET or not HAS_TRITON:
        return False
    try:
        from triton.runtime import driver

        target = driver.active.get_current_target()
    except Exception:  # no GPU driver: nothing is launched either
        return False
    return target.backend == "cuda" and int(target.arch) >= 89
