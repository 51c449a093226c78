"""Mamba2's gated group RMS norm (docs/catalog.md `mixer2_gated_rms_norm`) and its conformance cases.

Tensor parallelism is fixed at tp=1 here: vLLM's Mixer2RMSNormGated all-reduces the sum of squares
when one group spans ranks and all-gathers when ranks do not divide the groups; with one rank both
reduce to the per-group statistics computed below.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from reference_impl import ir
from reference_impl.custom_op import CustomOp
from reference_impl.ir.cases import randn, row_strided
from reference_impl.ir.tolerances import ELEMENTWISE_TOLERANCES
from reference_impl.layers.cases import LayerCase, declare_cases, randomize_parameters


@CustomOp.register("mixer2_gated_rms_norm")
class Mixer2RMSNormGated(CustomOp):
    """Mamba2's gated RMS norm: `g = x * silu(gate)` in float32, RMS-normalized per group of
    `full_hidden_size / full_n_groups` features, cast to x's dtype, times `weight`.

    `use_rms_norm=False` returns the gated `g` cast to x's dtype (no weight). The weight takes
    torch's default dtype, as in vLLM (whose model loader sets it to the model's dtype); the output
    dtype is the promotion of the weight's and x's, as in vLLM's `weight * x.to(input_dtype)`.
    """

    def __init__(self, full_hidden_size: int, full_n_groups: int, use_rms_norm: bool = True, eps: float = 1e-6,
                 *, enforce_enable: bool = False):
        super().__init__(enforce_enable=enforce_enable)
        if full_n_groups <= 0 or full_hidden_size % full_n_groups:
            raise ValueError(f"Mixer2RMSNormGated: full_n_groups={full_n_groups} must be positive and divide "
                             f"full_hidden_size={full_hidden_size}")
        self.tp_size = 1
        self.full_hidden_size = full_hidden_size
        self.n_groups = full_n_groups
        self.group_size = full_hidden_size // full_n_groups
        self.per_rank_hidden_size = full_hidden_size
        self.variance_epsilon = eps
        self.use_rms_norm = use_rms_norm
        if use_rms_norm:
            self.weight = nn.Parameter(torch.ones(full_hidden_size), requires_grad=False)
        else:
            self.register_parameter("weight", None)

    def forward_native(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.full_hidden_size or gate.shape != x.shape:
            raise ValueError(f"Mixer2RMSNormGated expected x and gate of last dim {self.full_hidden_size} and "
                             f"equal shapes, got {tuple(x.shape)} and {tuple(gate.shape)}")
        input_dtype = x.dtype
        compute = torch.promote_types(x.dtype, torch.float32)  # float64 inputs stay float64
        gated = x * F.silu(gate.to(compute))
        if not self.use_rms_norm:
            return gated.to(input_dtype)
        grouped = gated.unflatten(-1, (self.n_groups, self.group_size))
        normed = ir.ops.rms_norm(grouped, None, self.variance_epsilon).flatten(-2)
        return self.weight * normed.to(input_dtype)

    def extra_repr(self) -> str:
        return (f"full_hidden_size={self.full_hidden_size}, n_groups={self.n_groups}, "
                f"use_rms_norm={self.use_rms_norm}, eps={self.variance_epsilon}")


def _mixer2_case(name, tokens, hidden, groups, *, level="quick", layout=None, float32_weight=False, dtypes=None,
                 **kwargs):
    """The weight in the run dtype (built under that default dtype, like a vLLM model), or in float32
    (`float32_weight`: the default dtype outside a model, which promotes the output to float32)."""
    def make_inputs(dtype, device, gen):
        x = randn((tokens, hidden), dtype, device, gen)
        gate = randn((tokens, hidden), dtype, device, gen)
        if layout == "row_strided":
            x = row_strided(x)
        return (x, gate)

    return LayerCase(name, lambda dtype: {"full_hidden_size": hidden, "full_n_groups": groups, **kwargs},
                     make_inputs, init_params=randomize_parameters, level=level, dtypes=dtypes,
                     default_dtype=not float32_weight)


declare_cases(Mixer2RMSNormGated, tolerances=ELEMENTWISE_TOLERANCES, cases=[
    _mixer2_case("tokens=7,hidden=768,groups=1", 7, 768, 1),
    _mixer2_case("tokens=7,hidden=768,groups=8", 7, 768, 8),
    _mixer2_case("tokens=5,hidden=300,groups=3,row_strided", 5, 300, 3, layout="row_strided"),
    _mixer2_case("tokens=4,hidden=256,groups=4,no_norm", 4, 256, 4, use_rms_norm=False),
    _mixer2_case("tokens=1,hidden=2,groups=2", 1, 2, 2),
    _mixer2_case("tokens=6,hidden=256,groups=4,weight=float32", 6, 256, 4, float32_weight=True,
                 dtypes=(torch.float16, torch.bfloat16)),
    _mixer2_case("tokens=16,hidden=4096,groups=8", 16, 4096, 8, level="standard"),
])
