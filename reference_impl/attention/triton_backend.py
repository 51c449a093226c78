"""The Triton paged-attention backend (`TRITON_PAGED`): the CPP backend's impl and builder over the
`reference_triton` ops (reference_impl/kernels/triton/attention.py), which take the same arguments. Its
cache holds token rows (the reference backend's packing), not the C++ kernels' transposed keys.

Declared exactly: decoder self-attention (causal or not) over the paged cache; fp32, fp16, bf16; kv cache
dtype "auto" only (no fp8); any block size; head sizes up to 512; sliding window, soft cap, ALiBi, sinks. It
runs where the triton provider does (a CUDA/ROCm GPU, or TRITON_INTERPRET=1 with CPU tensors); no platform
selects it by default: a layer asks for it by name or `attn_backend=`.
"""

from __future__ import annotations

from reference_impl.attention.cpp_backend import (
    CppAttentionBackend,
    CppAttentionImpl,
    CppAttentionMetadataBuilder,
)
from reference_impl.attention.registry import register_backend

NAME = "TRITON_PAGED"
CLASS_PATH = "reference_impl.attention.triton_backend.TritonAttentionBackend"
MAX_HEAD_SIZE = 512  # reference_impl.kernels.triton.attention.MAX_HEAD_SIZE (not imported: it imports triton)


def available() -> bool:
    """Whether the Triton kernels can run in this process (triton importable, and a GPU or the interpreter)."""
    from reference_impl.kernels.triton import _env

    return _env.SUPPORTED


class TritonAttentionMetadataBuilder(CppAttentionMetadataBuilder):
    backend_name = NAME
    kernel_device = None  # the batch's own device


class TritonAttentionImpl(CppAttentionImpl):
    backend_name = NAME
    kv_cache_dtypes = ("auto",)

    @staticmethod
    def _ops():
        from reference_impl.kernels.triton import attention

        return attention

    def __init__(self, num_heads, head_size, scale, *args, **kwargs):
        if head_size > MAX_HEAD_SIZE:
            raise NotImplementedError(f"the {NAME} attention backend has no head_size {head_size} "
                                      f"(at most {MAX_HEAD_SIZE})")
        super().__init__(num_heads, head_size, scale, *args, **kwargs)


@register_backend(NAME, CLASS_PATH)
class TritonAttentionBackend(CppAttentionBackend):
    """Decoder attention over the paged cache with the Triton kernels: fp32/fp16/bf16, auto caches only, any block
    size, head sizes up to 512, sliding window, soft cap, ALiBi, sinks, causal or not."""

    supported_kv_cache_dtypes = ["auto"]

    @staticmethod
    def get_name() -> str:
        return NAME

    @staticmethod
    def get_impl_cls():
        return TritonAttentionImpl

    @staticmethod
    def get_builder_cls():
        return TritonAttentionMetadataBuilder

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return list(range(1, MAX_HEAD_SIZE + 1))
