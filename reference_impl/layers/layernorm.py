"""Normalization layers."""

from __future__ import annotations

import torch
import torch.nn as nn

from reference_impl import ir
from reference_impl.custom_op import CustomOp
from reference_impl.ir.cases import randn, strided
from reference_impl.ir.ops.layernorm import NORM_TOLERANCES
from reference_impl.layers.cases import LayerCase, randomize_parameters


@CustomOp.register("rms_norm")
class RMSNorm(CustomOp):
    """Root mean square normalization, `x -> w * x / sqrt(E[x^2] + eps)` (arXiv 1910.07467).

    Without a residual it is IR `rms_norm`; with one, IR `fused_add_rms_norm.maybe_inplace`, so an
    in-place kernel may reuse `x` and `residual` (the caller must not use them afterwards).
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6, var_hidden_size: int | None = None,
                 has_weight: bool = True, dtype: torch.dtype | None = None, *, enforce_enable: bool = False):
        super().__init__(enforce_enable=enforce_enable)
        if var_hidden_size is not None and not (0 < var_hidden_size <= hidden_size):
            raise ValueError(f"var_hidden_size={var_hidden_size} must be in [1, hidden_size={hidden_size}]")
        self.hidden_size = hidden_size
        self.variance_epsilon = eps
        self.variance_size_override = None if var_hidden_size in (None, hidden_size) else var_hidden_size
        self.has_weight = has_weight
        weight = torch.ones(hidden_size, dtype=dtype or torch.get_default_dtype())
        self.weight = nn.Parameter(weight, requires_grad=False) if has_weight else None

    def forward_native(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if x.shape[-1] != self.hidden_size:
            raise ValueError(f"RMSNorm expected last dim {self.hidden_size}, got shape {tuple(x.shape)}")
        if residual is None:
            return ir.ops.rms_norm(x, self.weight, self.variance_epsilon, self.variance_size_override)
        return ir.ops.fused_add_rms_norm.maybe_inplace(x, residual, self.weight, self.variance_epsilon,
                                                       self.variance_size_override)

    def extra_repr(self) -> str:
        return f"hidden_size={self.hidden_size}, eps={self.variance_epsilon}, has_weight={self.has_weight}"


def _rms_case(name, tokens, hidden, *, residual=False, level="quick", layout=None, **kwargs):
    def make_inputs(dtype, device, gen):
        x = randn((tokens, hidden), dtype, device, gen)
        if layout == "strided":
            x = strided(x)
        if residual:
            return (x, randn((tokens, hidden), dtype, device, gen))
        return (x,)

    return LayerCase(name, lambda dtype: {"hidden_size": hidden, "dtype": dtype, **kwargs}, make_inputs,
                     init_params=randomize_parameters, level=level)


RMSNorm.tolerances = NORM_TOLERANCES
RMSNorm.conformance_cases = [
    _rms_case("tokens=7,hidden=769", 7, 769),
    _rms_case("tokens=7,hidden=769,residual", 7, 769, residual=True),
    _rms_case("tokens=4,hidden=256,strided", 4, 256, layout="strided"),
    _rms_case("tokens=4,hidden=256,no_weight", 4, 256, has_weight=False),
    _rms_case("tokens=4,hidden=256,var_hidden_size=64", 4, 256, var_hidden_size=64),
    _rms_case("tokens=4,hidden=256,var_hidden_size=64,residual", 4, 256, var_hidden_size=64, residual=True),
    _rms_case("tokens=16,hidden=4096,residual", 16, 4096, residual=True, level="standard"),
]
