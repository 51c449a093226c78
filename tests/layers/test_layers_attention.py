"""MMEncoderAttention and MultiHeadLatentAttentionWrapper: float64 loop references (softmax per
query, rotary angles written out), varlen isolation, GQA head mapping, causality, rope's shift
invariance, precision, argument errors, and how the composite layer calls its sub-layers."""

from __future__ import annotations

import math

import pytest
import torch

from _layer_support import assert_close64, f64
from reference_impl.config import CompilationConfig, RuntimeConfig, set_current_config
from reference_impl.custom_op import CustomOp
from reference_impl.layers.attention import MMEncoderAttention, MultiHeadLatentAttentionWrapper
from reference_impl.layers.layernorm import RMSNorm
from reference_impl.platforms import activate_platform

# IR rms_norm normalizes in float32 even for float64 inputs, so MLA agrees with float64 formulas
# to float32 precision only.
F32 = {"atol": 2e-6, "rtol": 2e-6}


def _attend(q_rows, k_rows, v_rows, scale):
    """One query against its visible keys, with plain Python softmax arithmetic."""
    out = []
    for q in q_rows:
        logits = [scale * float(q @ k) for k in k_rows]
        top = max(logits)
        weights = [math.exp(s - top) for s in logits]
        total = sum(weights)
        out.append(sum(w / total * v for w, v in zip(weights, v_rows)))
    return torch.stack(out)


def test_registered_names():
    assert CustomOp.op_registry["mm_encoder_attn"] is MMEncoderAttention
    assert CustomOp.op_registry["multi_head_latent_attention"] is MultiHeadLatentAttentionWrapper


# ----- MMEncoderAttention -------------------------------------------------------------------------
def _mm_reference(q, k, v, scale, segments):
    """q [B, S, H, D], k/v [B, Skv, Hkv, D]; segments: list of (start, end) or None (all keys)."""
    batch, seq, heads, _ = q.shape
    per_kv = heads // k.shape[2]
    out = torch.zeros_like(q)
    for b in range(batch):
        for h in range(heads):
            kh = h // per_kv
            for start, end in segments or [(0, seq)]:
                keys = (start, end) if segments else (0, k.shape[1])
                out[b, start:end, h] = _attend(q[b, start:end, h], k[b, keys[0]:keys[1], kh],
                                               v[b, keys[0]:keys[1], kh], scale)
    return out


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2), (6, 1)])
def test_mm_encoder_attention_matches_loop_reference_with_gqa(heads, kv_heads):
    attn = MMEncoderAttention(heads, 8, num_kv_heads=kv_heads)
    assert attn.scale == 8 ** -0.5
    q, k, v = f64(2, 5, heads, 8, seed=1), f64(2, 7, kv_heads, 8, seed=2), f64(2, 7, kv_heads, 8, seed=3)
    expected = _mm_reference(q, k, v, 8 ** -0.5, None)
    out4 = attn(q, k, v)
    assert out4.shape == (2, 5, heads, 8)
    assert_close64(out4, expected)
    out3 = attn(q.flatten(-2), k.flatten(-2), v.flatten(-2))
    assert out3.shape == (2, 5, heads * 8)
    assert_close64(out3, expected.flatten(-2))


def test_mm_encoder_attention_custom_scale():
    q, k, v = f64(1, 4, 2, 8, seed=4), f64(1, 4, 2, 8, seed=5), f64(1, 4, 2, 8, seed=6)
    assert_close64(MMEncoderAttention(2, 8, scale=0.7)(q, k, v), _mm_reference(q, k, v, 0.7, None))


def test_mm_encoder_attention_varlen_segments_attend_only_within_themselves():
    attn = MMEncoderAttention(2, 8, num_kv_heads=1)
    cu = torch.tensor([0, 3, 3, 8, 10], dtype=torch.int32)     # includes an empty segment
    q, k, v = f64(2, 10, 2, 8, seed=7), f64(2, 10, 1, 8, seed=8), f64(2, 10, 1, 8, seed=9)
    out = attn(q, k, v, cu, torch.tensor(5))
    assert_close64(out, _mm_reference(q, k, v, 8 ** -0.5, [(0, 3), (3, 8), (8, 10)]))
    # Changing keys/values of the last segment leaves the first two untouched.
    k2, v2 = k.clone(), v.clone()
    k2[:, 8:] += 5.0
    v2[:, 8:] -= 3.0
    out2 = attn(q, k2, v2, cu)
    assert torch.equal(out2[:, :8], out[:, :8]) and not torch.allclose(out2[:, 8:], out[:, 8:])


def test_mm_encoder_attention_half_precision_rounds_once():
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 6, 2, 16, generator=gen).to(torch.bfloat16) for _ in range(3))
    out = MMEncoderAttention(2, 16)(q, k, v)
    assert out.dtype == torch.bfloat16
    exact = _mm_reference(q.double(), k.double(), v.double(), 0.25, None)
    assert ((out.double() - exact).abs() <= 2.0 ** -8 * exact.abs() + 1e-6).all()


