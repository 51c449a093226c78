"""register_oot replacements, one fault each (what the harness must report is in tests/plugins/README.md).

- AcmeSiluAndMul defines forward_cuda only: on this out-of-tree platform vLLM calls the inherited
  forward_oot, which runs vLLM's forward_native; the vendor's kernel never runs.
- AcmeGeluAndMul defines forward_oot but its enabled() returns False: vLLM dispatches to forward_native.
- AcmeRMSNorm defines forward_oot but overrides dispatch_forward with a copy that knows only CUDA.
- AcmeQuantFP8 runs its own static quantization without the clamp to +-448, as a device conversion without
  saturation does: a code that rounds past 448 becomes NaN where vLLM's saturates.
- AcmeMulAndSilu is the control: forward_oot, dispatched and run as vLLM intends.
All but AcmeQuantFP8 compute the right values (through vLLM's forward_native or their own code).
"""

import torch

from vllm.model_executor.custom_op import CustomOp, op_registry_oot
from vllm.model_executor.layers.activation import GeluAndMul, MulAndSilu, SiluAndMul
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.quantization.input_quant_fp8 import QuantFP8
from vllm.model_executor.layers.quantization.utils.quant_utils import group_broadcast, prep_scale_for_group_broadcast
from vllm.platforms import current_platform

ROUNDS_PAST_MAX = 464.0   # |x / scale| from here on rounds to 480, which float8_e4m3fn does not have


class AcmeSiluAndMul(SiluAndMul):
    def forward_cuda(self, x: torch.Tensor) -> torch.Tensor:   # the fault: the platform is out of tree
        d = x.shape[-1] // 2
        return torch.nn.functional.silu(x[..., :d]) * x[..., d:]


class AcmeGeluAndMul(GeluAndMul):
    @classmethod
    def enabled(cls) -> bool:                                   # the fault: never enabled
        return False

    def forward_oot(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        return torch.nn.functional.gelu(x[..., :d], approximate=self.approximate) * x[..., d:]


class AcmeRMSNorm(RMSNorm):
    def dispatch_forward(self, compile_native: bool = False):  # the fault: a dispatch that knows only CUDA
        if self.enabled() and current_platform.is_cuda():
            return self.forward_cuda
        return self.forward_native

    def forward_oot(self, x, residual=None):
        return self.forward_native(x, residual)


class AcmeQuantFP8(QuantFP8):
    def forward_oot(self, x, scale=None, scale_ub=None, use_triton=False):
        if not self.static or self.num_token_padding is not None:
            return self.forward_native(x, scale, scale_ub, use_triton)
        scale = prep_scale_for_group_broadcast(scale, x, self.group_shape)
        scaled = x.to(torch.float32) * group_broadcast(scale.to(torch.float32), x.shape[-2:]).reciprocal()
        # the fault: no clamp to +-448. torch's own cast saturates, so the device's unsaturated conversion is spelled
        # out: from 464 on (halfway to 480, which e4m3fn lacks) a code rounds past 448 and becomes NaN
        unsaturated = torch.where(scaled.abs() >= ROUNDS_PAST_MAX, torch.full_like(scaled, float("nan")), scaled)
        return unsaturated.to(torch.float8_e4m3fn), scale


class AcmeMulAndSilu(MulAndSilu):
    def forward_oot(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        return x[..., :d] * torch.nn.functional.silu(x[..., d:])


for _name, _cls in (("SiluAndMul", AcmeSiluAndMul), ("GeluAndMul", AcmeGeluAndMul), ("RMSNorm", AcmeRMSNorm),
                    ("QuantFP8", AcmeQuantFP8), ("MulAndSilu", AcmeMulAndSilu)):
    if _name not in op_registry_oot:
        CustomOp.register_oot(_decorated_op_cls=_cls, name=_name)
