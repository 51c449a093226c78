"""Fault: wrong numerics on odd hidden sizes (the mean skips the last element)."""

import torch

from conformance_broken.base import weighted
from reference_impl import ir


@ir.ops.rms_norm.register_impl("broken")
def rms_norm(x, weight, epsilon, variance_size=None):
    x32 = x.to(torch.float32)
    stats = x32 if variance_size is None else x32[..., :variance_size]
    if stats.shape[-1] % 2 == 1 and stats.shape[-1] > 1:
        stats = stats[..., :-1]    # the bug: a vector loop that drops the odd tail
    return weighted(x32 * torch.rsqrt(stats.square().mean(dim=-1, keepdim=True) + epsilon), weight, x.dtype)