def test_mm_encoder_attention_follows_custom_ops_unless_enforced():
    with set_current_config(RuntimeConfig(CompilationConfig(custom_ops=["none"]))):
        assert MMEncoderAttention(2, 8)._forward_method.__func__ is MMEncoderAttention.forward_native
        enforced = MMEncoderAttention(2, 8, enforce_enable=True)
        assert enforced._forward_method.__func__ is not MMEncoderAttention.forward_native
    with set_current_config(RuntimeConfig(CompilationConfig(custom_ops=["all"]))):
        assert MMEncoderAttention(2, 8)._forward_method.__func__ is not MMEncoderAttention.forward_native


@pytest.mark.parametrize("kwargs,match", [
    (dict(num_heads=4, head_size=8, num_kv_heads=3), "num_heads=4 is not divisible by num_kv_heads=3"),
    (dict(num_heads=0, head_size=8), "num_heads=0"),
    (dict(num_heads=2, head_size=-1), "head_size=-1"),
])
def test_mm_encoder_attention_bad_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MMEncoderAttention(**kwargs)


def test_mm_encoder_attention_bad_inputs():
    attn = MMEncoderAttention(2, 8, num_kv_heads=1)
    q, kv = torch.randn(1, 4, 16), torch.randn(1, 4, 8)
    with pytest.raises(ValueError, match=r"key must be \[batch, seq, 1 \* 8\]"):
        attn(q, q, kv)
    with pytest.raises(ValueError, match=r"query must be"):
        attn(torch.randn(1, 4, 2, 4), kv, kv)
    with pytest.raises(ValueError, match="batch/sequence dims differ"):
        attn(q, kv, torch.randn(1, 5, 8))
    with pytest.raises(ValueError, match=r"must start at 0, not decrease and end at the sequence length 4"):
        attn(q, kv, kv, torch.tensor([0, 3, 2, 4]))
    with pytest.raises(ValueError, match="end at the sequence length 4"):
        attn(q, kv, kv, torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="1-D int tensor"):
        attn(q, kv, kv, torch.tensor([0.0, 4.0]))
    with pytest.raises(ValueError, match=r"query \(4\) and key \(5\) sequence lengths must agree"):
        attn(q, torch.randn(1, 5, 8), torch.randn(1, 5, 8), torch.tensor([0, 4]))


# ----- MultiHeadLatentAttentionWrapper ------------------------------------------------------------
DIMS = dict(hidden_size=32, num_heads=2, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6, kv_lora_rank=12)


def _mla(q_lora_rank, seed=0, **kwargs):
    layer = MultiHeadLatentAttentionWrapper(**{**DIMS, "scale": None, "q_lora_rank": q_lora_rank, **kwargs},
                                            params_dtype=torch.float64, max_position_embeddings=64)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            scale = 0.1 if p.dim() == 1 else p.shape[-1] ** -0.5
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * scale + (p.dim() == 1))
    return layer


