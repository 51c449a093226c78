"""FusedRMSNormGated (docs/catalog.md `fused_rms_norm_gated`): the flash-linear-attention gated RMS norm
of vLLM 0.32 (Kimi linear attention, Qwen3-Next), with its native semantics and conformance cases.

`y = rms_norm(x) * weight * act(g)` in float32, cast to x's dtype, act SiLU ('swish' / 'silu':
`g * sigmoid(g)`) or 'sigmoid'. The normalization is IR `rms_norm` on the float32 rows (without a
weight), so the platform's rms_norm kernel serves it.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from reference_impl import ir
from reference_impl.custom_op import CustomOp
from reference_impl.ir.cases import randn
from reference_impl.ir.tolerances import ELEMENTWISE_TOLERANCES
from reference_impl.layers.cases import LayerCase, declare_cases, randomize_parameters

ACTIVATIONS = ("swish", "silu", "sigmoid")


@CustomOp.register("fused_rms_norm_gated")
class FusedRMSNormGated(CustomOp):
    """`forward(x, g, residual=None, prenorm=False, residual_in_fp32=False)`.

    With a residual, `s = x + residual` (float32) is normalized and, with `prenorm`, returned as the
    second output in the residual's dtype: `(y, s)`. With `prenorm` and no residual the second output
    is x itself (float32 with `residual_in_fp32`). vLLM 0.32's native form covers the plain path and
    hands the residual / prenorm forms to its Triton kernel, whose semantics these are. The weight
    starts at ones (vLLM leaves it uninitialized, to be loaded).
    """

    def __init__(self, hidden_size: int, elementwise_affine: bool = True, eps: float = 1e-5,
                 activation: str = "swish", device: torch.device | None = None, dtype: torch.dtype | None = None,
                 *, enforce_enable: bool = False) -> None:
        super().__init__(enforce_enable=enforce_enable)
        if activation not in ACTIVATIONS:
            raise ValueError(f"FusedRMSNormGated: activation={activation!r} is not one of {ACTIVATIONS}")
        self.hidden_size = hidden_size
        self.elementwise_affine = elementwise_affine
        self.eps = eps
        self.activation = activation
        if elementwise_affine:
            self.weight = nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype), requires_grad=False)
        else:
            self.register_parameter("weight", None)
        self.register_parameter("bias", None)

    def forward_native(self, x: torch.Tensor, g: torch.Tensor, residual: torch.Tensor | None = None,
                       prenorm: bool = False, residual_in_fp32: bool = False):
        if x.shape[-1] != self.hidden_size or g.shape != x.shape:
            raise ValueError(f"FusedRMSNormGated expected x and g of last dim {self.hidden_size} and one shape, got "
                             f"{tuple(x.shape)} and {tuple(g.shape)}")
        compute = torch.promote_types(x.dtype, torch.float32)   # float64 for the golden run
        s = x.to(compute)
        if residual is not None:
            if residual.shape != x.shape:
                raise ValueError(f"FusedRMSNormGated: residual {tuple(residual.shape)} must have x's shape "
                                 f"{tuple(x.shape)}")
            s = s + residual.to(compute)
        normed = ir.ops.rms_norm(s, None, self.eps).to(compute)
        if self.weight is not None:
            normed = normed * self.weight.to(compute)
        gate = g.to(compute)
        out = normed * gate * torch.sigmoid(gate) if self.activation in ("swish", "silu") else \
            normed * torch.sigmoid(gate)
        out = out.to(x.dtype)
        if not prenorm:
            return out
        if residual is not None:
            return out, s.to(residual.dtype)
        return out, (x.to(torch.float32) if residual_in_fp32 else x)

    def extra_repr(self) -> str:
        return f"hidden_size={self.hidden_size}, eps={self.eps}, activation={self.activation!r}"


def _case(name, tokens, hidden, *, residual=False, prenorm=False, level="quick", **kwargs):
    def make_inputs(dtype, device, gen):
        x, g = randn((tokens, hidden), dtype, device, gen), randn((tokens, hidden), dtype, device, gen)
        if not residual:
            return (x, g)
        return (x, g, randn((tokens, hidden), dtype, device, gen), prenorm)

    return LayerCase(name, lambda dtype: {"hidden_size": hidden, "dtype": dtype, **kwargs}, make_inputs,
                     init_params=randomize_parameters, level=level)


declare_cases(FusedRMSNormGated, tolerances=ELEMENTWISE_TOLERANCES, cases=[
    _case("tokens=7,hidden=768,swish", 7, 768),
    _case("tokens=5,hidden=128,sigmoid", 5, 128, activation="sigmoid"),
    _case("tokens=4,hidden=256,no_affine", 4, 256, elementwise_affine=False),
    _case("tokens=4,hidden=256,residual,prenorm", 4, 256, residual=True, prenorm=True),
    _case("tokens=3,hidden=64,residual", 3, 64, residual=True),
    _case("tokens=1,hidden=32", 1, 32),
    _case("tokens=16,hidden=4096", 16, 4096, level="standard"),
])
