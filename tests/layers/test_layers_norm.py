"""RMSNormGated, GemmaRMSNorm and Mixer2RMSNormGated: float64 formulas written out, the precision
rules (where the cast to the input dtype happens), construction errors and IR dispatch."""

from __future__ import annotations

import pytest
import torch

from _layer_support import assert_close64, counting_provider, f64
from reference_impl.custom_op import CustomOp
from reference_impl.ir.cases import strided
from reference_impl.layers.layernorm import GemmaRMSNorm, RMSNorm, RMSNormGated
from reference_impl.layers.mamba import Mixer2RMSNormGated


# IR rms_norm normalizes in float32 whatever the input dtype (its native semantics), so float64
# runs of these layers agree with the float64 formulas to float32 precision only.
F32 = {"atol": 1e-6, "rtol": 1e-6}


def _rms(x, eps):
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) / x.shape[-1] + eps)


def _silu(t):
    return t / (1 + torch.exp(-t))


def _grouped_rms(x, group, eps):
    return _rms(x.reshape(*x.shape[:-1], -1, group), eps).reshape(x.shape)


def test_registered_names():
    assert CustomOp.op_registry["rms_norm_gated"] is RMSNormGated
    assert CustomOp.op_registry["gemma_rms_norm"] is GemmaRMSNorm
    assert CustomOp.op_registry["mixer2_gated_rms_norm"] is Mixer2RMSNormGated
    assert CustomOp.op_registry["rms_norm"] is RMSNorm


# ----- RMSNormGated -------------------------------------------------------------------------------
def _gated_layer(hidden, **kwargs):
    layer = RMSNormGated(hidden, dtype=torch.float64, **kwargs)
    layer.weight.data = f64(hidden, seed=9) * 0.1 + 1.0
    return layer


@pytest.mark.parametrize("group_size", [None, 16])
@pytest.mark.parametrize("norm_before_gate", [False, True])
@pytest.mark.parametrize("activation", ["swish", "sigmoid"])
def test_rms_norm_gated_matches_formula(group_size, norm_before_gate, activation):
    hidden, eps = 64, 1e-5
    layer = _gated_layer(hidden, eps=eps, group_size=group_size, norm_before_gate=norm_before_gate,
                         activation=activation)
    x, z = f64(5, hidden, seed=1), f64(5, hidden, seed=2)
    act = _silu(z) if activation == "swish" else 1 / (1 + torch.exp(-z))

    def norm(t):
        return _rms(t, eps) if group_size is None else _grouped_rms(t, group_size, eps)

    expected = norm(x) * layer.weight * act if norm_before_gate else norm(x * act) * layer.weight
    assert_close64(layer(x, z), expected, **F32)
    assert_close64(layer(x), norm(x) * layer.weight, **F32)


def test_rms_norm_gated_half_precision_computes_in_float32():
    gen = torch.Generator().manual_seed(12)
    layer = RMSNormGated(128, dtype=torch.bfloat16)
    layer.weight.data = (torch.rand(128, generator=gen) + 0.5).to(torch.bfloat16)
    x = torch.randn(4, 128, generator=gen).to(torch.bfloat16)
    z = torch.randn(4, 128, generator=gen).to(torch.bfloat16)
    out = layer(strided(x), z)
    assert out.dtype == torch.bfloat16
    exact = _rms(x.double() * _silu(z.double()), 1e-5) * layer.weight.double()
    # One rounding at the end: within half a bfloat16 step of the exact value (plus float32 noise).
    assert ((out.double() - exact).abs() <= (2.0 ** -8 + 1e-6) * exact.abs()).all()


@pytest.mark.parametrize("kwargs,match", [({"group_size": 24}, "group_size=24"), ({"group_size": 0}, "group_size=0"),
                                          ({"activation": "relu"}, "activation='relu'")])
def test_rms_norm_gated_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RMSNormGated(64, **kwargs)


# ----- GemmaRMSNorm -------------------------------------------------------------------------------
def _gemma(hidden, eps=1e-6):
    layer = GemmaRMSNorm(hidden, eps)
    layer.weight.data = torch.randn(hidden, generator=torch.Generator().manual_seed(3)) * 0.2
    return layer


