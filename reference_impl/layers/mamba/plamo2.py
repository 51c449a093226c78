"""PLaMo 2's Mamba-2 mixer (docs/catalog.md `plamo2_mamba_mixer`) and its conformance cases."""

from __future__ import annotations

import torch

from reference_impl.custom_op import PluggableLayer
from reference_impl.ir.tolerances import MIXER_TOLERANCES
from reference_impl.layers._composite import CompositeLayer, linear, require_single_rank
from reference_impl.layers.cases import declare_cases
from reference_impl.layers.layernorm import RMSNorm
from reference_impl.layers.mamba._common import (
    _check_tokens,
    _Conv1dParams,
    _heads_params,
    _linear,
    _mixer_case,
    _positive_ints,
)
from reference_impl.layers.mamba.scans import causal_conv1d, ssd_scan


@PluggableLayer.register("plamo2_mamba_mixer")
class Plamo2MambaMixer(CompositeLayer):
    """PLaMo 2's Mamba-2 mixer, one sequence, no cache.

    `[gate | x] = in_proj(h)`; `x = silu(causal_conv1d(x))` (no conv bias); `[B | C | ts] =
    bcdt_proj(x)`, each RMS-normed (B_norm, C_norm, dt_norm); `dt = dt_proj(ts)` per head;
    `y = ssd_scan(x, dt, A, B, C, D, dt_bias, z=gate)` with one group; `out_proj(y)`.
    vLLM reads the sizes from the HF config (mamba_d_state, mamba_d_conv, mamba_num_heads,
    hidden_size_per_head, rms_norm_eps; time_step_rank = max(64, hidden_size // 16)); here they
    are arguments under those names.
    """

    def __init__(self, hidden_size: int, mamba_d_state: int, mamba_d_conv: int, mamba_num_heads: int,
                 hidden_size_per_head: int, rms_norm_eps: float = 1e-6, time_step_rank: int | None = None,
                 prefix: str = "", *, params_dtype: torch.dtype | None = None, tp_size: int = 1) -> None:
        super().__init__()
        name = type(self).__name__
        require_single_rank(name, "tp_size", tp_size)
        time_step_rank = max(64, hidden_size // 16) if time_step_rank is None else time_step_rank
        _positive_ints(name, hidden_size=hidden_size, mamba_d_state=mamba_d_state, mamba_d_conv=mamba_d_conv,
                       mamba_num_heads=mamba_num_heads, hidden_size_per_head=hidden_size_per_head,
                       time_step_rank=time_step_rank)
        dtype = params_dtype or torch.get_default_dtype()
        self.hidden_size, self.ssm_state_size, self.conv_kernel_size = hidden_size, mamba_d_state, mamba_d_conv
        self.num_heads, self.head_dim = mamba_num_heads, hidden_size_per_head
        self.intermediate_size = mamba_num_heads * hidden_size_per_head
        self.time_step_rank, self.prefix, self.activation = time_step_rank, prefix, "silu"
        inter = self.intermediate_size
        self.in_proj = _linear(hidden_size, 2 * inter, False, dtype)
        self.conv1d = _Conv1dParams(inter, mamba_d_conv, False, dtype)
        self.bcdt_proj = _linear(inter, time_step_rank + 2 * mamba_d_state, False, dtype)
        self.dt_proj = _linear(time_step_rank, mamba_num_heads, False, dtype)
        self.A, self.D, self.dt_bias = _heads_params(mamba_num_heads)
        self.out_proj = _linear(inter, hidden_size, False, dtype)
        self.dt_norm = RMSNorm(time_step_rank, eps=rms_norm_eps, dtype=dtype)
        self.B_norm = RMSNorm(mamba_d_state, eps=rms_norm_eps, dtype=dtype)
        self.C_norm = RMSNorm(mamba_d_state, eps=rms_norm_eps, dtype=dtype)

    def _forward(self, hidden_states: torch.Tensor, *, native: bool) -> torch.Tensor:
        _check_tokens(self, hidden_states)
        tokens = hidden_states.shape[0]
        gate, x = linear(hidden_states, self.in_proj).chunk(2, dim=-1)
        x = causal_conv1d(x, self.conv1d.weight, None, self.activation)
        B, C, ts = linear(x, self.bcdt_proj).split([self.ssm_state_size, self.ssm_state_size, self.time_step_rank], -1)
        ts = self._call(self.dt_norm, native, ts.contiguous())
        B = self._call(self.B_norm, native, B.contiguous())
        C = self._call(self.C_norm, native, C.contiguous())
        dt = linear(ts, self.dt_proj)
        heads = (tokens, self.num_heads, self.head_dim)
        y = ssd_scan(x.reshape(heads), dt, self.A, B.unsqueeze(1), C.unsqueeze(1), self.D, self.dt_bias,
                     z=gate.reshape(heads))
        return linear(y.reshape(tokens, -1), self.out_proj)

    def extra_repr(self) -> str:
        return (f"hidden_size={self.hidden_size}, mamba_d_state={self.ssm_state_size}, "
                f"mamba_d_conv={self.conv_kernel_size}, mamba_num_heads={self.num_heads}, "
                f"hidden_size_per_head={self.head_dim}, time_step_rank={self.time_step_rank}")


declare_cases(Plamo2MambaMixer, tolerances=MIXER_TOLERANCES, cases=[
    _mixer_case("tokens=9,h=32,heads=4x8,N=8,k=4,rank=8", 9, 32, {
        "mamba_d_state": 8, "mamba_d_conv": 4, "mamba_num_heads": 4, "hidden_size_per_head": 8,
        "time_step_rank": 8}),
    _mixer_case("tokens=1,h=16,heads=2x4,N=4,k=3,rank=4", 1, 16, {
        "mamba_d_state": 4, "mamba_d_conv": 3, "mamba_num_heads": 2, "hidden_size_per_head": 4,
        "time_step_rank": 4}),
    _mixer_case("tokens=64,h=128,heads=8x16,N=16,k=4,rank=default", 64, 128, {
        "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_num_heads": 8, "hidden_size_per_head": 16},
        level="standard"),
])
