"""The plugin's implementation of vllm.ir.ops.rms_norm: float32 statistics, one rounding per step as native."""

import torch
from torch import Tensor

from vllm import ir


def supports(x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None) -> bool:
    """Floating inputs whose weight (if any) is floating too; any shape, layout and variance_size."""
    return x.is_floating_point() and (weight is None or weight.is_floating_point())


if "good_cpu" not in ir.ops.rms_norm.impls:
    @ir.ops.rms_norm.register_impl("good_cpu", supports_args=supports)
    def rms_norm(x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None) -> Tensor:
        wide = x.float()
        stats = wide if variance_size is None else wide[..., :variance_size]
        scaled = wide * torch.rsqrt((stats * stats).mean(dim=-1, keepdim=True) + epsilon)
        if weight is not None:
            scaled = scaled.to(weight.dtype) * weight
        return scaled.to(x.dtype)
