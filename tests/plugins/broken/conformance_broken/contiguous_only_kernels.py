"""Not a fault (a control): supports_args declines non-contiguous inputs with `x.is_contiguous()`.

A one-row tensor is contiguous whatever its row stride, so the answer differs between 1 row and
more; torch.compile specialises a batch of 1, so that difference is allowed and the dispatch
family must pass it.
"""

from conformance_broken.base import good_rms_norm
from reference_impl import ir


def _supports(x, weight, epsilon, variance_size=None):
    return x.is_contiguous()


@ir.ops.rms_norm.register_impl("broken", supports_args=_supports)
def rms_norm(x, weight, epsilon, variance_size=None):
    return good_rms_norm(x, weight, epsilon, variance_size)
