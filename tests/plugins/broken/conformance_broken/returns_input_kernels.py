"""Fault: an inplace=False kernel that writes its result into the input and returns the input."""

from conformance_broken.base import good_rms_norm
from reference_impl import ir


@ir.ops.rms_norm.register_impl("broken")
def rms_norm(x, weight, epsilon, variance_size=None):
    x.copy_(good_rms_norm(x, weight, epsilon, variance_size))
    return x
