"""Fault: right values in a column-major output, where the op's fake (what torch.compile traces with) is
row-major: a compiled graph would index the result with the wrong strides."""

from conformance_broken.base import good_rms_norm
from reference_impl import ir


@ir.ops.rms_norm.register_impl("broken")
def rms_norm(x, weight, epsilon, variance_size=None):
    out = good_rms_norm(x, weight, epsilon, variance_size)
    return out.mT.contiguous().mT
