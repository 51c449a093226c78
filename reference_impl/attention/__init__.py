"""Attention backends and the paged KV cache, as vLLM 0.32 defines them (docs/attention.md).

`backend` holds the contract (AttentionBackend, AttentionImpl, AttentionMetadataBuilder,
CommonAttentionMetadata), `registry` the backend registry, `reference` the pure-torch paged backend,
`oracle` the float64 semantics the `attention` check family grades against, `layer` the `Attention`
layer that selects its backend through the current platform.
"""

from reference_impl.attention.backend import (
    AttentionBackend,
    AttentionImpl,
    AttentionLayer,
    AttentionMetadataBuilder,
    AttentionSelectorConfig,
    AttentionSpec,
    AttentionType,
    CommonAttentionMetadata,
    MultipleOf,
)
from reference_impl.attention.registry import AttentionBackendEnum, register_backend, resolve

__all__ = [
    "AttentionBackend",
    "AttentionBackendEnum",
    "AttentionImpl",
    "AttentionLayer",
    "AttentionMetadataBuilder",
    "AttentionSelectorConfig",
    "AttentionSpec",
    "AttentionType",
    "CommonAttentionMetadata",
    "MultipleOf",
    "register_backend",
    "resolve",
]
