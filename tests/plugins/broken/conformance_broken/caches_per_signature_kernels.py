"""Fault: an RMS norm that caches its result per input signature (shape, strides, dtype), as a kernel that
caches a plan per signature might cache too much: a second call with new data of the same shapes
returns the first call's result."""

from conformance_broken.base import good_rms_norm
from reference_impl import ir

_RESULTS = {}


@ir.ops.rms_norm.register_impl("broken")
def rms_norm(x, weight, epsilon, variance_size=None):
    key = (tuple(x.shape), tuple(x.stride()), x.dtype, weight is None, variance_size)
    if key not in _RESULTS:    # the bug: keyed by the signature, not by the data
        _RESULTS[key] = good_rms_norm(x, weight, epsilon, variance_size)
    return _RESULTS[key].clone()
