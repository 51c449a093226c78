"""Fault: supports_args guards on the batch size above every declared case (declines more than 256 rows).

Every case the op declares has fewer rows, so comparing real inputs alone never sees the guard;
fake tensors with many rows and a symbolic batch do.
"""

from conformance_broken.base import good_rms_norm
from reference_impl import ir


def _supports(x, weight, epsilon, variance_size=None):
    return x.shape[0] <= 256    # the bug: decided by the batch dimension


@ir.ops.rms_norm.register_impl("broken", supports_args=_supports)
def rms_norm(x, weight, epsilon, variance_size=None):
    return good_rms_norm(x, weight, epsilon, variance_size)
