"""Fault: supports_args returns an int instead of a Python bool."""

from conformance_broken.base import good_rms_norm
from reference_impl import ir


def _supports(x, weight, epsilon, variance_size=None):
    return x.shape[-1] % 4096 + 1    # the bug: truthy int, not bool


@ir.ops.rms_norm.register_impl("broken", supports_args=_supports)
def rms_norm(x, weight, epsilon, variance_size=None):
    return good_rms_norm(x, weight, epsilon, variance_size)
