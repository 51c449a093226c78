"""Fault: CustomOp replacements whose own code never runs on this (out-of-tree) platform.

`CudaOnlyRMSNorm` defines only `forward_cuda`; an OOT platform calls `forward_oot`, which it
inherits from CustomOp and which falls back to `forward_native`. `CudaDispatchSiluAndMul` defines
`forward_oot` but overrides `dispatch_forward` with a copy that knows only CUDA, so `forward_oot`
is never reached. `DisabledGeluAndMul` defines `forward_oot` but its `enabled()` returns False, so
CustomOp dispatch picks `forward_native` with custom ops on. All three compute the right values (through the in-tree `forward_native`), so only the
dispatch family can see that the vendor's code is dead.
"""

import torch

from reference_impl import ir
from reference_impl.custom_op import CustomOp
from reference_impl.layers.activation import GeluAndMul, SiluAndMul
from reference_impl.layers.layernorm import RMSNorm
from reference_impl.platforms import get_current_platform


@CustomOp.register_oot("RMSNorm")
class CudaOnlyRMSNorm(RMSNorm):
    def forward_cuda(self, x, residual=None):     # the bug: the platform is OOT, so forward_oot is called
        if residual is None:
            return ir.ops.rms_norm(x, self.weight, self.variance_epsilon, self.variance_size_override)
        return ir.ops.fused_add_rms_norm.maybe_inplace(x, residual, self.weight, self.variance_epsilon,
                                                       self.variance_size_override)


@CustomOp.register_oot("SiluAndMul")
class CudaDispatchSiluAndMul(SiluAndMul):
    def dispatch_forward(self):                   # the bug: a dispatch that knows only CUDA
        if self.enabled() and get_current_platform().is_cuda():
            return self.forward_cuda
        return self.forward_native

    def forward_oot(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        return torch.nn.functional.silu(x[..., :d]) * x[..., d:]


@CustomOp.register_oot("GeluAndMul")
class DisabledGeluAndMul(GeluAndMul):
    @classmethod
    def enabled(cls) -> bool:                     # the bug: never enabled, whatever custom_ops says
        return False

    def forward_oot(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        return torch.nn.functional.gelu(x[..., :d], approximate=self.approximate) * x[..., d:]
