"""The Mamba-2 SSD mixer (docs/catalog.md `mamba_mixer2`) and its conformance cases."""

from __future__ import annotations

import torch

from reference_impl.custom_op import PluggableLayer
from reference_impl.ir.tolerances import MIXER_TOLERANCES
from reference_impl.layers._composite import CompositeLayer, linear, require_single_rank
from reference_impl.layers.cases import declare_cases
from reference_impl.layers.mamba._common import (
    _check_tokens,
    _Conv1dParams,
    _heads_params,
    _linear,
    _mixer_case,
    _positive_ints,
)
from reference_impl.layers.mamba.gated_norm import Mixer2RMSNormGated
from reference_impl.layers.mamba.scans import CONV_ACTIVATIONS, causal_conv1d, ssd_scan


@PluggableLayer.register("mamba_mixer2")
class MambaMixer2(CompositeLayer):
    """Mamba-2 SSD mixer (arXiv 2405.21060), one sequence, no cache.

    `[z | xBC | dt] = in_proj(h)` (`intermediate`, `intermediate + 2 * n_groups * N`, `num_heads`);
    `xBC = silu(causal_conv1d(xBC))` split into x `[T, heads, head_dim]`, B and C `[T, n_groups, N]`;
    `y = ssd_scan(x, dt, A, B, C, D, dt_bias)`; `y = Mixer2RMSNormGated(y, gate=z)`; `out_proj(y)`.
    vLLM's constructor arguments (`model_config`, `cache_config` accepted and unused, `quant_config`
    must be None); `params_dtype` and `tp_size` are the reference's own, keyword-only.
    """

    def __init__(self, hidden_size: int, ssm_state_size: int, conv_kernel_size: int, intermediate_size: int,
                 use_conv_bias: bool, use_bias: bool, n_groups: int = 1, num_heads: int = 128, head_dim: int = 64,
                 rms_norm_eps: float = 1e-5, activation: str = "silu", use_rms_norm: bool = True,
                 model_config=None, cache_config=None, quant_config=None, prefix: str = "", *,
                 params_dtype: torch.dtype | None = None, tp_size: int = 1) -> None:
        super().__init__()
        name = type(self).__name__
        if quant_config is not None:
            raise NotImplementedError(f"{name}: quantized projections are not part of the reference (quant_config)")
        require_single_rank(name, "tp_size", tp_size)
        _positive_ints(name, hidden_size=hidden_size, ssm_state_size=ssm_state_size,
                       conv_kernel_size=conv_kernel_size, intermediate_size=intermediate_size, n_groups=n_groups,
                       num_heads=num_heads, head_dim=head_dim)
        if num_heads * head_dim != intermediate_size:
            raise ValueError(f"{name}: num_heads * head_dim = {num_heads * head_dim} must equal "
                             f"intermediate_size={intermediate_size}")
        if num_heads % n_groups:
            raise ValueError(f"{name}: n_groups={n_groups} must divide num_heads={num_heads}")
        if activation not in CONV_ACTIVATIONS:
            raise ValueError(f"{name}: activation={activation!r} is not one of {CONV_ACTIVATIONS}")
        dtype = params_dtype or torch.get_default_dtype()
        self.hidden_size, self.ssm_state_size = hidden_size, ssm_state_size
        self.conv_kernel_size, self.intermediate_size = conv_kernel_size, intermediate_size
        self.n_groups, self.num_heads, self.head_dim = n_groups, num_heads, head_dim
        self.activation, self.prefix = activation, prefix
        self.conv_dim = intermediate_size + 2 * n_groups * ssm_state_size
        self.in_proj = _linear(hidden_size, intermediate_size + self.conv_dim + num_heads, use_bias, dtype)
        self.conv1d = _Conv1dParams(self.conv_dim, conv_kernel_size, use_conv_bias, dtype)
        self.A, self.D, self.dt_bias = _heads_params(num_heads)
        self.norm = Mixer2RMSNormGated(intermediate_size, n_groups, use_rms_norm, eps=rms_norm_eps).to(dtype)
        self.out_proj = _linear(intermediate_size, hidden_size, use_bias, dtype)

    def _forward(self, hidden_states: torch.Tensor, *, native: bool) -> torch.Tensor:
        _check_tokens(self, hidden_states)
        tokens, gn = hidden_states.shape[0], self.n_groups * self.ssm_state_size
        z, xbc, dt = linear(hidden_states, self.in_proj).split(
            [self.intermediate_size, self.conv_dim, self.num_heads], -1)
        xbc = causal_conv1d(xbc, self.conv1d.weight, self.conv1d.bias, self.activation)
        x, B, C = xbc.split([self.intermediate_size, gn, gn], -1)
        y = ssd_scan(x.reshape(tokens, self.num_heads, self.head_dim), dt, self.A,
                     B.reshape(tokens, self.n_groups, -1), C.reshape(tokens, self.n_groups, -1), self.D, self.dt_bias)
        y = self._call(self.norm, native, y.reshape(tokens, -1), z.contiguous())
        return linear(y, self.out_proj)

    def extra_repr(self) -> str:
        return (f"hidden_size={self.hidden_size}, ssm_state_size={self.ssm_state_size}, "
                f"conv_kernel_size={self.conv_kernel_size}, n_groups={self.n_groups}, num_heads={self.num_heads}, "
                f"head_dim={self.head_dim}")


declare_cases(MambaMixer2, tolerances=MIXER_TOLERANCES, cases=[
    _mixer_case("tokens=9,h=32,heads=4x16,groups=2,N=8,k=4", 9, 32, {
        "ssm_state_size": 8, "conv_kernel_size": 4, "intermediate_size": 64, "use_conv_bias": True,
        "use_bias": False, "n_groups": 2, "num_heads": 4, "head_dim": 16}),
    _mixer_case("tokens=5,h=16,heads=2x8,groups=1,N=4,k=3,bias,no_norm", 5, 16, {
        "ssm_state_size": 4, "conv_kernel_size": 3, "intermediate_size": 16, "use_conv_bias": False,
        "use_bias": True, "n_groups": 1, "num_heads": 2, "head_dim": 8, "use_rms_norm": False}),
    _mixer_case("tokens=1,h=8,heads=2x4,groups=2,N=4,k=4", 1, 8, {
        "ssm_state_size": 4, "conv_kernel_size": 4, "intermediate_size": 8, "use_conv_bias": True,
        "use_bias": False, "n_groups": 2, "num_heads": 2, "head_dim": 4}),
    _mixer_case("tokens=64,h=128,heads=8x32,groups=2,N=32,k=4", 64, 128, {
        "ssm_state_size": 32, "conv_kernel_size": 4, "intermediate_size": 256, "use_conv_bias": True,
        "use_bias": False, "n_groups": 2, "num_heads": 8, "head_dim": 32}, level="standard"),
])
