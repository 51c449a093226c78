"""Fault: the kernel raises."""

from reference_impl import ir


@ir.ops.rms_norm.register_impl("broken")
def rms_norm(x, weight, epsilon, variance_size=None):
    raise RuntimeError("broken kernel: launch failed (simulated)")
