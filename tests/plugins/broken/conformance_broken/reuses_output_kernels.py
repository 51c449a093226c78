"""Fault: an RMS norm that writes every result into one output buffer per shape and returns that buffer,
so a result the caller keeps is overwritten by the next call of the same shape."""

import torch

from conformance_broken.base import good_rms_norm
from reference_impl import ir

_BUFFERS = {}


@ir.ops.rms_norm.register_impl("broken")
def rms_norm(x, weight, epsilon, variance_size=None):
    out = _BUFFERS.setdefault((tuple(x.shape), x.dtype), torch.empty(x.shape, dtype=x.dtype, device=x.device))
    out.copy_(good_rms_norm(x, weight, epsilon, variance_size))
    return out    # the bug: the same buffer for every call of this shape
