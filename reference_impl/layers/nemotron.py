"""NemotronLayerNorm1P (docs/catalog.md `nemotron_layer_norm`): Nemotron's LayerNorm with `1 + w` as
the weight, vLLM 0.32's native semantics and its conformance cases."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from reference_impl.custom_op import CustomOp
from reference_impl.ir.cases import randn
from reference_impl.ir.tolerances import ELEMENTWISE_TOLERANCES
from reference_impl.layers.cases import LayerCase, declare_cases, randomize_parameters


@CustomOp.register("nemotron_layer_norm")
class NemotronLayerNorm1P(CustomOp):
    """`F.layer_norm(x, (hidden,), 1 + weight, bias, eps)` (weight and bias start at zeros, in torch's
    default dtype). With a residual, `x = x + residual` in x's dtype first and the sum is also returned:
    `(normed, x + residual)`. vLLM runs it with autocast off; the reference never autocasts."""

    def __init__(self, hidden_size: int, eps: float = 1e-5, *, enforce_enable: bool = False) -> None:
        super().__init__(enforce_enable=enforce_enable)
        self.normalized_shape = (hidden_size,)
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(hidden_size), requires_grad=False)
        self.bias = nn.Parameter(torch.zeros(hidden_size), requires_grad=False)

    def forward_native(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if x.shape[-1] != self.normalized_shape[0]:
            raise ValueError(f"NemotronLayerNorm1P expected last dim {self.normalized_shape[0]}, got shape "
                             f"{tuple(x.shape)}")
        if residual is not None:
            x = x + residual
            residual = x
        out = F.layer_norm(x, self.normalized_shape, self.weight + 1, self.bias, self.eps)
        return out if residual is None else (out, residual)

    def extra_repr(self) -> str:
        return f"hidden_size={self.normalized_shape[0]}, eps={self.eps}"


def _case(name, tokens, hidden, *, residual=False, level="quick"):
    def make_inputs(dtype, device, gen):
        x = randn((tokens, hidden), dtype, device, gen, scale=2.0, offset=0.5)
        return (x, randn((tokens, hidden), dtype, device, gen)) if residual else (x,)

    def init(layer, gen):   # weights near 0 (the layer adds 1)
        randomize_parameters(layer, gen, scale=0.1, offset=0.0)

    # Built under the run dtype as torch's default, as a vLLM model builds it (no dtype argument).
    return LayerCase(name, lambda dtype: {"hidden_size": hidden}, make_inputs, init_params=init, level=level,
                     default_dtype=True)


declare_cases(NemotronLayerNorm1P, tolerances=ELEMENTWISE_TOLERANCES, cases=[
    _case("tokens=7,hidden=769", 7, 769),
    _case("tokens=7,hidden=769,residual", 7, 769, residual=True),
    _case("tokens=1,hidden=64,residual", 1, 64, residual=True),
    _case("tokens=16,hidden=4096,residual", 16, 4096, residual=True, level="standard"),
])
