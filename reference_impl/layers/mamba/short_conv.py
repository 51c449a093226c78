"""LFM2's gated short convolution (docs/catalog.md `short_conv`) and its conformance cases."""

from __future__ import annotations

import torch

from reference_impl.custom_op import CustomOp
from reference_impl.layers._composite import CompositeOp, linear, require_single_rank
from reference_impl.layers.cases import declare_cases
from reference_impl.layers.mamba._common import (
    MIXER_TOLERANCES,
    _check_tokens,
    _Conv1dParams,
    _linear,
    _mixer_case,
    _positive_ints,
)
from reference_impl.layers.mamba.scans import _mixer_compute, causal_conv1d


@CustomOp.register("short_conv")
class ShortConv(CompositeOp):
    """LFM2's gated short convolution, one sequence, no cache.

    `[B | C | x] = in_proj(h)`; `y = C * causal_conv1d(B * x)` (no activation; the gating and the
    conv in float32, rounded once); `out_proj(y)`. `conv_L_cache` is the conv width; `conv_bias`
    gives in_proj, conv and out_proj biases (LFM2's config fields; vLLM passes the config).
    """

    def __init__(self, dim: int, conv_L_cache: int, conv_bias: bool = False, layer_idx: int = 0, prefix: str = "",
                 *, params_dtype: torch.dtype | None = None, tp_size: int = 1,
                 enforce_enable: bool = False) -> None:
        super().__init__(enforce_enable=enforce_enable)
        name = type(self).__name__
        require_single_rank(name, "tp_size", tp_size)
        _positive_ints(name, dim=dim, conv_L_cache=conv_L_cache)
        dtype = params_dtype or torch.get_default_dtype()
        self.hidden_size = self.dim = dim
        self.L_cache, self.bias = conv_L_cache, conv_bias
        self.layer_idx, self.prefix = layer_idx, prefix
        self.in_proj = _linear(dim, 3 * dim, conv_bias, dtype)
        self.conv = _Conv1dParams(dim, conv_L_cache, conv_bias, dtype)
        self.out_proj = _linear(dim, dim, conv_bias, dtype)

    def _forward(self, hidden_states: torch.Tensor, *, native: bool) -> torch.Tensor:
        _check_tokens(self, hidden_states)
        compute = _mixer_compute(hidden_states)
        B, C, x = linear(hidden_states, self.in_proj).to(compute).chunk(3, dim=-1)
        conv = causal_conv1d(B * x, self.conv.weight, self.conv.bias, None)
        y = (C * conv).to(hidden_states.dtype)
        return linear(y, self.out_proj)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, conv_L_cache={self.L_cache}, conv_bias={self.bias}"


declare_cases(ShortConv, tolerances=MIXER_TOLERANCES, cases=[
    _mixer_case("tokens=9,dim=32,L=3", 9, 32, {"conv_L_cache": 3}),
    _mixer_case("tokens=6,dim=16,L=4,bias", 6, 16, {"conv_L_cache": 4, "conv_bias": True}),
    _mixer_case("tokens=1,dim=8,L=3", 1, 8, {"conv_L_cache": 3}),
    _mixer_case("tokens=64,dim=256,L=3", 64, 256, {"conv_L_cache": 3}, level="standard"),
])
