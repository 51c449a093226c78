"""The demo's IR kernels: RMS norm computed in float32 over the variance slice; the fused form in place."""

import torch
from torch import Tensor

from reference_impl import ir

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _normalize(x32: Tensor, epsilon: float, variance_size: int | None) -> Tensor:
    stats = x32 if variance_size is None else x32[..., :variance_size]
    inv_rms = torch.rsqrt(stats.square().mean(dim=-1, keepdim=True) + epsilon)
    return x32 * inv_rms


def _weighted(normalized: Tensor, weight: Tensor | None, dtype: torch.dtype) -> Tensor:
    """vLLM 0.32: the normalized value cast to the weight's dtype, times the weight, cast to x's dtype."""
    return (normalized.to(weight.dtype) * weight if weight is not None else normalized).to(dtype)


def _floats(x, *rest) -> bool:
    return x.dtype in FLOAT_DTYPES


@ir.ops.rms_norm.register_impl("demo", supports_args=lambda x, weight, epsilon, variance_size=None: _floats(x))
def rms_norm(x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None) -> Tensor:
    return _weighted(_normalize(x.to(torch.float32), epsilon, variance_size), weight, x.dtype).contiguous()


@ir.ops.fused_add_rms_norm.register_impl(
    "demo", inplace=True,
    supports_args=lambda x, x_residual, weight, epsilon, variance_size=None: _floats(x))
def fused_add_rms_norm(x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float,
                       variance_size: int | None = None) -> tuple[Tensor, Tensor]:
    s = x.to(torch.float32) + x_residual.to(torch.float32)
    x_residual.copy_(s)
    x.copy_(_weighted(_normalize(s, epsilon, variance_size), weight, x.dtype))
    return x, x_residual
