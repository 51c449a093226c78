"""C++ CPU kernel providers ("cpp") for the built-in cpu platform.

Every op of the norm, activation, rotary and fp8-quant families gets a "cpp" implementation that
calls the `reference_cpu` torch library built from csrc/cpu/. Importing this module only
registers; the library is compiled (once, cached on disk) and loaded at the first kernel call,
so importing the platform stays cheap. `supported` is decided at import from the toolchain
(a C++ compiler, ninja, the sources): without one the provider is off and dispatch falls back
to native; `_cpp_build.load()` raises `CppKernelBuildError` naming the missing piece.

`supports_args` decides from static properties only (dtypes, devices, last-dim contiguity,
argument values, sizes of non-batch dims) and declines what the kernels do not handle, so those
calls go to native: a non-contiguous last dim, mixed dtypes, broadcasting weights or scales.
Leading (row) dims may have any strides.
"""

from __future__ import annotations

import logging

import torch
from torch import Tensor

from reference_impl import ir
from reference_impl.kernels import _cpp_build

logger = logging.getLogger(__name__)

PROVIDER = "cpp"
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_MAX_DIMS = 9  # at most 8 leading (row) dims after merging; see csrc/cpu/kernels.h

_problem = _cpp_build.toolchain_problem()
SUPPORTED = _problem is None
if not SUPPORTED:
    (logger.info if _cpp_build.DISABLE_ENV in _problem else logger.warning)(
        "reference C++ CPU kernels are off (%s); IR ops use their next provider", _problem)

_ops = _cpp_build.ops


# ----- supports_args helpers --------------------------------------------------------------------
def _rows_ok(x) -> bool:
    """A CPU float tensor of 1..9 dims whose last dim is contiguous (rows may be strided)."""
    return (isinstance(x, Tensor) and x.dtype in DTYPES and x.device.type == "cpu"
            and 1 <= x.dim() <= _MAX_DIMS and x.stride(-1) == 1)


def _writable(x) -> bool:
    """In-place targets must not overlap themselves (no stride-0 dims)."""
    return all(s != 0 for s in x.stride())


def _weight_ok(weight, x) -> bool:
    return weight is None or (isinstance(weight, Tensor) and weight.dtype == x.dtype
                              and weight.device == x.device and weight.dim() == 1
                              and weight.shape[0] == x.shape[-1] and weight.stride(0) == 1)


def _even_last(x) -> bool:
    return _rows_ok(x) and x.shape[-1] % 2 == 0


# ----- norms ------------------------------------------------------------------------------------
def _rms_norm_ok(x, weight, epsilon, variance_size=None) -> bool:
    return _rows_ok(x) and _weight_ok(weight, x)


@ir.ops.rms_norm.register_impl(PROVIDER, supported=SUPPORTED, supports_args=_rms_norm_ok)
def rms_norm(x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None) -> Tensor:
    return _ops().rms_norm(x, weight, epsilon, variance_size)


def _fused_add_ok(x, x_residual, weight, epsilon, variance_size=None) -> bool:
    return (_rows_ok(x) and _rows_ok(x_residual) and x_residual.dtype == x.dtype
            and x_residual.dim() == x.dim() and x_residual.shape[-1] == x.shape[-1]
            and _writable(x) and _writable(x_residual) and _weight_ok(weight, x))


@ir.ops.fused_add_rms_norm.register_impl(PROVIDER, supported=SUPPORTED, supports_args=_fused_add_ok,
                                         inplace=True)
def fused_add_rms_norm(x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float,
                       variance_size: int | None = None) -> tuple[Tensor, Tensor]:
    _ops().fused_add_rms_norm(x, x_residual, weight, epsilon, variance_size)
    return x, x_residual


# ----- activations ------------------------------------------------------------------------------
def _gated_ok(x, *params) -> bool:
    return _even_last(x)


@ir.ops.silu_and_mul.register_impl(PROVIDER, supported=SUPPORTED, supports_args=_gated_ok)
def silu_and_mul(x: Tensor) -> Tensor:
    return _ops().silu_and_mul(x)


@ir.ops.mul_and_silu.register_impl(PROVIDER, supported=SUPPORTED, supports_args=_gated_ok)
def mul_and_silu(x: Tensor) -> Tensor:
    return _ops().mul_and_silu(x)


def _gelu_and_mul_ok(x, approximate="none") -> bool:
    return _even_last(x) and approximate in ("none", "tanh")


@ir.ops.gelu_and_mul.register_impl(PROVIDER, supported=SUPPORTED, supports_args=_gelu_and_mul_ok)
def gelu_and_mul(x: Tensor, approximate: str = "none") -> Tensor:
    return _ops().gelu_and_mul(x, approximate)


@ir.ops.fatrelu_and_mul.register_impl(PROVIDER, supported=SUPPORTED, supports_args=_gated_ok)
def fatrelu_and_mul(x: Tensor, threshold: float = 0.0) -> Tensor:
    return _ops().fatrelu_and_mul(x, threshold)


@ir.ops.swigluoai_and_mul.register_impl(PROVIDER, supported=SUPPORTED, supports_args=_gated_ok)
def swigluoai_and_mul(x: Tensor, alpha: float = 1.702, limit: float = 7.0) -> Tensor:
    return _ops().swigluoai_and_mul(x, alpha, limit)


def _unary_ok(x) -> bool:
    return _rows_ok(x)


@ir.ops.gelu_new.register_impl(PROVIDER, supported=SUPPORTED, supports_args=_unary_ok)
def gelu_new(x: Tensor) -> Tensor:
    return _ops().gelu_new(x)


