"""ApplyRotaryEmb (`apply_rotary_emb`): rotation by cos/sin the caller gives, not a cache of its own."""

from __future__ import annotations

import math

import torch

from reference_impl import ir
from reference_impl.custom_op import CustomOp
from reference_impl.ir.cases import randn
from reference_impl.ir.tolerances import ELEMENTWISE_TOLERANCES
from reference_impl.layers.cases import LayerCase, declare_cases


@CustomOp.register("apply_rotary_emb")
class ApplyRotaryEmb(CustomOp):
    """Apply given cos/sin to `x = [(batch,) seq, heads, head_size]`; cos/sin broadcast over the
    leading dims with `head_size // 2` features (`[seq, head_size // 2]` typically).

    `enable_fp32_compute` rotates a float32 copy and casts back. Goes through IR
    `rotary_embedding_query` with one cache row per token (the given cos/sin) and positions
    `0..tokens-1`.
    """

    def __init__(self, enforce_enable: bool = False, is_neox_style: bool = True,
                 enable_fp32_compute: bool = False):
        super().__init__(enforce_enable=enforce_enable)
        self.is_neox_style = is_neox_style
        self.enable_fp32_compute = enable_fp32_compute

    def forward_native(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if x.dim() < 2:
            raise ValueError(f"ApplyRotaryEmb expects x of shape [..., heads, head_size], got {tuple(x.shape)}")
        head_size = x.shape[-1]
        if cos.shape != sin.shape or cos.shape[-1] * 2 != head_size:
            raise ValueError(f"ApplyRotaryEmb: cos {tuple(cos.shape)} and sin {tuple(sin.shape)} must have one "
                             f"shape with head_size // 2 = {head_size // 2} features (x is {tuple(x.shape)})")
        origin_dtype = x.dtype
        if self.enable_fp32_compute:
            x = x.float()
        lead = x.shape[:-2]
        tokens = math.prod(lead)
        half = cos.shape[-1]
        cache = torch.cat((cos.expand(*lead, half).reshape(tokens, half),
                           sin.expand(*lead, half).reshape(tokens, half)), dim=-1)
        positions = torch.arange(tokens, device=x.device)
        out = ir.ops.rotary_embedding_query(positions, x, head_size, cache, self.is_neox_style)
        return out.to(origin_dtype) if self.enable_fp32_compute else out

    def extra_repr(self) -> str:
        return f"is_neox_style={self.is_neox_style}, enable_fp32_compute={self.enable_fp32_compute}"


# ----- conformance cases --------------------------------------------------------------------------
def _apply_case(name, seq, heads, head_size, *, batch=None, neox=True, fp32=False, level="quick"):
    def make_inputs(dtype, device, gen):
        lead = (batch, seq) if batch else (seq,)
        x = randn((*lead, heads, head_size), dtype, device, gen)
        angles = torch.rand((seq, head_size // 2), generator=gen, dtype=torch.float64) * 2 * math.pi
        return (x, angles.cos().to(dtype).to(device), angles.sin().to(dtype).to(device))

    return LayerCase(name, lambda dtype: {"is_neox_style": neox, "enable_fp32_compute": fp32}, make_inputs,
                     level=level)


declare_cases(ApplyRotaryEmb, tolerances=ELEMENTWISE_TOLERANCES, cases=[
    _apply_case("seq=7,heads=4,head=64,neox", 7, 4, 64),
    _apply_case("seq=7,heads=4,head=64,gptj", 7, 4, 64, neox=False),
    _apply_case("batch=2,seq=5,heads=3,head=80,neox", 5, 3, 80, batch=2),
    _apply_case("seq=6,heads=2,head=32,gptj,fp32_compute", 6, 2, 32, neox=False, fp32=True),
    _apply_case("seq=1,heads=1,head=2,neox", 1, 1, 2),
])
