"""The plugin's replacement of vLLM's SiluAndMul layer, through CustomOp.register_oot."""

import torch

from vllm.model_executor.custom_op import CustomOp, op_registry_oot
from vllm.model_executor.layers.activation import SiluAndMul
from vllm.platforms import current_platform

current_platform.import_kernels()


class MyCpuSiluAndMul(SiluAndMul):
    """silu(x[..., :d]) * x[..., d:] with the `_C` CPU kernel where it applies."""

    def forward_oot(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        if d % 8 or not x.is_contiguous():   # the kernel needs whole vectors of a contiguous row
            return self.forward_native(x)
        out = torch.empty(x.shape[:-1] + (d,), dtype=x.dtype, device=x.device)
        torch.ops._C.silu_and_mul(out, x)
        return out


if "SiluAndMul" not in op_registry_oot:
    CustomOp.register_oot(_decorated_op_cls=MyCpuSiluAndMul, name="SiluAndMul")