def _rms(x, w, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def _rope(x, pos, neox, base=10000.0):
    """Rotate [T, H, d] by angle pos * base^(-2i/d) per pair (neox: halves, gptj: neighbours)."""
    d = x.shape[-1]
    out = x.clone()
    for t in range(x.shape[0]):
        for i in range(d // 2):
            a = float(pos[t]) * base ** (-2 * i / d)
            c, s = math.cos(a), math.sin(a)
            j, k = (i, i + d // 2) if neox else (2 * i, 2 * i + 1)
            out[t, :, j] = x[t, :, j] * c - x[t, :, k] * s
            out[t, :, k] = x[t, :, k] * c + x[t, :, j] * s
    return out


def _mla_reference(layer, positions, h, neox=False):
    n, r, hv, heads = layer.qk_nope_head_dim, layer.qk_rope_head_dim, layer.v_head_dim, layer.num_heads
    eps = layer.kv_a_layernorm.variance_epsilon
    T = h.shape[0]
    if layer.q_lora_rank is not None:
        a = h @ layer.fused_qkv_a_proj.weight.T
        q_c, kv_c, k_pe = a.split([layer.q_lora_rank, layer.kv_lora_rank, r], -1)
        q = _rms(q_c, layer.q_a_layernorm.weight, eps) @ layer.q_b_proj.weight.T
    else:
        q = h @ layer.q_proj.weight.T
        kv_c, k_pe = (h @ layer.kv_a_proj_with_mqa.weight.T).split([layer.kv_lora_rank, r], -1)
    kv = (_rms(kv_c, layer.kv_a_layernorm.weight, eps) @ layer.kv_b_proj.weight.T).view(T, heads, n + hv)
    q = q.view(T, heads, n + r)
    q_pe = _rope(q[..., n:], positions, neox)
    k_pe = _rope(k_pe.view(T, 1, r), positions, neox)
    out = torch.zeros(T, heads, hv, dtype=torch.float64)
    for head in range(heads):
        qh = torch.cat((q[:, head, :n], q_pe[:, head]), -1)
        kh = torch.cat((kv[:, head, :n], k_pe[:, 0]), -1)
        for t in range(T):     # causal: token t sees tokens 0..t
            out[t, head] = _attend(qh[t:t + 1], kh[:t + 1], kv[:t + 1, head, n:], layer.scale)[0]
    return out.reshape(T, heads * hv) @ layer.o_proj.weight.T


@pytest.mark.parametrize("q_lora_rank,neox", [(16, False), (None, True), (None, False)])
def test_mla_matches_float64_reference(q_lora_rank, neox):
    layer = _mla(q_lora_rank, is_neox_style=neox)
    assert layer.scale == 12 ** -0.5
    positions = torch.tensor([3, 4, 5, 9, 0])
    h = f64(5, 32, seed=1)
    out = layer(positions, h)
    assert out.shape == (5, 32)
    assert_close64(out, _mla_reference(layer, positions, h, neox), **F32)
    assert_close64(layer.forward_native(positions, h), out, **F32)


def test_mla_is_causal_and_invariant_to_shifting_all_positions():
    layer = _mla(16, seed=2)
    h = f64(6, 32, seed=3)
    positions = torch.arange(6) + 2
    out = layer(positions, h)
    later = h.clone()
    later[4:] += 1.0
    changed = layer(positions, later)
    assert_close64(changed[:4], out[:4], **F32)
    assert not torch.allclose(changed[4:], out[4:])
    # Rotary scores depend on position differences only (to the float32 precision of the rotary cache,
    # which vLLM 0.32 builds in float32).
    assert_close64(layer(positions + 17, h), out, atol=1e-6, rtol=1e-6)
    assert not torch.allclose(layer(positions.flip(0), h), out)


def test_mla_parameters_and_half_precision():
    layer = MultiHeadLatentAttentionWrapper(**DIMS, scale=0.3, q_lora_rank=None, params_dtype=torch.bfloat16)
    names = {n for n, _ in layer.named_parameters()}
    assert names == {"q_proj.weight", "kv_a_proj_with_mqa.weight", "kv_a_layernorm.weight", "kv_b_proj.weight",
                     "o_proj.weight"}
    assert layer.kv_b_proj.weight.shape == (2 * (8 + 6), 12) and layer.o_proj.weight.shape == (32, 12)
    out = layer(torch.arange(3), torch.randn(3, 32).to(torch.bfloat16))
    assert out.dtype == torch.bfloat16 and out.shape == (3, 32) and layer.scale == 0.3


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(tp_size=2), NotImplementedError, "tp_size=2 is not supported"),
    (dict(num_heads=0), ValueError, "num_heads=0"),
    (dict(q_lora_rank=0), ValueError, "q_lora_rank=0"),
    (dict(qk_rope_head_dim=5), ValueError, "qk_rope_head_dim=5 must be even"),
])
def test_mla_bad_construction(kwargs, error, match):
    with pytest.raises(error, match=match):
        MultiHeadLatentAttentionWrapper(**{**DIMS, "scale": None, "q_lora_rank": None, **kwargs})


def test_mla_bad_inputs():
    layer = MultiHeadLatentAttentionWrapper(**DIMS, scale=None, q_lora_rank=None)
    with pytest.raises(ValueError, match=r"hidden_states \[tokens, 32\], got \(3, 16\)"):
        layer(torch.arange(3), torch.randn(3, 16))
    with pytest.raises(ValueError, match=r"positions must be \[3\], got \(4,\)"):
        layer(torch.arange(4), torch.randn(3, 32))


def test_mla_native_uses_sub_layers_native_while_forward_dispatches_them():
    calls = []

    @CustomOp.register_oot("RMSNorm")
    class CountingRMSNorm(RMSNorm):
        def forward_cpu(self, x, residual=None):
            calls.append(x.shape)
            return self.forward_native(x, residual)

    try:
        # A PluggableLayer's forward dispatches the sub-layers through the current platform: make it the CPU one.
        with activate_platform("cpu"), set_current_config(RuntimeConfig(CompilationConfig(custom_ops=["all"]))):
            layer = MultiHeadLatentAttentionWrapper(**DIMS, scale=None, q_lora_rank=16)
            assert type(layer.kv_a_layernorm) is CountingRMSNorm
            h, positions = torch.randn(3, 32), torch.arange(3)
            native = layer.forward_native(positions, h)
            assert calls == []
            assert not hasattr(layer, "forward_cpu")          # a PluggableLayer: no per-platform forward
            torch.testing.assert_close(layer(positions, h), native)
            assert sorted(calls) == [(3, 12), (3, 16)]
    finally:
        CustomOp.unregister_oot("RMSNorm")
