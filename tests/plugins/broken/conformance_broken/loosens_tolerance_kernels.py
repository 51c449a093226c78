"""Fault: rms_norm is off by 2e-3 everywhere, and the plugin loosens the float32 tolerance it is judged against
(`override_tolerance` while its kernels are imported) so that it passes. Allowed, but never silent."""

import torch

from conformance_broken.base import good_rms_norm
from reference_impl import ir

ir.ops.rms_norm.override_tolerance(torch.float32, atol=1e-2, rtol=1e-2)


@ir.ops.rms_norm.register_impl("broken")
def rms_norm(x, weight, epsilon, variance_size=None):
    return good_rms_norm(x, weight, epsilon, variance_size) + 2e-3
