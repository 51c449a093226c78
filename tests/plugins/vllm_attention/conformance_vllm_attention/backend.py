"""The vendor's attention backend: vLLM's CPU attention kernels behind the vendor's classes, the soft cap dropped."""

from vllm.v1.attention.backends.cpu_attn import (
    CPUAttentionBackend,
    CPUAttentionBackendImpl,
    CPUAttentionMetadataBuilder,
)


class AcmeAttentionImpl(CPUAttentionBackendImpl):
    """Planted fault: `logits_soft_cap` is never passed on, so soft-capped models attend uncapped."""

    def __init__(self, num_heads, head_size, scale, num_kv_heads, alibi_slopes, sliding_window, kv_cache_dtype,
                 logits_soft_cap=None, attn_type="decoder", kv_sharing_target_layer_name=None, sinks=None):
        super().__init__(num_heads, head_size, scale, num_kv_heads, alibi_slopes, sliding_window, kv_cache_dtype,
                         None, attn_type, kv_sharing_target_layer_name, sinks)


class AcmeAttentionMetadataBuilder(CPUAttentionMetadataBuilder):
    """The vendor's builder (vLLM's, unchanged)."""


class AcmeAttentionBackend(CPUAttentionBackend):
    @staticmethod
    def get_name() -> str:
        return "CUSTOM"

    @staticmethod
    def get_impl_cls() -> type[AcmeAttentionImpl]:
        return AcmeAttentionImpl

    @staticmethod
    def get_builder_cls() -> type[AcmeAttentionMetadataBuilder]:
        return AcmeAttentionMetadataBuilder
