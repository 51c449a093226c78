"""MambaMixer, MambaMixer2, Plamo2MambaMixer and ShortConv (one-sequence prefill): the causal conv and
both scans against scalar float64 loops, each mixer against a float64 composition of those loops,
causality, precision, parameter layout and argument errors."""

from __future__ import annotations

import math

import pytest
import torch

from _layer_support import assert_close64, f64
from reference_impl.custom_op import CustomOp
from reference_impl.layers.mamba import (
    MambaMixer,
    MambaMixer2,
    Plamo2MambaMixer,
    ShortConv,
    ShortConvConfig,
    causal_conv1d,
    selective_scan,
    ssd_scan,
)

# IR rms_norm normalizes in float32 even for float64 inputs: mixers with norms agree with the
# float64 formulas to float32 precision.
F32 = {"atol": 1e-5, "rtol": 1e-5}


def _silu(t):
    return t / (1 + torch.exp(-t))


def _softplus(t):
    return torch.log1p(torch.exp(t))


def _rms(x, w, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def _lin(x, layer):
    return x @ layer.weight.T + (0 if layer.bias is None else layer.bias)


def test_registered_names():
    for name, cls in (("mamba_mixer", MambaMixer), ("mamba_mixer2", MambaMixer2),
                      ("plamo2_mamba_mixer", Plamo2MambaMixer), ("short_conv", ShortConv)):
        assert CustomOp.op_registry[name] is cls


# ----- primitives ---------------------------------------------------------------------------------
def _conv_loop(x, w, b, silu):
    T, C = x.shape
    K = w.shape[-1]
    w = w.reshape(C, K)
    y = torch.zeros(T, C, dtype=torch.float64)
    for t in range(T):
        for c in range(C):
            acc = 0.0 if b is None else float(b[c])
            for j in range(K):
                src = t - K + 1 + j
                if src >= 0:
                    acc += float(w[c, j]) * float(x[src, c])
            y[t, c] = acc
    return _silu(y) if silu else y


@pytest.mark.parametrize("bias,act", [(True, "silu"), (False, None)])
def test_causal_conv1d_matches_loop(bias, act):
    x, w = f64(6, 3, seed=1), f64(3, 1, 4, seed=2)
    b = f64(3, seed=3) if bias else None
    assert_close64(causal_conv1d(x, w, b, act), _conv_loop(x, w, b, act == "silu"))


def _selective_scan_loop(u, delta, A, B, C, D, z, delta_bias):
    T, Dn = u.shape
    N = A.shape[1]
    dt = _softplus(delta + delta_bias)
    h = [[0.0] * N for _ in range(Dn)]
    y = torch.zeros(T, Dn, dtype=torch.float64)
    for t in range(T):
        for d in range(Dn):
            acc = 0.0
            for n in range(N):
                h[d][n] = math.exp(float(dt[t, d] * A[d, n])) * h[d][n] + float(dt[t, d] * u[t, d] * B[t, n])
                acc += h[d][n] * float(C[t, n])
            y[t, d] = acc + float(D[d] * u[t, d])
    return y * _silu(z)


def test_selective_scan_matches_loop():
    T, Dn, N = 5, 3, 4
    u, delta, z = f64(T, Dn, seed=4), f64(T, Dn, seed=5), f64(T, Dn, seed=6)
    A = -torch.rand(Dn, N, generator=torch.Generator().manual_seed(7), dtype=torch.float64) - 0.5
    B, C, D, bias = f64(T, N, seed=8), f64(T, N, seed=9), f64(Dn, seed=10), f64(Dn, seed=11)
    assert_close64(selective_scan(u, delta, A, B, C, D, z, bias), _selective_scan_loop(u, delta, A, B, C, D, z, bias))


def _ssd_loop(x, dt, A, B, C, D, dt_bias, z=None):
    T, H, P = x.shape
    G, N = B.shape[1], B.shape[2]
    dtp = _softplus(dt + dt_bias)
    state = torch.zeros(H, P, N, dtype=torch.float64)
    y = torch.zeros(T, H, P, dtype=torch.float64)
    for t in range(T):
        for h in range(H):
            g = h // (H // G)
            for p in range(P):
                for n in range(N):
                    state[h, p, n] = (math.exp(float(dtp[t, h] * A[h])) * state[h, p, n]
                                      + float(dtp[t, h] * x[t, h, p] * B[t, g, n]))
                y[t, h, p] = float(state[h, p] @ C[t, g]) + float(D[h] * x[t, h, p])
    return y if z is None else y * _silu(z)


@pytest.mark.parametrize("groups,gated", [(1, False), (2, True)])
def test_ssd_scan_matches_loop(groups, gated):
    T, H, P, N = 4, 4, 3, 2
    x, dt = f64(T, H, P, seed=12), f64(T, H, seed=13)
    A = -torch.linspace(0.5, 2.0, H, dtype=torch.float64)
    B, C = f64(T, groups, N, seed=14), f64(T, groups, N, seed=15)
    D, dt_bias = f64(H, seed=16), f64(H, seed=17) * 0.1
    z = f64(T, H, P, seed=18) if gated else None
    assert_close64(ssd_scan(x, dt, A, B, C, D, dt_bias, z), _ssd_loop(x, dt, A, B, C, D, dt_bias, z))


def test_ssd_scan_is_the_selective_scan_with_one_decay_per_head():
    # One head per channel (P = 1), one group: Mamba-2's scalar A is Mamba-1's A row held constant.
    T, H, N = 5, 3, 4
    x, dt, B, C = f64(T, H, 1, seed=19), f64(T, H, seed=20), f64(T, 1, N, seed=21), f64(T, 1, N, seed=22)
    A, D, bias = -torch.tensor([0.5, 1.0, 1.5], dtype=torch.float64), f64(H, seed=23), f64(H, seed=24)
    ssd = ssd_scan(x, dt, A, B, C, D, bias)[..., 0]
    mamba1 = selective_scan(x[..., 0], dt, A[:, None].expand(H, N), B[:, 0], C[:, 0], D, None, bias)
    assert_close64(ssd, mamba1)


# ----- mixers -------------------------------------------------------------------------------------
def _seeded(layer, seed=0):
    """float64 parameters: matrices N(0, 1/fan_in), vectors near 1, A negative, dt biases small."""
    layer = layer.double()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            r = torch.randn(p.shape, generator=g, dtype=torch.float64)
            if name == "A":
                p.copy_(-(r.abs() + 0.5))
            elif p.dim() >= 2:
                p.copy_(r / math.sqrt(p.shape[-1]))
            elif "bias" in name:
                p.copy_(r * 0.1)
            else:
                p.copy_(r * 0.1 + 1.0)
    return layer


def _mamba1_reference(m, h):
    x, z = _lin(h, m.in_proj).chunk(2, -1)
    x = _conv_loop(x, m.conv1d.weight, m.conv1d.bias, True)
    ts, B, C = _lin(x, m.x_proj).split([m.time_step_rank, m.ssm_state_size, m.ssm_state_size], -1)
    if m.use_rms_norm:
        eps = m.dt_layernorm.variance_epsilon
        ts, B, C = (_rms(t, n.weight, eps) for t, n in ((ts, m.dt_layernorm), (B, m.b_layernorm),
                                                          (C, m.c_layernorm)))
    y = _selective_scan_loop(x, ts @ m.dt_proj.weight.T, m.A, B, C, m.D, z, m.dt_proj.bias)
    return _lin(y, m.out_proj)


@pytest.mark.parametrize("use_rms_norm,use_bias", [(False, False), (True, True)])
def test_mamba_mixer_matches_reference(use_rms_norm, use_bias):
    m = _seeded(MambaMixer(12, 3, 4, 8, 2, use_conv_bias=True, use_bias=use_bias, use_rms_norm=use_rms_norm))
    h = f64(6, 12, seed=30)
    out = m(h)
    assert out.shape == (6, 12)
    assert_close64(out, _mamba1_reference(m, h), **(F32 if use_rms_norm else {}))


def _mamba2_reference(m, h):
    T, I, GN = h.shape[0], m.intermediate_size, m.n_groups * m.ssm_state_size
    z, xbc, dt = _lin(h, m.in_proj).split([I, m.conv_dim, m.num_heads], -1)
    xbc = _conv_loop(xbc, m.conv1d.weight, m.conv1d.bias, True)
    x, B, C = xbc.split([I, GN, GN], -1)
    y = _ssd_loop(x.reshape(T, m.num_heads, -1), dt, m.A, B.reshape(T, m.n_groups, -1),
                  C.reshape(T, m.n_groups, -1), m.D, m.dt_bias).reshape(T, I)
    gated = y * _silu(z)
    if m.norm.use_rms_norm:
        group = I // m.n_groups
        gated = torch.cat([_rms(gated[:, g * group:(g + 1) * group], 1.0, m.norm.variance_epsilon)
                           for g in range(m.n_groups)], -1) * m.norm.weight
    return _lin(gated, m.out_proj)


@pytest.mark.parametrize("groups,use_rms_norm", [(1, True), (2, True), (2, False)])
def test_mamba_mixer2_matches_reference(groups, use_rms_norm):
    m = _seeded(MambaMixer2(10, 2, 3, 8, use_conv_bias=True, use_bias=False, n_groups=groups, num_heads=4,
                            head_dim=2, use_rms_norm=use_rms_norm))
    assert m.conv_dim == 8 + 2 * groups * 2 and m.in_proj.weight.shape == (8 + m.conv_dim + 4, 10)
    h = f64(5, 10, seed=31)
    assert_close64(m(h), _mamba2_reference(m, h), **F32)


def _plamo2_reference(m, h):
    T = h.shape[0]
    gate, x = _lin(h, m.in_proj).chunk(2, -1)
    x = _conv_loop(x, m.conv1d.weight, None, True)
    B, C, ts = _lin(x, m.bcdt_proj).split([m.ssm_state_size, m.ssm_state_size, m.time_step_rank], -1)
    eps = m.dt_norm.variance_epsilon
    ts, B, C = _rms(ts, m.dt_norm.weight, eps), _rms(B, m.B_norm.weight, eps), _rms(C, m.C_norm.weight, eps)
    heads = (T, m.num_heads, m.head_dim)
    y = _ssd_loop(x.reshape(heads), _lin(ts, m.dt_proj), m.A, B[:, None], C[:, None], m.D, m.dt_bias,
                  gate.reshape(heads))
    return _lin(y.reshape(T, -1), m.out_proj)


def test_plamo2_mixer_matches_reference_and_default_rank():
    m = _seeded(Plamo2MambaMixer(8, mamba_d_state=3, mamba_d_conv=3, mamba_num_heads=2, hidden_size_per_head=3,
                                 time_step_rank=4))
    h = f64(5, 8, seed=32)
    assert_close64(m(h), _plamo2_reference(m, h), **F32)
    assert Plamo2MambaMixer(2048, 16, 4, 2, 8).time_step_rank == 128
    assert Plamo2MambaMixer(256, 16, 4, 2, 8).time_step_rank == 64


@pytest.mark.parametrize("bias", [False, True])
def test_short_conv_matches_reference(bias):
    m = _seeded(ShortConv(ShortConvConfig(conv_L_cache=3, conv_bias=bias), 6, layer_idx=0))
    h = f64(5, 6, seed=33)
    B, C, x = _lin(h, m.in_proj).chunk(3, -1)
    expected = _lin(C * _conv_loop(B * x, m.conv.weight, m.conv.bias, False), m.out_proj)
    assert_close64(m(h), expected)
    names = {n for n, _ in m.named_parameters()}
    assert names == ({"in_proj.weight", "conv.weight", "out_proj.weight"}
                     | ({"in_proj.bias", "conv.bias", "out_proj.bias"} if bias else set()))


MIXERS = [
    lambda: MambaMixer(12, 3, 4, 8, 2, True, False, True),
    lambda: MambaMixer2(10, 2, 3, 8, True, False, n_groups=2, num_heads=4, head_dim=2),
    lambda: Plamo2MambaMixer(8, 3, 3, 2, 3, time_step_rank=4),
    lambda: ShortConv(ShortConvConfig(3, True), 8, 0),
]


@pytest.mark.parametrize("make", MIXERS, ids=["mamba", "mamba2", "plamo2", "short_conv"])
def test_mixers_are_causal(make):
    m = _seeded(make(), seed=5)
    h = f64(7, m.hidden_size, seed=34)
    out = m(h)
    later = h.clone()
    later[5:] += 2.0
    changed = m(later)
    assert_close64(changed[:5], out[:5])
    assert not torch.allclose(changed[5:], out[5:])
    assert_close64(m(h[:3]), out[:3])      # a prefix alone gives the prefix's outputs


@pytest.mark.parametrize("make", MIXERS, ids=["mamba", "mamba2", "plamo2", "short_conv"])
def test_mixers_keep_the_parameter_dtype_and_name_bad_inputs(make):
    m = make()
    out = m.to(torch.bfloat16)(torch.randn(4, m.hidden_size).to(torch.bfloat16))
    assert out.dtype == torch.bfloat16 and out.shape == (4, m.hidden_size) and torch.isfinite(out).all()
    with pytest.raises(ValueError, match=rf"hidden_states \[tokens, {m.hidden_size}\] \(one sequence\), got "
                                         rf"\(1, 4, {m.hidden_size}\)"):
        m(torch.randn(1, 4, m.hidden_size).to(torch.bfloat16))


@pytest.mark.parametrize("make,error,match", [
    (lambda: MambaMixer(12, 3, 4, 8, 2, True, False, False, tp_size=2), NotImplementedError, "tp_size=2"),
    (lambda: MambaMixer(12, 0, 4, 8, 2, True, False, False), ValueError, "ssm_state_size=0"),
    (lambda: MambaMixer(12, 3, 4, 8, 2, True, False, False, activation="gelu"), ValueError, "activation='gelu'"),
    (lambda: MambaMixer(12, 3, 4, 8, 2, True, False, False, is_lora_enabled=True), NotImplementedError, "LoRA"),
    (lambda: MambaMixer2(10, 2, 3, 8, True, False, num_heads=3, head_dim=2), ValueError,
     r"num_heads \* head_dim = 6 must equal intermediate_size=8"),
    (lambda: MambaMixer2(10, 2, 3, 8, True, False, n_groups=3, num_heads=4, head_dim=2), ValueError,
     "n_groups=3 must divide num_heads=4"),
    (lambda: MambaMixer2(10, 2, 3, 8, True, False, num_heads=4, head_dim=2, tp_size=4), NotImplementedError,
     "tp_size=4"),
    (lambda: Plamo2MambaMixer(8, 3, 0, 2, 3), ValueError, "mamba_d_conv=0"),
    (lambda: ShortConv(ShortConvConfig(0), 8, 0), ValueError, "conv_L_cache=0"),
    (lambda: ShortConv(ShortConvConfig(3), 8, 0, tp_size=2), NotImplementedError, "tp_size=2"),
    (lambda: ShortConv(ShortConvConfig(3), 8, 0, quant_config=object()), NotImplementedError, "quant_config"),
])
def test_bad_construction(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_causal_conv1d_and_scan_errors():
    with pytest.raises(ValueError, match=r"x must be \[tokens, 3\]"):
        causal_conv1d(torch.randn(4, 2), torch.randn(3, 4), None)
    with pytest.raises(ValueError, match="activation='relu'"):
        causal_conv1d(torch.randn(4, 3), torch.randn(3, 4), None, "relu")
    with pytest.raises(ValueError, match="shapes do not fit"):
        ssd_scan(torch.randn(4, 3, 2), torch.randn(4, 3), torch.randn(3), torch.randn(4, 2, 2), torch.randn(4, 2, 2),
                 None, None)
