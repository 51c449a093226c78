"""Shared pieces of the Mamba mixers: argument checks, parameter holders, and the seeded initialisation
and case builder of their conformance cases (their tolerances: MIXER_TOLERANCES in reference_impl/ir/tolerances.py).

MambaMixer, MambaMixer2, Plamo2MambaMixer and ShortConv: the native form is the prefill of ONE
sequence with zero initial state and no cache: `forward(hidden_states [T, hidden]) -> [T, hidden]`.
Left out: decode steps and chunked prefill against a conv/SSM state cache, batches of packed
sequences (cu_seqlens / state indices), LoRA, quantized projections and tensor parallelism
(tp_size must be 1: out_proj would need an all-reduce). The recurrences run sequentially over
tokens in float32 (float64 inputs: float64), which the chunked SSD kernels reproduce up to
summation order. Projections round in the parameter dtype like vLLM's linear layers; the conv and
the scan round once at their ends.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from reference_impl.ir.cases import randn
from reference_impl.layers._composite import init_composite_params
from reference_impl.layers.cases import LayerCase


def _positive_ints(cls_name: str, **values) -> None:
    for what, value in values.items():
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{cls_name}: {what}={value!r} must be a positive int")


def _check_tokens(layer, hidden_states: torch.Tensor) -> None:
    if hidden_states.dim() != 2 or hidden_states.shape[-1] != layer.hidden_size:
        raise ValueError(f"{type(layer).__name__} expects hidden_states [tokens, {layer.hidden_size}] (one "
                         f"sequence), got {tuple(hidden_states.shape)}")


def _depthwise_conv_weight(channels: int, width: int, dtype: torch.dtype) -> nn.Parameter:
    """`[channels, 1, width]`, vLLM's conv1d.weight after its unsqueeze(1); N(0, 1/width) start."""
    return nn.Parameter(torch.randn(channels, 1, width, dtype=torch.float32).div(width ** 0.5).to(dtype),
                        requires_grad=False)


def _linear(n_in: int, n_out: int, bias: bool, dtype: torch.dtype) -> nn.Linear:
    layer = nn.Linear(n_in, n_out, bias=bias, dtype=dtype)
    layer.requires_grad_(False)
    return layer


class _Conv1dParams(nn.Module):
    """Holds `weight [C, 1, K]` and optional `bias [C]` under vLLM's `conv1d.*` names."""

    def __init__(self, channels: int, width: int, bias: bool, dtype: torch.dtype):
        super().__init__()
        self.weight = _depthwise_conv_weight(channels, width, dtype)
        self.bias = nn.Parameter(torch.zeros(channels, dtype=dtype), requires_grad=False) if bias else None


def _heads_params(num_heads: int) -> tuple[nn.Parameter, nn.Parameter, nn.Parameter]:
    """A (as loaded: -exp(A_log), start -1..-H), D and dt_bias, float32 `[H]` each."""
    a = -torch.arange(1, num_heads + 1, dtype=torch.float32)
    return (nn.Parameter(a, requires_grad=False),
            nn.Parameter(torch.ones(num_heads, dtype=torch.float32), requires_grad=False),
            nn.Parameter(torch.zeros(num_heads, dtype=torch.float32), requires_grad=False))


# ----- mixer conformance cases --------------------------------------------------------------------
def _ssm_special(names):
    """A = -(0.5 .. 2) (stable decays), dt_bias around softplus^-1(0.5); the rest as usual."""
    def neg_a(shape, gen):
        return -(torch.rand(shape, generator=gen, dtype=torch.float64) * 1.5 + 0.5)

    def dt_bias(shape, gen):
        return torch.randn(shape, generator=gen, dtype=torch.float64) * 0.1 - 0.4

    table = {"A": neg_a, "dt_bias": dt_bias, "dt_proj.bias": dt_bias}
    return {n: table[n] for n in names}


def _init_mixer(layer, gen):
    init_composite_params(layer, gen, special=_ssm_special(
        [n for n, _ in layer.named_parameters() if n in ("A", "dt_bias", "dt_proj.bias")]))


def _mixer_case(name, tokens, hidden, kwargs, *, level="quick", key="hidden_size"):
    """Built with the run dtype as torch's default (as a vLLM model builds its layers), so the
    constructor gets vLLM's arguments only."""
    def make_inputs(dtype, device, gen):
        return (randn((tokens, hidden), dtype, device, gen),)

    return LayerCase(name, lambda dtype: {key: hidden, **kwargs}, make_inputs, init_params=_init_mixer, level=level,
                     default_dtype=True)
