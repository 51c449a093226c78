"""Fault: an in-place fused_add_rms_norm that also writes its weight (a non-activation argument)."""

import torch

from conformance_broken.base import good_rms_norm
from reference_impl import ir


@ir.ops.fused_add_rms_norm.register_impl("broken", inplace=True)
def fused_add_rms_norm(x, x_residual, weight, epsilon, variance_size=None):
    s = x.to(torch.float32) + x_residual.to(torch.float32)
    x_residual.copy_(s)
    x.copy_(good_rms_norm(s, None, epsilon, variance_size).to(x.dtype))
    if weight is not None:
        x.mul_(weight)
        weight.add_(1.0)    # the bug: scratch written into the weight
    return x, x_residual
