"""The rms_norm IR ops' semantics (docs/plugin-api.md §3) and the RMSNorm layer built on them."""

from __future__ import annotations

import pytest
import torch

from reference_impl import ir
from reference_impl.layers.layernorm import RMSNorm


def _golden_rms(x, weight, eps, variance_size=None):
    """Straightforward float64 restatement, rounding to the input dtype where the spec says."""
    x64 = x.double()
    var = x64[..., :variance_size] if variance_size else x64
    normed = (x64 * torch.rsqrt(var.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return normed if weight is None else normed * weight


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("variance_size", [None, 48])
@pytest.mark.parametrize("with_weight", [True, False])
def test_rms_norm_native_semantics(dtype, variance_size, with_weight):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 96, generator=g).to(dtype)
    w = (torch.randn(96, generator=g) * 0.1 + 1).to(dtype) if with_weight else None
    out = ir.ops.rms_norm(x, w, 1e-6, variance_size)
    assert out.dtype == dtype and out.shape == x.shape
    atol, rtol = ir.ops.rms_norm.get_tolerance(dtype)
    torch.testing.assert_close(out, _golden_rms(x, w, 1e-6, variance_size), atol=atol, rtol=rtol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_add_rms_norm_semantics(dtype):
    g = torch.Generator().manual_seed(1)
    x, r = (torch.randn(4, 64, generator=g).to(dtype) for _ in range(2))
    w = torch.randn(64, generator=g).to(dtype)
    out, residual = ir.ops.fused_add_rms_norm(x, r, w, 1e-5)
    s = x.float() + r.float()
    assert torch.equal(residual, s.to(dtype))
    expected = (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5)).to(dtype) * w
    torch.testing.assert_close(out, expected)


def test_layer_matches_ir_and_uses_maybe_inplace_for_residual():
    layer = RMSNorm(32, eps=1e-5)
    with torch.no_grad():
        layer.weight.copy_(torch.linspace(0.5, 1.5, 32))
    x, r = torch.randn(3, 32), torch.randn(3, 32)
    torch.testing.assert_close(layer(x), ir.ops.rms_norm(x, layer.weight, 1e-5))
    expected = ir.ops.fused_add_rms_norm(x, r, layer.weight, 1e-5)
    calls = []
    op = ir.ops.fused_add_rms_norm

    def spy_inplace(x, x_residual, weight, epsilon, variance_size=None):
        calls.append("inplace")
        out, res = op.native_fn(x, x_residual, weight, epsilon, variance_size)
        x_residual.copy_(res)
        x.copy_(out)
        return x, x_residual

    op.register_impl("spy_inplace", inplace=True)(spy_inplace)
    try:
        with op.set_priority(["spy_inplace"]):
            xc, rc = x.clone(), r.clone()
            out, residual = layer(xc, rc)
        assert calls == ["inplace"]
        assert out.data_ptr() == xc.data_ptr() and residual.data_ptr() == rc.data_ptr()
        torch.testing.assert_close(out, expected[0])
        torch.testing.assert_close(residual, expected[1])
    finally:
        op.remove_impl("spy_inplace")


def test_layer_options_and_errors():
    layer = RMSNorm(64, var_hidden_size=16, has_weight=False)
    x = torch.randn(2, 64)
    assert layer.weight is None
    torch.testing.assert_close(layer(x), _golden_rms(x, None, 1e-6, 16))
    assert RMSNorm(64, var_hidden_size=64).variance_size_override is None
    with pytest.raises(ValueError, match="var_hidden_size=65"):
        RMSNorm(64, var_hidden_size=65)
    with pytest.raises(ValueError, match="expected last dim 64"):
        RMSNorm(64)(torch.randn(2, 32))
