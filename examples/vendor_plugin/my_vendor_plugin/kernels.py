"""IR implementations. Replace the kernel body with a call into your library; keep the signatures.

Compile lowering traces every IR implementation with make_fx on fake tensors (sizes, no data). A
kernel that is launched on raw data pointers (a C/CUDA launcher, a Triton grid launch, ctypes)
cannot be traced, so the launch lives in a `torch.library` custom op with a fake implementation:
the traced graph keeps one opaque call, and the fake describes its output from the input shapes.
"""

import torch
from torch import Tensor

from reference_impl import ir


@torch.library.custom_op("myvendor::rms_norm", mutates_args=())
def rms_norm_kernel(x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None) -> Tensor:
    """Runs on real tensors only: launch your kernel here (x.data_ptr() and friends are fine)."""
    x32 = x.to(torch.float32)
    stats = x32 if variance_size is None else x32[..., :variance_size]
    out = x32 * torch.rsqrt(stats.square().mean(dim=-1, keepdim=True) + epsilon)
    if weight is not None:           # vLLM 0.32: multiply in the weight's dtype; the output keeps x's dtype
        out = out.to(weight.dtype) * weight
    return out.to(x.dtype).contiguous()   # a fresh, contiguous output, as the fake below promises


@rms_norm_kernel.register_fake
def _(x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None) -> Tensor:
    return x.new_empty(x.shape)      # shape, dtype and device of the result; no data


def _supports(x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None) -> bool:
    # Decide from dtype, device and non-batch shape only (never the batch size), and return a real bool.
    return x.dtype in (torch.float32, torch.float16, torch.bfloat16)


@ir.ops.rms_norm.register_impl("myvendor", supports_args=_supports)
def rms_norm(x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None) -> Tensor:
    return rms_norm_kernel(x, weight, epsilon, variance_size)
