"""Fault: a correct RMS norm that calls torch.manual_seed(0) (a kernel "making itself deterministic"): every seeded
request after it, and everything else drawing from the default generator, changes."""

import torch

from conformance_broken.base import good_rms_norm
from reference_impl import ir


@ir.ops.rms_norm.register_impl("broken")
def rms_norm(x, weight, epsilon, variance_size=None):
    torch.manual_seed(0)
    return good_rms_norm(x, weight, epsilon, variance_size)
