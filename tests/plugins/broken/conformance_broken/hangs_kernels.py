"""Fault: the kernel never returns."""

import time

from reference_impl import ir


@ir.ops.rms_norm.register_impl("broken")
def rms_norm(x, weight, epsilon, variance_size=None):
    while True:    # the bug: waits for a completion that never comes
        time.sleep(0.05)
