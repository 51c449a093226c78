"""Fault: rms_norm leaves epsilon out of the root mean square.

Harmless at ordinary magnitudes (epsilon is tiny next to mean(x^2)); at tiny magnitudes, where
epsilon dominates, the result is off by orders of magnitude. Loosening the tolerance is not the fix.
"""

import torch

from conformance_broken.base import weighted
from reference_impl import ir


@ir.ops.rms_norm.register_impl("broken")
def rms_norm(x, weight, epsilon, variance_size=None):
    x32 = x.to(torch.float32)
    stats = x32 if variance_size is None else x32[..., :variance_size]
    return weighted(x32 * torch.rsqrt(stats.square().mean(dim=-1, keepdim=True)), weight, x.dtype)  # the bug: no epsilon
