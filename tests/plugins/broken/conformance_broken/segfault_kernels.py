"""Fault: the kernel kills its process with a segmentation fault (a read of address 0)."""

import ctypes

from reference_impl import ir


@ir.ops.rms_norm.register_impl("broken")
def rms_norm(x, weight, epsilon, variance_size=None):
    ctypes.string_at(0)    # the bug: dereferences a null pointer
    raise AssertionError("unreachable")
