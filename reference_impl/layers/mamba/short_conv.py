"""LFM2's gated short convolution (docs/catalog.md `short_conv`) and its conformance cases."""

from __future__ import annotations

import dataclasses

import torch

from reference_impl.custom_op import PluggableLayer
from reference_impl.ir.tolerances import MIXER_TOLERANCES
from reference_impl.layers._composite import CompositeLayer, linear, require_single_rank
from reference_impl.layers.cases import declare_cases
from reference_impl.layers.mamba._common import (
    _check_tokens,
    _Conv1dParams,
    _linear,
    _mixer_case,
    _positive_ints,
)
from reference_impl.layers.mamba.scans import _mixer_compute, causal_conv1d


@dataclasses.dataclass(frozen=True)
class ShortConvConfig:
    """The fields of an LFM2 model config that ShortConv reads (vLLM passes the model's config)."""

    conv_L_cache: int
    conv_bias: bool = False


@PluggableLayer.register("short_conv")
class ShortConv(CompositeLayer):
    """LFM2's gated short convolution, one sequence, no cache.

    `[B | C | x] = in_proj(h)`; `y = C * causal_conv1d(B * x)` (no activation; the gating and the
    conv in float32, rounded once); `out_proj(y)`. vLLM's constructor: `config.conv_L_cache` is the
    conv width, `config.conv_bias` gives in_proj, conv and out_proj biases (any object with those
    fields, e.g. ShortConvConfig); `model_config` and `cache_config` are accepted and unused,
    `quant_config` must be None; `params_dtype` and `tp_size` are the reference's own, keyword-only.
    """

    def __init__(self, config, dim: int, layer_idx: int, model_config=None, cache_config=None, quant_config=None,
                 prefix: str = "", *, params_dtype: torch.dtype | None = None, tp_size: int = 1) -> None:
        super().__init__()
        name = type(self).__name__
        require_single_rank(name, "tp_size", tp_size)
        if quant_config is not None:
            raise NotImplementedError(f"{name}: quantized projections are not part of the reference (quant_config)")
        conv_L_cache, conv_bias = config.conv_L_cache, bool(config.conv_bias)
        _positive_ints(name, dim=dim, conv_L_cache=conv_L_cache)
        dtype = params_dtype or torch.get_default_dtype()
        self.config = config
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


def _short_conv_case(name, tokens, dim, conv_L_cache, conv_bias=False, level="quick"):
    return _mixer_case(name, tokens, dim, {"config": ShortConvConfig(conv_L_cache, conv_bias), "layer_idx": 0},
                       level=level, key="dim")


declare_cases(ShortConv, tolerances=MIXER_TOLERANCES, cases=[
    _short_conv_case("tokens=9,dim=32,L=3", 9, 32, 3),
    _short_conv_case("tokens=6,dim=16,L=4,bias", 6, 16, 4, True),
    _short_conv_case("tokens=1,dim=8,L=3", 1, 8, 3),
    _short_conv_case("tokens=64,dim=256,L=3", 64, 256, 3, level="standard"),
])
