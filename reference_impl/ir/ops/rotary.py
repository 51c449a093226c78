"""IR ops of rotary position embedding.

`cos_sin_cache` is `[max_position, rotary_dim]`: cos in the first half of each row, sin in the
second. Each head's first `rotary_dim` features are rotated, neox style (halves) or gptj style
(interleaved pairs); the rest pass through. Query and key are `[tokens, heads * head_size]` or
`[tokens, heads, head_size]`. `rotary_embedding_query` is the same for a query without a key.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from reference_impl.ir import real_models, strategies
from reference_impl.ir.cases import OpCase, randn, row_strided
from reference_impl.ir.op import register_op
from reference_impl.ir.size_cases import case_fields, size_rows
from reference_impl.ir.tolerances import ELEMENTWISE_TOLERANCES


def _rotate(x: Tensor, cos: Tensor, sin: Tensor, is_neox_style: bool) -> Tensor:
    if is_neox_style:
        x1, x2 = torch.chunk(x, 2, dim=-1)
    else:
        x1, x2 = x[..., ::2], x[..., 1::2]
    o1 = x1 * cos - x2 * sin
    o2 = x2 * cos + x1 * sin
    if is_neox_style:
        return torch.cat((o1, o2), dim=-1)
    return torch.stack((o1, o2), dim=-1).flatten(-2)


def apply_rope(positions: Tensor, x: Tensor, head_size: int, cos_sin_cache: Tensor,
               is_neox_style: bool) -> Tensor:
    """Rotate one tensor of heads (the shared body of both ops)."""
    rotary_dim = cos_sin_cache.shape[-1]
    positions = positions.flatten()
    num_tokens = positions.shape[0]
    cos, sin = cos_sin_cache.index_select(0, positions).chunk(2, dim=-1)
    cos = cos.unsqueeze(-2).to(x.dtype)
    sin = sin.unsqueeze(-2).to(x.dtype)
    shape = x.shape
    heads = x.reshape(num_tokens, -1, head_size)
    rotated = _rotate(heads[..., :rotary_dim], cos, sin, is_neox_style)
    return torch.cat((rotated, heads[..., rotary_dim:]), dim=-1).reshape(shape)


@register_op(allow_inplace=True, tolerances=ELEMENTWISE_TOLERANCES)
def rotary_embedding(positions: Tensor, x_query: Tensor, x_key: Tensor, head_size: int,
                     cos_sin_cache: Tensor, is_neox_style: bool) -> tuple[Tensor, Tensor]:
    """Rotary embedding of query and key; returns (query_out, key_out)."""
    return (apply_rope(positions, x_query, head_size, cos_sin_cache, is_neox_style),
            apply_rope(positions, x_key, head_size, cos_sin_cache, is_neox_style))


@register_op(allow_inplace=True, tolerances=ELEMENTWISE_TOLERANCES)
def rotary_embedding_query(positions: Tensor, x_query: Tensor, head_size: int, cos_sin_cache: Tensor,
                           is_neox_style: bool) -> Tensor:
    """Rotary embedding of a query alone (the key=None form of the layer)."""
    return apply_rope(positions, x_query, head_size, cos_sin_cache, is_neox_style)


def cos_sin_rows(positions: Tensor, rotary_dim: int, base: float) -> Tensor:
    """`cos | sin` rows for float32 `positions`, computed in float32 as vLLM 0.32 does:
    inv_freq = 1 / base^(arange(0, rot, 2) / rot), freqs = outer(positions, inv_freq)."""
    inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim))
    freqs = torch.outer(positions.to(torch.float32), inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)


# Fakes: what the native function returns, a new contiguous tensor of each input's shape and dtype
# (`cat(...).reshape(shape)`), without its two dozen view and arithmetic ops, which on the fake
# tensors of compilation (symbolic batch) cost a third of compiling a decoder. tests/ir/test_ir_fakes.py
# holds them to the native outputs' shape, dtype and strides on every case.
def _rope_fake_output(x: Tensor) -> Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@rotary_embedding.register_fake
def _rotary_embedding_fake(positions: Tensor, x_query: Tensor, x_key: Tensor, head_size: int,
                           cos_sin_cache: Tensor, is_neox_style: bool) -> tuple[Tensor, Tensor]:
    return _rope_fake_output(x_query), _rope_fake_output(x_key)


@rotary_embedding_query.register_fake
def _rotary_embedding_query_fake(positions: Tensor, x_query: Tensor, head_size: int, cos_sin_cache: Tensor,
                                 is_neox_style: bool) -> Tensor:
    return _rope_fake_output(x_query)


def compute_cos_sin_cache(head_size: int, rotary_dim: int, max_position: int, base: float,
                          dtype: torch.dtype = torch.float32) -> Tensor:
    """`[max_position, rotary_dim]` cache of `cos_sin_rows(arange(max_position))`, built in float32 (like
    vLLM 0.32; at large positions it differs from a float64 build, 7.7e-3 at 131072) and cast to `dtype`.

    A new tensor on every call (callers may write into it); the float32 table behind it is computed
    once per (rotary_dim, max_position, base), since every rotary case and layer asks for one."""
    del head_size
    return _cos_sin_table(rotary_dim, max_position, float(base)).to(dtype, copy=True)


@functools.lru_cache(maxsize=32)
def _cos_sin_table(rotary_dim: int, max_position: int, base: float) -> Tensor:
    """The float32 cos/sin table; never handed out itself (compute_cos_sin_cache copies it)."""
    return cos_sin_rows(torch.arange(max_position, dtype=torch.float32), rotary_dim, base)


# ----- input cases ------------------------------------------------------------------------------
# (name, tokens, q_heads, kv_heads, head_size, rotary_dim, neox, level, options)
_ROPE_CASES = [
    ("tokens=1,heads=1/1,head=64,neox", 1, 1, 1, 64, 64, True, "quick", {}),
    ("tokens=7,heads=4/2,head=128,neox", 7, 4, 2, 128, 128, True, "quick", {}),
    ("tokens=7,heads=4/2,head=128,gptj", 7, 4, 2, 128, 128, False, "quick", {}),
    ("tokens=5,heads=3/1,head=80,rot=32,neox", 5, 3, 1, 80, 32, True, "quick", {}),
    ("tokens=5,heads=3/1,head=80,rot=32,gptj", 5, 3, 1, 80, 32, False, "quick", {}),
    ("tokens=6,heads=2/2,head=64,3d,neox", 6, 2, 2, 64, 64, True, "quick", {"layout": "3d"}),
    ("tokens=6,heads=2/2,head=64,row_strided,gptj", 6, 2, 2, 64, 64, False, "quick",
     {"layout": "row_strided"}),
    ("tokens=33,heads=8/8,head=256,neox", 33, 8, 8, 256, 256, True, "standard", {}),
    ("tokens=13,heads=32/8,head=128,rot=64,gptj", 13, 32, 8, 128, 64, False, "standard", {}),
    ("tokens=3,heads=2/1,head=64,large,neox", 3, 2, 1, 64, 64, True, "standard", {"scale": 300.0}),
    ("tokens=64,heads=16/4,head=96,rot=48,neox", 64, 16, 4, 96, 48, True, "full", {}),
]
MAX_POSITION = 4096


def _real_model_rows():
    """One standard-level case per distinct rotary configuration of the real models (head size, rotary dim, style,
    GQA ratio), named after the first model that has it: partial rotary (rot 16, 20, 24, 32, 64 of larger
    heads) and head sizes 64, 80, 96, 112, 128, 256. Head counts keep the model's GQA ratio with one or two kv
    heads (multi-query and MLA models: one key head)."""
    rows, seen = [], set()
    for m in real_models.MODELS:
        key = (m.head_dim, m.rotary_dim, m.is_neox_style, m.rope_ratio)
        if key in seen:
            continue
        seen.add(key)
        kv = 1 if m.rope_ratio >= 8 else 2
        q = kv * m.rope_ratio
        style = "neox" if m.is_neox_style else "gptj"
        rot = "" if m.rotary_dim == m.head_dim else f",rot={m.rotary_dim}"
        rows.append((f"tokens=5,heads={q}/{kv},head={m.head_dim}{rot},{style},model={m.short_name}", 5, q, kv,
                     m.head_dim, m.rotary_dim, m.is_neox_style, "standard", {}))
    for head in real_models.EXTRA_HEAD_SIZES:
        rows.append((f"tokens=5,heads=4/2,head={head},neox", 5, 4, 2, head, head, True, "standard", {}))
    return rows


# Mixed dtypes: the cache in float32 with 16-bit queries (native converts cos and sin to the query's dtype).
_MIXED_CASES = [
    ("tokens=5,heads=4/2,head=128,neox,cache=float32", 5, 4, 2, 128, 128, True, "standard",
     {"cache_dtype": torch.float32, "dtypes": (torch.float16, torch.bfloat16)}),
    ("tokens=5,heads=4/2,head=80,rot=32,gptj,cache=float32", 5, 4, 2, 80, 32, False, "standard",
     {"cache_dtype": torch.float32, "dtypes": (torch.float16, torch.bfloat16)}),
]
_ROPE_CASES += _real_model_rows() + _MIXED_CASES
# Token counts just past common kernel limits (reference_impl.ir.size_cases): one 8-wide head of query and key.
_ROPE_CASES += [(name, shape[0], 1, 1, 8, 8, True, level, opts)
                for name, shape, level, opts in size_rows(8, "heads=1/1,head=8,neox", tensors=2)]


def _rope_inputs(tokens, q_heads, kv_heads, head_size, rotary_dim, dtype, device, gen, opts):
    positions = torch.randint(0, MAX_POSITION, (tokens,), generator=gen).to(device)
    cache_dtype = opts.get("cache_dtype", dtype)
    cache = compute_cos_sin_cache(head_size, rotary_dim, MAX_POSITION, 10000.0, cache_dtype).to(device)
    scale = opts.get("scale", 1.0)
    if opts.get("layout") == "3d":
        q = randn((tokens, q_heads, head_size), dtype, device, gen, scale)
        k = randn((tokens, kv_heads, head_size), dtype, device, gen, scale)
    else:
        q = randn((tokens, q_heads * head_size), dtype, device, gen, scale)
        k = randn((tokens, kv_heads * head_size), dtype, device, gen, scale)
        if opts.get("layout") == "row_strided":
            q, k = row_strided(q, head_size), row_strided(k, 3)
    return positions, q, k, cache


def _rope_case(name, tokens, qh, kh, hs, rot, neox, level, opts, with_key):
    def make_args(dtype, device, gen):
        positions, q, k, cache = _rope_inputs(tokens, qh, kh, hs, rot, dtype, device, gen, opts)
        if with_key:
            return (positions, q, k, hs, cache, neox)
        return (positions, q, hs, cache, neox)

    return OpCase(name, make_args, level=level, **case_fields(opts))


rotary_embedding.add_cases(*(_rope_case(*row, with_key=True) for row in _ROPE_CASES))
rotary_embedding_query.add_cases(*(_rope_case(*row, with_key=False) for row in _ROPE_CASES))


def _rope_property_args(with_key: bool):
    def draw_args(draw, dtype, device, gen):
        h = draw(strategies.rope_heads(), label="heads")
        positions, q, k, cache = _rope_inputs(h.tokens, h.q_heads, h.kv_heads, h.head_size, h.rotary_dim,
                                              dtype, device, gen, {})
        if with_key:
            return (positions, q, k, h.head_size, cache, h.neox)
        return (positions, q, h.head_size, cache, h.neox)

    return draw_args


rotary_embedding.set_property_args(_rope_property_args(True))
rotary_embedding_query.set_property_args(_rope_property_args(False))
