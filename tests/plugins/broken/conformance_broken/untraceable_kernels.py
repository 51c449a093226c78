"""Fault: the kernel is launched on raw data pointers, so lowering cannot trace it.

The "launch" writes the result through `out.data_ptr()` (ctypes.memmove stands in for a C or
Triton launch that takes pointers). Eager results are right; make_fx on fake tensors has no data
to point at. The fix is a torch.library custom op with a fake implementation around the launch
(examples/vendor_plugin/my_vendor_plugin/kernels.py shows it).
"""

import ctypes

import torch

from conformance_broken.base import good_rms_norm
from reference_impl import ir


def _launch(out: torch.Tensor, src: torch.Tensor) -> None:
    """Stand-in for a kernel launch on device pointers: copies `src`'s bytes into `out`."""
    ctypes.memmove(out.data_ptr(), src.data_ptr(), src.numel() * src.element_size())


@ir.ops.rms_norm.register_impl("broken")
def rms_norm(x, weight, epsilon, variance_size=None):
    result = good_rms_norm(x, weight, epsilon, variance_size).contiguous()
    out = torch.empty_like(result)
    _launch(out, result)
    return out
