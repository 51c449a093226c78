"""Rotary layers against rotation written as complex multiplication in float64, their caches,
the functional contract, construction errors and IR dispatch."""

from __future__ import annotations

import pytest
import torch

from _layer_support import assert_close64, counting_provider, f64
from reference_impl.custom_op import CustomOp
from reference_impl.ir.cases import row_strided
from reference_impl.layers.rotary_embedding import ApplyRotaryEmb, DualChunkRotaryEmbedding, RotaryEmbedding


def _rotate(x, angles, head_size, neox, cos=None, sin=None):
    """Rotate each head's first 2*half features by `angles` [tokens, half] as complex products
    (or multiply by `cos + i sin` when given, which need not have unit length)."""
    tokens, half = angles.shape
    heads = x.reshape(tokens, -1, head_size)
    rot, rest = heads[..., : 2 * half], heads[..., 2 * half:]
    if neox:
        pairs = torch.complex(rot[..., :half], rot[..., half:])
    else:
        pairs = torch.complex(rot[..., 0::2], rot[..., 1::2])
    factor = torch.polar(torch.ones_like(angles), angles) if cos is None else torch.complex(cos, sin)
    turned = pairs * factor[:, None, :]
    if neox:
        rot = torch.cat((turned.real, turned.imag), dim=-1)
    else:
        rot = torch.stack((turned.real, turned.imag), dim=-1).flatten(-2)
    return torch.cat((rot, rest), dim=-1).reshape(x.shape)


def _angles(positions, rotary_dim, base):
    """The rotation angles as vLLM 0.32 forms them, in float32 (then widened): the caches' cos/sin are of
    these float32 angles, computed in float32 (CACHE32 bounds that last rounding)."""
    inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim))
    return (positions.float()[:, None] * inv_freq[None, :]).double()


CACHE32 = {"atol": 1e-6, "rtol": 1e-6}   # cos/sin of float32 angles, evaluated in float32


def test_registered_names():
    assert CustomOp.op_registry["rotary_embedding"] is RotaryEmbedding
    assert CustomOp.op_registry["dual_chunk_rotary_embedding"] is DualChunkRotaryEmbedding
    assert CustomOp.op_registry["apply_rotary_emb"] is ApplyRotaryEmb


