"""RotaryEmbedding (`rotary_embedding`): the cos/sin-cache rotary embedding, the class the
context-extension variants (`scaling`) derive from, and the checks and helpers the other rotary layers share.

It uses the functional IR form: query and key are never modified and fresh tensors are returned.
vLLM's CUDA path rotates in place, but its native form is functional too, and callers that still hold
q/k (views of a fused qkv projection, for example) stay safe; the cost is one copy of q/k when an
in-place kernel is selected, which compile passes may remove.
"""

from __future__ import annotations

import torch

from reference_impl import ir
from reference_impl.custom_op import CustomOp
from reference_impl.ir.cases import randn
from reference_impl.ir.ops.rotary import compute_cos_sin_cache
from reference_impl.ir.tolerances import ELEMENTWISE_TOLERANCES
from reference_impl.layers.cases import LayerCase, declare_cases, from_op_cases


def _check_rotary_dims(cls_name: str, head_size: int, rotary_dim: int, max_position: int, base: float) -> None:
    if head_size <= 0:
        raise ValueError(f"{cls_name}: head_size={head_size} must be positive")
    if rotary_dim <= 0 or rotary_dim % 2 or rotary_dim > head_size:
        raise ValueError(f"{cls_name}: rotary_dim={rotary_dim} must be even and in [2, head_size={head_size}]")
    if max_position <= 0:
        raise ValueError(f"{cls_name}: max_position_embeddings={max_position} must be positive")
    if not base > 0:
        raise ValueError(f"{cls_name}: base={base!r} must be positive")


def _on_device(cache: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return cache if cache.device == like.device else cache.to(like.device)


@CustomOp.register("rotary_embedding")
class RotaryEmbedding(CustomOp):
    """Rotary embedding with a `[max_position, rotary_dim]` cos/sin cache (cos | sin halves), built in
    float32 and cast to `dtype` (vLLM 0.32; see compute_cos_sin_cache).

    `forward(positions, query, key=None) -> (query, key)` rotates the first rotary_dim features
    of every head, neox style (halves) or gptj style (interleaved pairs); `key=None` returns
    `(query, None)`. Query/key are `[tokens, heads * head_size]` or `[tokens, heads, head_size]`.
    The cache is cast to the query's dtype for the rotation, as vLLM's native form does.
    `init_cache=False` (vLLM's, for subclasses that build their own cache) registers no cache.
    """

    def __init__(self, head_size: int, rotary_dim: int, max_position_embeddings: int, base: float,
                 is_neox_style: bool, dtype: torch.dtype, init_cache: bool = True, *, enforce_enable: bool = False):
        super().__init__(enforce_enable=enforce_enable)
        _check_rotary_dims(type(self).__name__, head_size, rotary_dim, max_position_embeddings, base)
        self.head_size = head_size
        self.rotary_dim = rotary_dim
        self.max_position_embeddings = max_position_embeddings
        self.base = base
        self.is_neox_style = is_neox_style
        self.dtype = dtype
        if init_cache:
            self.register_buffer("cos_sin_cache", self._compute_cos_sin_cache().to(dtype), persistent=False)

    def _compute_cos_sin_cache(self) -> torch.Tensor:
        """`[max_position_embeddings, rotary_dim]` cos | sin as vLLM 0.32 builds it (subclasses change the
        frequencies or the scale)."""
        return compute_cos_sin_cache(self.head_size, self.rotary_dim, self.max_position_embeddings, self.base,
                                     self.dtype)

    def forward_native(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor | None = None):
        cache = _on_device(self.cos_sin_cache, query)
        if key is None:
            return (ir.ops.rotary_embedding_query(positions, query, self.head_size, cache, self.is_neox_style),
                    None)
        return ir.ops.rotary_embedding(positions, query, key, self.head_size, cache, self.is_neox_style)

    def extra_repr(self) -> str:
        return (f"head_size={self.head_size}, rotary_dim={self.rotary_dim}, "
                f"max_position_embeddings={self.max_position_embeddings}, base={self.base}, "
                f"is_neox_style={self.is_neox_style}")


# ----- conformance cases --------------------------------------------------------------------------
_MAX_POSITION = 4096


def _rope_case(name, tokens, q_heads, kv_heads, head_size, rotary_dim, neox, *, level="quick",
               max_position=_MAX_POSITION, min_position=0):
    """A layer-only case. Positions drawn from [min_position, max_position): near a large max_position the cache's
    float32 angles (vLLM 0.32's build) are far from float64 ones, which a cache built otherwise shows."""
    def make_kwargs(dtype):
        return {"head_size": head_size, "rotary_dim": rotary_dim, "max_position_embeddings": max_position,
                "base": 10000.0, "is_neox_style": neox, "dtype": dtype}

    def make_inputs(dtype, device, gen):
        positions = torch.randint(min_position, max_position, (tokens,), generator=gen).to(device)
        q = randn((tokens, q_heads * head_size), dtype, device, gen)
        k = randn((tokens, kv_heads * head_size), dtype, device, gen)
        return (positions, q, k)

    return LayerCase(name, make_kwargs, make_inputs, level=level)


def _rope_form(args):
    """rotary_embedding(positions, query, key, head_size, cache, neox) as RotaryEmbedding(head_size, the cache's
    rotary_dim and positions, base 10000 (the op cases' cache), neox, the cache's dtype)(positions, query, key); the
    query-only op (no key) as the call with key=None."""
    positions, query, *key, head_size, cache, neox = args
    kwargs = {"head_size": head_size, "rotary_dim": cache.shape[-1], "max_position_embeddings": cache.shape[0],
              "base": 10000.0, "is_neox_style": neox, "dtype": cache.dtype}
    return kwargs, (positions, query, *key)


# Every case of the rotary IR ops (neox and gptj, partial rotary, 3-D and padded rows, large magnitudes, a float32
# cache with 16-bit queries, every real model's rotary configuration) in the layer's call form, then what only the
# layer has: rotary_dim / 2 = 20 at the quick level, and positions near a large max_position.
declare_cases(RotaryEmbedding, tolerances=ELEMENTWISE_TOLERANCES, cases=[
    *from_op_cases(ir.ops.rotary_embedding, _rope_form),
    *from_op_cases(ir.ops.rotary_embedding_query, _rope_form, name=lambda n: f"{n},key=None"),
    # partial rotary with rotary_dim / 2 = 20 (above 8, not a multiple of 8): vLLM 0.32's CPU kernel
    # segfaults on it in bfloat16 neox style (docs/vllm.md)
    _rope_case("tokens=5,heads=2/1,head=64,rot=40,neox", 5, 2, 1, 64, 40, True),
    _rope_case("tokens=8,heads=2/1,head=64,rot=32,max_position=131072,large_positions,neox", 8, 2, 1, 64, 32, True,
               max_position=131072, min_position=100000, level="standard"),
])
