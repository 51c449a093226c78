"""The plugin's IR implementation of vllm.ir.ops.rms_norm: the CPU kernel of vLLM's `_C` library."""

import torch
from torch import Tensor

from vllm import ir
from vllm.platforms import current_platform

current_platform.import_kernels()   # loads the `_C` library whose rms_norm this provider launches

VECTOR = 8   # the kernel walks each row in vectors of this many elements


def supports(x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None) -> bool:
    """The shapes and dtypes the kernel takes: whole vectors per row, one dtype, no variance_size."""
    return (variance_size is None and x.shape[-1] % VECTOR == 0
            and (weight is None or weight.dtype == x.dtype))


if "my_cpu" not in ir.ops.rms_norm.impls:
    @ir.ops.rms_norm.register_impl("my_cpu", supports_args=supports)
    def rms_norm(x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None) -> Tensor:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        torch.ops._C.rms_norm(out, x, weight, epsilon)
        return out
