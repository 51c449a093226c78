"""Fault: supports_args guards on the batch size (rejects a single row)."""

from conformance_broken.base import good_rms_norm
from reference_impl import ir


def _supports(x, weight, epsilon, variance_size=None):
    return x.shape[0] > 1    # the bug: decided by the batch dimension


@ir.ops.rms_norm.register_impl("broken", supports_args=_supports)
def rms_norm(x, weight, epsilon, variance_size=None):
    return good_rms_norm(x, weight, epsilon, variance_size)
