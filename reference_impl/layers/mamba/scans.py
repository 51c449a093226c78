"""The sequence operators of the Mamba mixers: depthwise causal conv1d, the Mamba-1 selective scan
and the Mamba-2 SSD scan, sequential over tokens in float32 (float64 inputs: float64), rounded once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

CONV_ACTIVATIONS = (None, "silu", "swish")


def _mixer_compute(x: torch.Tensor) -> torch.dtype:
    return torch.promote_types(x.dtype, torch.float32)


def causal_conv1d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  activation: str | None = None) -> torch.Tensor:
    """Depthwise causal convolution over tokens: `x [T, C]`, `weight [C, K]` (or `[C, 1, K]`):
    `y[t, c] = bias[c] + sum_j weight[c, j] * x[t - K + 1 + j, c]` (zeros before the start), then
    SiLU when `activation` is 'silu'/'swish'. Float32 math, rounded once to x's dtype."""
    if activation not in CONV_ACTIVATIONS:
        raise ValueError(f"causal_conv1d: activation={activation!r} is not one of {CONV_ACTIVATIONS}")
    weight = weight.reshape(weight.shape[0], -1)
    channels, width = weight.shape
    if x.dim() != 2 or x.shape[1] != channels:
        raise ValueError(f"causal_conv1d: x must be [tokens, {channels}], got {tuple(x.shape)}")
    compute = _mixer_compute(x)
    xt = F.pad(x.to(compute).t().unsqueeze(0), (width - 1, 0))
    y = F.conv1d(xt, weight.to(compute).unsqueeze(1), None if bias is None else bias.to(compute),
                 groups=channels)[0].t()
    if activation is not None:
        y = F.silu(y)
    return y.to(x.dtype)


def selective_scan(u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                   D: torch.Tensor | None, z: torch.Tensor | None, delta_bias: torch.Tensor | None,
                   delta_softplus: bool = True) -> torch.Tensor:
    """Mamba-1 selective scan, sequential: `u, delta, z [T, D]`, `A [D, N]`, `B, C [T, N]`.

    `dt = softplus(delta + delta_bias)`; `h_t = exp(dt_t A) h_{t-1} + dt_t u_t B_t` (h_0 = 0,
    `[D, N]`); `y_t = h_t C_t + D u_t`; `y *= silu(z)`. Float32, rounded once to u's dtype."""
    compute = _mixer_compute(u)
    dt = delta.to(compute)
    if delta_bias is not None:
        dt = dt + delta_bias.to(compute)
    if delta_softplus:
        dt = F.softplus(dt)
    uc, Bc, Cc = u.to(compute), B.to(compute), C.to(compute)
    decay = torch.exp(dt.unsqueeze(-1) * A.to(compute))                  # [T, D, N]
    drive = (dt * uc).unsqueeze(-1) * Bc.unsqueeze(1)                     # [T, D, N]
    state = torch.zeros_like(decay[0])
    ys = []
    for t in range(u.shape[0]):
        state = decay[t] * state + drive[t]
        ys.append(state @ Cc[t])
    y = torch.stack(ys) if ys else uc.new_zeros(uc.shape)
    if D is not None:
        y = y + D.to(compute) * uc
    if z is not None:
        y = y * F.silu(z.to(compute))
    return y.to(u.dtype)


def ssd_scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
             D: torch.Tensor | None, dt_bias: torch.Tensor | None, z: torch.Tensor | None = None,
             dt_softplus: bool = True, dt_limit: tuple[float, float] = (0.0, float("inf"))) -> torch.Tensor:
    """Mamba-2 state-space duality scan, sequential: `x [T, H, P]`, `dt [T, H]`, `A, D, dt_bias [H]`,
    `B, C [T, G, N]` (head h reads group `h // (H // G)`), `z [T, H, P]` or None.

    `dt = clamp(softplus(dt + dt_bias), dt_limit)`; `h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T`
    (`[H, P, N]`, h_0 = 0); `y_t = h_t C_t + D x_t`; `y *= silu(z)`. Float32, rounded once."""
    tokens, heads, _ = x.shape
    groups = B.shape[1]
    if heads % groups or B.shape != C.shape or B.shape[0] != tokens or dt.shape != (tokens, heads):
        raise ValueError(f"ssd_scan: shapes do not fit: x {tuple(x.shape)}, dt {tuple(dt.shape)}, "
                         f"B {tuple(B.shape)}, C {tuple(C.shape)}")
    compute = _mixer_compute(x)
    dtc = dt.to(compute)
    if dt_bias is not None:
        dtc = dtc + dt_bias.to(compute)
    if dt_softplus:
        dtc = F.softplus(dtc)
    if dt_limit != (0.0, float("inf")):
        dtc = dtc.clamp(dt_limit[0], dt_limit[1])
    per_group = heads // groups
    Bh = B.to(compute).repeat_interleave(per_group, dim=1)                # [T, H, N]
    Ch = C.to(compute).repeat_interleave(per_group, dim=1)
    xc = x.to(compute)
    decay = torch.exp(dtc * A.to(compute))                                # [T, H]
    state = xc.new_zeros(heads, x.shape[2], B.shape[2])                    # [H, P, N]
    ys = []
    for t in range(tokens):
        state = decay[t, :, None, None] * state + (dtc[t, :, None] * xc[t]).unsqueeze(-1) * Bh[t].unsqueeze(1)
        ys.append(torch.einsum("hpn,hn->hp", state, Ch[t]))
    y = torch.stack(ys) if ys else xc.new_zeros(xc.shape)
    if D is not None:
        y = y + D.to(compute)[:, None] * xc
    if z is not None:
        y = y * F.silu(z.to(compute))
    return y.to(x.dtype)
