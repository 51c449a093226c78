"""Fault: an inplace=False kernel that scribbles on its input (uses x as scratch) in the functional path."""

from conformance_broken.base import good_rms_norm
from reference_impl import ir


@ir.ops.rms_norm.register_impl("broken")
def rms_norm(x, weight, epsilon, variance_size=None):
    out = good_rms_norm(x, weight, epsilon, variance_size)
    x.mul_(0.5)    # the bug: the input buffer reused as scratch
    return out
