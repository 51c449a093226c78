"""Fault: returns float32 whatever the input dtype."""

from conformance_broken.base import good_rms_norm
from reference_impl import ir


@ir.ops.rms_norm.register_impl("broken")
def rms_norm(x, weight, epsilon, variance_size=None):
    w = weight.float() if weight is not None else None
    return good_rms_norm(x.float(), w, epsilon, variance_size)
