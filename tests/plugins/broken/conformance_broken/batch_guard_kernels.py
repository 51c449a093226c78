"""Fault: supports_args guards on the batch size with a small threshold (declines fewer than 4 rows).

Declining a single row would be fine (torch.compile specialises batch sizes 0 and 1); declining 2
or 3 rows is not: a graph compiled for a dynamic batch cannot hold both answers.
"""

from conformance_broken.base import good_rms_norm
from reference_impl import ir


def _supports(x, weight, epsilon, variance_size=None):
    return x.shape[0] >= 4    # the bug: decided by the batch dimension


@ir.ops.rms_norm.register_impl("broken", supports_args=_supports)
def rms_norm(x, weight, epsilon, variance_size=None):
    return good_rms_norm(x, weight, epsilon, variance_size)
