"""Rotary position embedding layers (docs/catalog.md `rotary_embedding`, `dual_chunk_rotary_embedding`,
`apply_rotary_emb`), one module per concept: `base` (RotaryEmbedding), `scaling` (its context-extension
subclasses LinearScalingRotaryEmbedding, DynamicNTKScalingRotaryEmbedding, Llama3RotaryEmbedding and
YaRNScalingRotaryEmbedding, which only change the cos/sin cache), `dual_chunk` (DualChunkRotaryEmbedding)
and `apply` (ApplyRotaryEmb). All of them rotate through IR `rotary_embedding` / `rotary_embedding_query`.
The names below stay importable from `reference_impl.layers.rotary_embedding`.

The submodules are imported in the order the single module registered its layers (rotary_embedding,
dual_chunk_rotary_embedding, apply_rotary_emb), so CustomOp.op_registry keeps that order.
"""

# isort: off
from reference_impl.layers.rotary_embedding.base import RotaryEmbedding
from reference_impl.layers.rotary_embedding.scaling import (
    DynamicNTKScalingRotaryEmbedding,
    LinearScalingRotaryEmbedding,
    Llama3RotaryEmbedding,
    YaRNScalingRotaryEmbedding,
    yarn_attention_factor,
)
from reference_impl.layers.rotary_embedding.dual_chunk import DualChunkRotaryEmbedding
from reference_impl.layers.rotary_embedding.apply import ApplyRotaryEmb
# isort: on

__all__ = [
    "ApplyRotaryEmb", "DualChunkRotaryEmbedding", "DynamicNTKScalingRotaryEmbedding", "LinearScalingRotaryEmbedding",
    "Llama3RotaryEmbedding", "RotaryEmbedding", "YaRNScalingRotaryEmbedding", "yarn_attention_factor",
]
