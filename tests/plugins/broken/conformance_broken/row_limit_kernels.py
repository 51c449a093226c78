"""Fault: an RMS norm whose launch covers at most 4,096 rows: a grid sized for a maximum batch (or capped by a
launch limit) leaves every row past it as the output buffer was allocated, zero. Correct on every case up to
4,096 rows; the cases just past the common row limits (reference_impl.ir.size_cases) catch it."""

import torch

from conformance_broken.base import good_rms_norm
from reference_impl import ir

MAX_ROWS = 4096


@ir.ops.rms_norm.register_impl("broken")
def rms_norm(x, weight, epsilon, variance_size=None):
    rows = x.reshape(-1, x.shape[-1])
    out = torch.zeros(rows.shape, dtype=x.dtype, device=x.device)
    out[:MAX_ROWS] = good_rms_norm(rows[:MAX_ROWS], weight, epsilon, variance_size)   # the bug: a fixed row count
    return out.reshape(x.shape)
