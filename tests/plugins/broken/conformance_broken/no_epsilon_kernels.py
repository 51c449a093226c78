"""Fault: epsilon is left out of the root mean square (right wherever the mean square dwarfs epsilon)."""

import torch

from reference_impl import ir


@ir.ops.rms_norm.register_impl("broken")
def rms_norm(x, weight, epsilon, variance_size=None):
    x32 = x.to(torch.float32)
    stats = x32 if variance_size is None else x32[..., :variance_size]
    out = (x32 * torch.rsqrt(stats.square().mean(dim=-1, keepdim=True))).to(x.dtype)   # the bug: no + epsilon
    return out * weight if weight is not None else out
