"""Fault: ignores strides (reads the input's storage as if it were contiguous)."""

import torch

from conformance_broken.base import good_rms_norm
from reference_impl import ir


@ir.ops.rms_norm.register_impl("broken")
def rms_norm(x, weight, epsilon, variance_size=None):
    dense = torch.as_strided(x, x.shape, torch.empty(x.shape).stride(), x.storage_offset())
    return good_rms_norm(dense, weight, epsilon, variance_size)
