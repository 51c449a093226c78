"""DualChunkRotaryEmbedding (`dual_chunk_rotary_embedding`): the rotary embedding of dual chunk
attention, five query rotations and one key rotation through IR `rotary_embedding_query`."""

from __future__ import annotations

import torch

from reference_impl import ir
from reference_impl.custom_op import CustomOp
from reference_impl.ir.cases import randn
from reference_impl.ir.ops.rotary import cos_sin_rows
from reference_impl.ir.tolerances import ELEMENTWISE_TOLERANCES
from reference_impl.layers.cases import LayerCase, declare_cases
from reference_impl.layers.rotary_embedding.base import _check_rotary_dims, _on_device


@CustomOp.register("dual_chunk_rotary_embedding")
class DualChunkRotaryEmbedding(CustomOp):
    """Rotary embedding for dual chunk attention (Qwen2.5-1M), following vLLM's native form.

    With `chunk_len = chunk_size - local_size`, keys rotate at `position % chunk_len`; the query
    is rotated five ways and concatenated on the last dim: intra-chunk (`position % chunk_len`),
    successive (`(position % chunk_len) + chunk_len`, clamped at chunk_size), inter (the fixed
    successive position of `chunk_len - 1`), successive-critical (unclamped) and inter-critical
    (`(position % chunk_len) + chunk_size`). As in vLLM 0.32: the caches are computed in float32 and
    cast to `dtype`; the rotation runs in the promotion of the query's and the layer's dtypes (a float32
    layer returns float32 for a half query); one token (leading dim 1) comes back without it:
    query `(5 * heads * head_size,)`, key `(kv_heads * head_size,)`.
    """

    def __init__(self, head_size: int, rotary_dim: int, max_position_embeddings: int, base: float,
                 is_neox_style: bool, dtype: torch.dtype, chunk_size: int, local_size: int,
                 *, enforce_enable: bool = False):
        super().__init__(enforce_enable=enforce_enable)
        _check_rotary_dims(type(self).__name__, head_size, rotary_dim, max_position_embeddings, base)
        if not 0 <= local_size < chunk_size:
            raise ValueError(f"DualChunkRotaryEmbedding: need 0 <= local_size < chunk_size, got "
                             f"local_size={local_size}, chunk_size={chunk_size}")
        self.head_size = head_size
        self.rotary_dim = rotary_dim
        self.max_position_embeddings = max_position_embeddings
        self.base = base
        self.is_neox_style = is_neox_style
        self.dtype = dtype
        self.chunk_size = chunk_size
        self.local_size = local_size
        self.chunk_len = chunk_len = chunk_size - local_size
        t = torch.arange(chunk_len, dtype=torch.float32)
        k_t = torch.arange(max_position_embeddings, dtype=torch.float32) % chunk_len
        for name, positions in (("cos_sin_q_cache", t),
                                ("cos_sin_qc_cache", (t + chunk_len).clamp(max=chunk_size)),
                                ("cos_sin_k_cache", k_t),
                                ("cos_sin_qc_no_clamp_cache", t + chunk_len),
                                ("cos_sin_q_inter_cache", t + chunk_size)):
            self.register_buffer(name, cos_sin_rows(positions, rotary_dim, base).to(dtype), persistent=False)

    def forward_native(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                       offsets: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        positions = positions + offsets if offsets is not None else positions
        # vLLM multiplies the query by the layer-dtype cos/sin: the result takes the promoted dtype.
        compute = torch.promote_types(query.dtype, self.cos_sin_q_cache.dtype)
        query, key = query.to(compute), key.to(compute)

        def rotate(pos, x, cache):
            return ir.ops.rotary_embedding_query(pos, x, self.head_size, _on_device(cache, x), self.is_neox_style)

        key_out = rotate(positions, key, self.cos_sin_k_cache)
        in_chunk = positions % self.chunk_len
        inter = torch.full_like(in_chunk, self.chunk_len - 1)
        query_out = torch.cat((
            rotate(in_chunk, query, self.cos_sin_q_cache),
            rotate(in_chunk, query, self.cos_sin_qc_cache),
            rotate(inter, query, self.cos_sin_qc_cache),
            rotate(in_chunk, query, self.cos_sin_qc_no_clamp_cache),
            rotate(in_chunk, query, self.cos_sin_q_inter_cache),
        ), dim=-1)
        return query_out.squeeze(0), key_out.squeeze(0)   # vLLM's `.squeeze(0)`: one token loses its dim

    def extra_repr(self) -> str:
        return (f"head_size={self.head_size}, rotary_dim={self.rotary_dim}, "
                f"max_position_embeddings={self.max_position_embeddings}, base={self.base}, "
                f"is_neox_style={self.is_neox_style}, chunk_size={self.chunk_size}, local_size={self.local_size}")


# ----- conformance cases --------------------------------------------------------------------------
def _dual_chunk_case(name, tokens, q_heads, kv_heads, head_size, rotary_dim, neox, *, offsets=False,
                     level="quick", layer_dtype=None):
    """`layer_dtype`: the layer's dtype pinned (float32 with half inputs: the output is float32)."""
    chunk_size, local_size, max_position = 64, 16, 512

    def make_kwargs(dtype):
        return {"head_size": head_size, "rotary_dim": rotary_dim, "max_position_embeddings": max_position,
                "base": 10000.0, "is_neox_style": neox, "dtype": layer_dtype or dtype, "chunk_size": chunk_size,
                "local_size": local_size}

    def make_inputs(dtype, device, gen):
        limit = max_position // 2 if offsets else max_position
        positions = torch.randint(0, limit, (tokens,), generator=gen).to(device)
        q = randn((tokens, q_heads * head_size), dtype, device, gen)
        k = randn((tokens, kv_heads * head_size), dtype, device, gen)
        if offsets:
            return (positions, q, k, torch.randint(0, limit, (tokens,), generator=gen).to(device))
        return (positions, q, k)

    return LayerCase(name, make_kwargs, make_inputs, level=level,
                     dtypes=(torch.float16, torch.bfloat16) if layer_dtype else None)


declare_cases(DualChunkRotaryEmbedding, tolerances=ELEMENTWISE_TOLERANCES, cases=[
    _dual_chunk_case("tokens=9,heads=4/2,head=64,neox", 9, 4, 2, 64, 64, True),
    _dual_chunk_case("tokens=9,heads=4/2,head=64,gptj", 9, 4, 2, 64, 64, False),
    _dual_chunk_case("tokens=5,heads=2/1,head=80,rot=32,neox,offsets", 5, 2, 1, 80, 32, True, offsets=True),
    _dual_chunk_case("tokens=1,heads=1/1,head=32,neox", 1, 1, 1, 32, 32, True),
    _dual_chunk_case("tokens=1,heads=2/1,head=64,rot=32,gptj", 1, 2, 1, 64, 32, False),
    _dual_chunk_case("tokens=6,heads=2/1,head=64,layer=float32", 6, 2, 1, 64, 64, True, layer_dtype=torch.float32),
])
