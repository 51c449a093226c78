"""The rotary embedding a decoder config asks for: plain RoPE or one of transformers' context-extension
rope types (linear, dynamic, llama3, yarn), as the matching RotaryEmbedding layer class."""

from __future__ import annotations

import dataclasses

import torch

from reference_impl.layers.rotary_embedding import (
    DynamicNTKScalingRotaryEmbedding,
    LinearScalingRotaryEmbedding,
    Llama3RotaryEmbedding,
    RotaryEmbedding,
    YaRNScalingRotaryEmbedding,
)

ROPE_TYPES = ("linear", "dynamic", "llama3", "yarn")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """A checkpoint's rope scaling (transformers' `rope_parameters` beyond `rope_theta`).

    `factor` for every type; `original_max_position_embeddings` for llama3 and yarn;
    `low_freq_factor` / `high_freq_factor` for llama3; the rest for yarn (transformers' defaults).
    """

    rope_type: str
    factor: float
    original_max_position_embeddings: int | None = None
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True

    def __post_init__(self):
        if self.rope_type not in ROPE_TYPES:
            raise ValueError(f"rope_type {self.rope_type!r} is not supported; supported: default, "
                             f"{', '.join(ROPE_TYPES)}")
        if self.rope_type in ("llama3", "yarn") and self.original_max_position_embeddings is None:
            raise ValueError(f"rope_type {self.rope_type!r} needs original_max_position_embeddings")
        if self.rope_type == "llama3" and (self.low_freq_factor is None or self.high_freq_factor is None):
            raise ValueError("rope_type 'llama3' needs low_freq_factor and high_freq_factor")


def build_rotary(head_dim: int, max_position: int, theta: float, scaling: RopeScaling | None,
                 dtype: torch.dtype) -> RotaryEmbedding:
    """Neox-style rotary embedding over the whole head with a `[max_position, head_dim]` cos/sin cache."""
    args = (head_dim, head_dim, max_position, theta, True)
    if scaling is None:
        return RotaryEmbedding(*args, dtype)
    if scaling.rope_type == "linear":
        return LinearScalingRotaryEmbedding(*args, scaling.factor, dtype)
    if scaling.rope_type == "dynamic":
        return DynamicNTKScalingRotaryEmbedding(*args, scaling.factor, dtype)
    if scaling.rope_type == "llama3":
        return Llama3RotaryEmbedding(*args, dtype, scaling.factor, scaling.low_freq_factor, scaling.high_freq_factor,
                                     scaling.original_max_position_embeddings)
    return YaRNScalingRotaryEmbedding(*args, scaling.factor, dtype, scaling.original_max_position_embeddings,
                                      beta_fast=scaling.beta_fast, beta_slow=scaling.beta_slow,
                                      mscale=scaling.mscale, mscale_all_dim=scaling.mscale_all_dim,
                                      attention_factor=scaling.attention_factor, truncate=scaling.truncate)