# ----- RotaryEmbedding ----------------------------------------------------------------------------
@pytest.mark.parametrize("neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("head_size,rotary_dim", [(64, 64), (80, 32)])
def test_rotary_embedding_matches_complex_rotation(neox, head_size, rotary_dim):
    layer = RotaryEmbedding(head_size, rotary_dim, 2048, 10000.0, neox, torch.float64)
    positions = torch.tensor([0, 1, 7, 2047, 300])
    q, k = f64(5, 3 * head_size, seed=1), f64(5, head_size, seed=2)
    q_out, k_out = layer(positions, q, k)
    angles = _angles(positions, rotary_dim, 10000.0)
    assert_close64(q_out, _rotate(q, angles, head_size, neox), **CACHE32)
    assert_close64(k_out, _rotate(k, angles, head_size, neox), **CACHE32)


def test_rotary_embedding_cache_and_layouts():
    layer = RotaryEmbedding(64, 32, 128, 500.0, True, torch.float64)
    angles = _angles(torch.arange(128), 32, 500.0)
    built32 = torch.cat((angles.float().cos(), angles.float().sin()), dim=-1)    # in float32, as vLLM builds it
    assert torch.equal(layer.cos_sin_cache, built32.double())
    assert "cos_sin_cache" not in layer.state_dict()        # a derived buffer, as in vLLM
    positions = torch.tensor([3, 100, 5])
    q3 = f64(3, 2, 64, seed=3)                               # [tokens, heads, head_size]
    q_out, none = layer(positions, q3)
    assert none is None and q_out.shape == q3.shape
    assert_close64(q_out, _rotate(q3, _angles(positions, 32, 500.0), 64, True), **CACHE32)
    q_strided = row_strided(f64(3, 128, seed=4), 5)
    assert_close64(layer(positions, q_strided)[0], _rotate(q_strided.contiguous(), _angles(positions, 32, 500.0),
                                                              64, True), **CACHE32)


def test_rotary_embedding_is_functional():
    layer = RotaryEmbedding(32, 32, 64, 10000.0, False, torch.float32)
    positions, q, k = torch.tensor([1, 2]), torch.randn(2, 64), torch.randn(2, 32)
    q_before, k_before = q.clone(), k.clone()
    q_out, k_out = layer(positions, q, k)
    assert torch.equal(q, q_before) and torch.equal(k, k_before)
    assert q_out.data_ptr() != q.data_ptr() and k_out.data_ptr() != k.data_ptr()


@pytest.mark.parametrize("args,match", [((64, 63, 128, 1e4), "rotary_dim=63"), ((64, 66, 128, 1e4), "rotary_dim=66"),
                                        ((64, 0, 128, 1e4), "rotary_dim=0"), ((64, 64, 0, 1e4), "max_position"),
                                        ((0, 0, 128, 1e4), "head_size=0"), ((64, 64, 128, -2.0), "base=-2.0")])
def test_rotary_embedding_rejects_bad_sizes(args, match):
    with pytest.raises(ValueError, match=match):
        RotaryEmbedding(*args, True, torch.float32)


# ----- DualChunkRotaryEmbedding -------------------------------------------------------------------
@pytest.mark.parametrize("neox", [True, False], ids=["neox", "gptj"])
def test_dual_chunk_rotary_matches_vllm_positions(neox):
    head, rot, chunk_size, local_size = 32, 16, 16, 4
    chunk_len = chunk_size - local_size
    layer = DualChunkRotaryEmbedding(head, rot, 256, 10000.0, neox, torch.float64, chunk_size, local_size)
    positions = torch.tensor([0, 5, 11, 12, 40, 255])
    offsets = torch.tensor([0, 1, 0, 3, 0, 0])
    q, k = f64(6, 2 * head, seed=5), f64(6, head, seed=6)
    q_out, k_out = layer(positions - offsets, q, k, offsets)
    p = positions
    within = p % chunk_len
    variants = [within, (within + chunk_len).clamp(max=chunk_size),
                torch.full_like(p, min(2 * chunk_len - 1, chunk_size)), within + chunk_len, within + chunk_size]
    expected_q = torch.cat([_rotate(q, _angles(v, rot, 10000.0), head, neox) for v in variants], dim=-1)
    assert q_out.shape == (6, 5 * 2 * head)
    assert_close64(q_out, expected_q, **CACHE32)
    assert_close64(k_out, _rotate(k, _angles(p % chunk_len, rot, 10000.0), head, neox), **CACHE32)


def test_dual_chunk_rotary_rejects_local_size_not_below_chunk():
    with pytest.raises(ValueError, match="local_size=16, chunk_size=16"):
        DualChunkRotaryEmbedding(32, 32, 64, 1e4, True, torch.float32, 16, 16)


# ----- ApplyRotaryEmb -----------------------------------------------------------------------------
@pytest.mark.parametrize("neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("batch", [None, 2])
def test_apply_rotary_emb_matches_complex_rotation(neox, batch):
    seq, heads, head = 5, 3, 16
    lead = (batch, seq) if batch else (seq,)
    x = f64(*lead, heads, head, seed=7)
    angles = f64(seq, head // 2, seed=8)
    out = ApplyRotaryEmb(is_neox_style=neox)(x, angles.cos(), angles.sin())
    tokens_angles = angles.repeat(batch, 1) if batch else angles
    assert out.shape == x.shape
    assert_close64(out, _rotate(x.reshape(-1, heads * head), tokens_angles, head, neox).reshape(x.shape))


def test_apply_rotary_emb_fp32_compute_returns_input_dtype():
    gen = torch.Generator().manual_seed(14)
    x = torch.randn(4, 2, 8, generator=gen).to(torch.bfloat16)
    angles = torch.rand(4, 4, dtype=torch.float64, generator=gen) * 6
    cos, sin = angles.cos().to(torch.bfloat16), angles.sin().to(torch.bfloat16)
    out = ApplyRotaryEmb(enforce_enable=True, enable_fp32_compute=True)(x, cos, sin)
    assert out.dtype == torch.bfloat16
    exact = _rotate(x.double(), angles, 8, True, cos.double(), sin.double())
    # Computed in float32 and rounded once: within one bfloat16 step of the exact product.
    assert ((out.double() - exact).abs() <= exact.abs() * 2.0 ** -8 + 1e-6).all()


def test_apply_rotary_emb_rejects_mismatched_cos_sin():
    with pytest.raises(ValueError, match="head_size // 2 = 8"):
        ApplyRotaryEmb()(torch.randn(4, 2, 16), torch.randn(4, 4), torch.randn(4, 4))
    with pytest.raises(ValueError, match="one shape"):
        ApplyRotaryEmb()(torch.randn(4, 2, 16), torch.randn(4, 8), torch.randn(3, 8))


# ----- IR dispatch --------------------------------------------------------------------------------
def test_rotary_layers_go_through_ir_dispatch():
    positions, q, k = torch.tensor([1, 2, 3]), torch.randn(3, 64), torch.randn(3, 32)
    with counting_provider("rotary_embedding") as with_key, counting_provider("rotary_embedding_query") as query_only:
        RotaryEmbedding(32, 32, 64, 1e4, True, torch.float32)(positions, q, k)
        RotaryEmbedding(32, 16, 64, 1e4, False, torch.float32)(positions, q)
        DualChunkRotaryEmbedding(32, 32, 64, 1e4, True, torch.float32, 16, 4)(positions, q, k)
        ApplyRotaryEmb()(torch.randn(3, 2, 32), torch.randn(3, 16), torch.randn(3, 16))
    assert len(with_key) == 1
    assert len(query_only) == 1 + 6 + 1     # query-only RoPE, dual chunk (key + 5 query variants), apply
    assert with_key[0][3] == 32 and with_key[0][5] is True     # head_size, is_neox_style reach the op