@ir.ops.gelu_fast.register_impl(PROVIDER, supported=SUPPORTED, supports_args=_unary_ok)
def gelu_fast(x: Tensor) -> Tensor:
    return _ops().gelu_fast(x)


@ir.ops.quick_gelu.register_impl(PROVIDER, supported=SUPPORTED, supports_args=_unary_ok)
def quick_gelu(x: Tensor) -> Tensor:
    return _ops().quick_gelu(x)


@ir.ops.relu2.register_impl(PROVIDER, supported=SUPPORTED, supports_args=_unary_ok)
def relu2(x: Tensor) -> Tensor:
    return _ops().relu2(x)


# ----- rotary -----------------------------------------------------------------------------------
def _heads_ok(x, head_size) -> bool:
    return _rows_ok(x) and _writable(x) and x.shape[-1] % head_size == 0


def _rope_common_ok(positions, x_query, head_size, cos_sin_cache) -> bool:
    if not (isinstance(head_size, int) and head_size > 0 and isinstance(positions, Tensor)
            and positions.dtype in (torch.int64, torch.int32) and positions.device.type == "cpu"
            and isinstance(cos_sin_cache, Tensor) and cos_sin_cache.dim() == 2
            and cos_sin_cache.device.type == "cpu" and cos_sin_cache.stride(-1) == 1):
        return False
    rot = cos_sin_cache.shape[-1]
    return (_heads_ok(x_query, head_size) and cos_sin_cache.dtype in (x_query.dtype, torch.float32)
            and rot % 2 == 0 and rot <= head_size)


def _rope_ok(positions, x_query, x_key, head_size, cos_sin_cache, is_neox_style) -> bool:
    return (_rope_common_ok(positions, x_query, head_size, cos_sin_cache)
            and _heads_ok(x_key, head_size) and x_key.dtype == x_query.dtype)


@ir.ops.rotary_embedding.register_impl(PROVIDER, supported=SUPPORTED, supports_args=_rope_ok,
                                       inplace=True)
def rotary_embedding(positions: Tensor, x_query: Tensor, x_key: Tensor, head_size: int,
                     cos_sin_cache: Tensor, is_neox_style: bool) -> tuple[Tensor, Tensor]:
    _ops().rotary_embedding(positions, x_query, x_key, head_size, cos_sin_cache, is_neox_style)
    return x_query, x_key


def _rope_query_ok(positions, x_query, head_size, cos_sin_cache, is_neox_style) -> bool:
    return _rope_common_ok(positions, x_query, head_size, cos_sin_cache)


@ir.ops.rotary_embedding_query.register_impl(PROVIDER, supported=SUPPORTED,
                                             supports_args=_rope_query_ok, inplace=True)
def rotary_embedding_query(positions: Tensor, x_query: Tensor, head_size: int, cos_sin_cache: Tensor,
                           is_neox_style: bool) -> Tensor:
    _ops().rotary_embedding(positions, x_query, None, head_size, cos_sin_cache, is_neox_style)
    return x_query


# ----- fp8 quantization -------------------------------------------------------------------------
def _static_quant_ok(x, scale) -> bool:
    if not (_rows_ok(x) and isinstance(scale, Tensor) and scale.is_floating_point()
            and scale.device.type == "cpu" and scale.dim() <= x.dim()):
        return False
    groups = scale.shape[-1] if scale.dim() >= 1 else 1
    return groups >= 1 and x.shape[-1] % groups == 0


@ir.ops.static_quant_fp8.register_impl(PROVIDER, supported=SUPPORTED, supports_args=_static_quant_ok)
def static_quant_fp8(x: Tensor, scale: Tensor) -> Tensor:
    return _ops().static_quant_fp8(x, scale)


def _dynamic_quant_ok(x, per_token, scale_ub=None) -> bool:
    return (_rows_ok(x) and isinstance(per_token, bool)
            and (scale_ub is None or (isinstance(scale_ub, Tensor) and scale_ub.is_floating_point()
                                      and scale_ub.device.type == "cpu" and scale_ub.dim() <= 1
                                      and scale_ub.numel() == 1)))


@ir.ops.dynamic_quant_fp8.register_impl(PROVIDER, supported=SUPPORTED, supports_args=_dynamic_quant_ok)
def dynamic_quant_fp8(x: Tensor, per_token: bool, scale_ub: Tensor | None = None) -> tuple[Tensor, Tensor]:
    return _ops().dynamic_quant_fp8(x, per_token, scale_ub)


def _group_quant_ok(x, group_size) -> bool:
    return (_rows_ok(x) and isinstance(group_size, int) and group_size > 0
            and x.shape[-1] % group_size == 0)


@ir.ops.dynamic_group_quant_fp8.register_impl(PROVIDER, supported=SUPPORTED,
                                              supports_args=_group_quant_ok)
def dynamic_group_quant_fp8(x: Tensor, group_size: int) -> tuple[Tensor, Tensor]:
    return _ops().dynamic_group_quant_fp8(x, group_size)


OPS = ("rms_norm", "fused_add_rms_norm", "silu_and_mul", "mul_and_silu", "gelu_and_mul",
       "fatrelu_and_mul", "swigluoai_and_mul", "gelu_new", "gelu_fast", "quick_gelu", "relu2",
       "rotary_embedding", "rotary_embedding_query", "static_quant_fp8", "dynamic_quant_fp8",
       "dynamic_group_quant_fp8")


def default_priority() -> dict[str, list[str]]:
    """The cpu platform's IR priority: the C++ kernel first, native as the fallback."""
    return {op: [PROVIDER, "native"] for op in OPS}
