"""The plugin's replacements of three vLLM activation layers, through CustomOp.register_oot.

Each defines `forward_oot`, the method vLLM's dispatch picks on an out-of-tree platform, and computes
the layer's function itself (honouring the constructor's arguments: GeluAndMul's `approximate`).
"""

import torch
import torch.nn.functional as F

from vllm.model_executor.custom_op import CustomOp, op_registry_oot
from vllm.model_executor.layers.activation import GeluAndMul, QuickGELU, SiluAndMul


class GoodSiluAndMul(SiluAndMul):
    """silu(x[..., :d]) * x[..., d:]."""

    def forward_oot(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        return F.silu(x[..., :d]) * x[..., d:]


class GoodGeluAndMul(GeluAndMul):
    """gelu(x[..., :d], approximate) * x[..., d:], with the approximation the layer was built with."""

    def forward_oot(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        return F.gelu(x[..., :d], approximate=self.approximate) * x[..., d:]


class GoodQuickGELU(QuickGELU):
    """x * sigmoid(1.702 x)."""

    def forward_oot(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(x * 1.702)


for _name, _cls in (("SiluAndMul", GoodSiluAndMul), ("GeluAndMul", GoodGeluAndMul), ("QuickGELU", GoodQuickGELU)):
    if _name not in op_registry_oot:
        CustomOp.register_oot(_decorated_op_cls=_cls, name=_name)
