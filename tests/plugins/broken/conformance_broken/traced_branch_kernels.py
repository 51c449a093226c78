"""Fault: a Python-side branch on tensor values that takes another path when traced.

The kernel skips the weight multiply when the weight is all ones, deciding from the weight's
values. Values cannot be read while torch.compile traces, so the author assumed unit weights there:
eager runs are right, compiled programs drop the weight. Only the compile family can see it.
"""

import torch

from conformance_broken.base import good_rms_norm
from reference_impl import ir


def _unit_weight(weight) -> bool:
    if weight is None:
        return True
    if torch.compiler.is_compiling():
        return True                      # the bug: no values while tracing, so "assume the common case"
    return bool((weight == 1).all())     # a Python-side branch on tensor values


@ir.ops.rms_norm.register_impl("broken")
def rms_norm(x, weight, epsilon, variance_size=None):
    return good_rms_norm(x, None if _unit_weight(weight) else weight, epsilon, variance_size)
