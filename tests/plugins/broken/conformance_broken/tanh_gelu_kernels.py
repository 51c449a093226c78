"""Fault: gelu_and_mul that always uses the tanh approximation, also where approximate='none' (erf) is asked."""

import torch.nn.functional as F

from reference_impl import ir


@ir.ops.gelu_and_mul.register_impl("broken")
def gelu_and_mul(x, approximate="none"):
    d = x.shape[-1] // 2
    return F.gelu(x[..., :d], approximate="tanh") * x[..., d:]   # the bug: approximate is ignored