def test_gemma_rms_norm_matches_formula():
    layer = _gemma(96).to(torch.float64)
    x, r = f64(4, 96, seed=1), f64(4, 96, seed=2)
    assert_close64(layer(x.clone()), _rms(x, 1e-6) * (1 + layer.weight), **F32)
    out, residual = layer(x.clone(), r.clone())
    assert_close64(out, _rms(x + r, 1e-6) * (1 + layer.weight), **F32)
    assert_close64(residual, x + r, **F32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gemma_rms_norm_casts_after_the_weight_multiply(dtype):
    layer = _gemma(256)
    gen = torch.Generator().manual_seed(11)
    x, r = torch.randn(6, 256, generator=gen).to(dtype), torch.randn(6, 256, generator=gen).to(dtype)
    weight = 1 + layer.weight.double()
    # One rounding, after x * (1 + w): within half a step of the exact value (plus float32 noise).
    # Casting before the multiply rounds twice and lands a full step off somewhere in 1536 values.
    half_step = torch.finfo(dtype).eps / 2 + 1e-6

    def assert_single_rounding(out, exact):
        assert out.dtype == dtype
        assert ((out.double() - exact).abs() <= half_step * exact.abs()).all()

    assert_single_rounding(layer(x), _rms(x.double(), 1e-6) * weight)
    out, residual = layer(x.clone(), r.clone())
    summed = x.float() + r.float()
    torch.testing.assert_close(residual, summed.to(dtype), atol=0, rtol=0)
    # The norm sees the float32 sum, not the rounded residual.
    assert_single_rounding(out, _rms(summed.double(), 1e-6) * weight)


# ----- Mixer2RMSNormGated -------------------------------------------------------------------------
@pytest.mark.parametrize("groups", [1, 4])
def test_mixer2_gated_rms_norm_matches_formula(groups):
    hidden, eps = 64, 1e-6
    layer = Mixer2RMSNormGated(hidden, groups, eps=eps).to(torch.float64)
    layer.weight.data = f64(hidden, seed=4) * 0.1 + 1.0
    x, gate = f64(3, hidden, seed=5), f64(3, hidden, seed=6)
    assert layer.group_size == hidden // groups
    assert_close64(layer(x, gate), layer.weight * _grouped_rms(x * _silu(gate), hidden // groups, eps), **F32)


def test_mixer2_without_norm_only_gates():
    layer = Mixer2RMSNormGated(32, 2, use_rms_norm=False)
    assert layer.weight is None
    x, gate = f64(2, 32, seed=7), f64(2, 32, seed=8)
    assert_close64(layer(x, gate), x * _silu(gate))


def test_mixer2_output_dtype_follows_weight_promotion():
    gen = torch.Generator().manual_seed(13)
    layer = Mixer2RMSNormGated(32, 2)            # float32 weight, as with vLLM's default dtype
    x = torch.randn(2, 32, generator=gen).to(torch.bfloat16)
    gate = torch.randn(2, 32, generator=gen).to(torch.bfloat16)
    out = layer(x, gate)
    assert out.dtype == torch.float32            # weight * normed.to(bfloat16) promotes
    exact = _grouped_rms(x.double() * _silu(gate.double()), 16, 1e-6)
    assert ((out.double() - exact).abs() <= (2.0 ** -8 + 1e-6) * exact.abs()).all()
    torch.set_default_dtype(torch.bfloat16)      # how a vLLM model builds it in bfloat16
    try:
        in_model = Mixer2RMSNormGated(32, 2)
    finally:
        torch.set_default_dtype(torch.float32)
    assert in_model.weight.dtype == torch.bfloat16 and in_model(x, gate).dtype == torch.bfloat16


def test_mixer2_takes_vllms_constructor_arguments_only():
    with pytest.raises(TypeError, match="dtype"):
        Mixer2RMSNormGated(32, 2, dtype=torch.bfloat16)


@pytest.mark.parametrize("hidden,groups", [(64, 5), (64, 0)])
def test_mixer2_rejects_groups_that_do_not_divide(hidden, groups):
    with pytest.raises(ValueError, match=f"full_n_groups={groups}"):
        Mixer2RMSNormGated(hidden, groups)


def test_norm_layers_reject_wrong_hidden_size():
    with pytest.raises(ValueError, match="last dim 64"):
        RMSNormGated(64)(torch.randn(2, 32))
    with pytest.raises(ValueError, match="last dim 64"):
        GemmaRMSNorm(64)(torch.randn(2, 32))
    with pytest.raises(ValueError, match="last dim 64"):
        Mixer2RMSNormGated(64, 2)(torch.randn(2, 32), torch.randn(2, 32))


# ----- IR dispatch --------------------------------------------------------------------------------
def test_layers_go_through_ir_dispatch():
    x, z = torch.randn(3, 64), torch.randn(3, 64)
    with counting_provider("rms_norm") as calls:
        RMSNormGated(64, group_size=16)(x, z)
        GemmaRMSNorm(64)(x)
        Mixer2RMSNormGated(64, 4)(x, z)
    assert len(calls) == 3
    assert calls[0][0].shape == (3, 4, 16)      # grouped statistics through the op's last dim
    assert calls[2][0].shape == (3, 4, 16)
    with counting_provider("fused_add_rms_norm") as calls:
        out, residual = GemmaRMSNorm(64)(x.clone(), z.clone())
    assert len(calls) == 1
    torch.testing.assert_close(residual, x + z)
