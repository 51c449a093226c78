"""Kernels of the missing_default fault: 'broken' is fine; 'never' rejects every input."""

from conformance_broken.base import good_rms_norm
from reference_impl import ir
from reference_impl.ir.ops.layernorm import fused_add_rms_norm as _native_fused


@ir.ops.rms_norm.register_impl("broken")
def rms_norm(x, weight, epsilon, variance_size=None):
    return good_rms_norm(x, weight, epsilon, variance_size)


@ir.ops.fused_add_rms_norm.register_impl(
    "never", supports_args=lambda x, x_residual, weight, epsilon, variance_size=None: False)
def fused_add_rms_norm(x, x_residual, weight, epsilon, variance_size=None):
    return _native_fused.native_fn(x, x_residual, weight, epsilon, variance_size)
