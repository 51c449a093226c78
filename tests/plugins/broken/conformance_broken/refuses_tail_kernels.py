"""Fault: an RMS norm that refuses hidden sizes which are no multiple of 8 by raising NotImplementedError,
although it registered no supports_args (so it claims every argument): those calls should have been
declined in supports_args and run elsewhere."""

from conformance_broken.base import good_rms_norm
from reference_impl import ir


@ir.ops.rms_norm.register_impl("broken")
def rms_norm(x, weight, epsilon, variance_size=None):
    if x.shape[-1] % 8:
        raise NotImplementedError(f"hidden size {x.shape[-1]} is not a multiple of 8")
    return good_rms_norm(x, weight, epsilon, variance_size)
