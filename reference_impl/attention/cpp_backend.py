"""The C++ CPU paged-attention backend (`CPP`): the contract's impl and builder around the `reference_cpu`
kernels `reshape_and_cache` and `paged_attention` (csrc/cpu/attention.cpp).

The reference backend's cache shape and semantics (`[num_blocks, num_kv_heads, block_size, 2 * head_size]`,
model dtype or fp8 codes in uint8; slots < 0 skipped; fp32 compute, one rounding), with the kernels' own
packing inside each (block, head): the keys transposed, then the values as rows (`as_token_rows` reads it
back as the reference backend's token rows). Declared exactly: decoder self-attention (causal or not)
over the cache; fp32, fp16, bf16; kv cache dtypes auto, fp8, fp8_e4m3, fp8_e5m2 (not "float16"/"bfloat16"
naming a cache dtype other than the model's); any block size and head size; sliding window, soft cap,
ALiBi, sinks. The kernels build on first use (the `cpp` IR provider's library); `available()` says whether
they can be built here.
"""

from __future__ import annotations

import dataclasses

import torch

from reference_impl.attention.backend import (
    AttentionBackend,
    AttentionImpl,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
    MultipleOf,
)
from reference_impl.attention.registry import register_backend
from reference_impl.kernels import _cpp_build

NAME = "CPP"
CLASS_PATH = "reference_impl.attention.cpp_backend.CppAttentionBackend"
KV_CACHE_DTYPES = ["auto", "fp8", "fp8_e4m3", "fp8_e5m2"]


def available() -> bool:
    """Whether the C++ kernels can be built (or are built) here: a compiler, ninja and the sources."""
    return _cpp_build.toolchain_problem() is None


def as_token_rows(kv_cache: torch.Tensor) -> torch.Tensor:
    """A copy of a cache the CPP kernels wrote, in the contract's token rows (the reference backend's
    packing): `[num_blocks, num_kv_heads, block_size, 2 * head_size]`, token t of a block in row t.

    The kernels keep the contract's shape but pack each (block, head) their own way: the keys transposed
    (`[head_size, block_size]`), then the values as rows (`[block_size, head_size]`); or, for the bf16 caches
    the AMX path keeps in pairs (`reference_cpu::paged_cache_pairs`, csrc/cpu/attention.h), the keys
    `[head_size / 2, block_size, 2]` and the values `[block_size / 2, head_size, 2]`."""
    blocks, heads, block_size, width = kv_cache.shape
    head_size = width // 2
    flat = kv_cache.reshape(blocks, heads, block_size * width)
    if (kv_cache.dtype == torch.bfloat16 and kv_cache.device.type == "cpu" and available()
            and _cpp_build.ops().paged_cache_pairs(kv_cache)):
        keys = (flat[..., :block_size * head_size].reshape(blocks, heads, head_size // 2, block_size, 2)
                .permute(0, 1, 3, 2, 4).reshape(blocks, heads, block_size, head_size))
        values = (flat[..., block_size * head_size:].reshape(blocks, heads, block_size // 2, head_size, 2)
                  .permute(0, 1, 2, 4, 3).reshape(blocks, heads, block_size, head_size))
        return torch.cat([keys, values], dim=-1)
    keys = flat[..., :block_size * head_size].reshape(blocks, heads, head_size, block_size).transpose(2, 3)
    values = flat[..., block_size * head_size:].reshape(blocks, heads, block_size, head_size)
    return torch.cat([keys, values], dim=-1)


@dataclasses.dataclass
class CppAttentionMetadata:
    """The kernel's view of a batch: int32 tensors on the kernels' device, sized to the batch's requests."""

    num_actual_tokens: int
    query_start_loc: torch.Tensor  # int32 [B+1]
    seq_lens: torch.Tensor         # int32 [B]
    block_table: torch.Tensor      # int32 [B, max_blocks]
    slot_mapping: torch.Tensor     # int64 [T]
    causal: bool


class CppAttentionMetadataBuilder(AttentionMetadataBuilder):
    backend_name = NAME
    # The kernels' device: None = the CPU (the C++ kernels); a GPU backend's builder keeps the batch's device.
    kernel_device: str | None = "cpu"

    def _int32(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(device=self.kernel_device or t.device, dtype=torch.int32)

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> CppAttentionMetadata:
        m = common_attn_metadata
        if isinstance(m.causal, torch.Tensor):
            raise NotImplementedError(f"the {self.backend_name} attention backend takes causal as a bool, not a "
                                      "per-token tensor")
        n = m.num_reqs
        qsl = m.query_start_loc_cpu if self.kernel_device == "cpu" else m.query_start_loc
        return CppAttentionMetadata(num_actual_tokens=m.num_actual_tokens, query_start_loc=self._int32(qsl[: n + 1]),
                                    seq_lens=self._int32(m.seq_lens[:n]),
                                    block_table=self._int32(m.block_table_tensor[:n]), slot_mapping=m.slot_mapping,
                                    causal=bool(m.causal))


class CppAttentionImpl(AttentionImpl):
    """The impl over `reference_cpu`'s ops; a subclass serves another library with the same op signatures by
    overriding `backend_name`, `kv_cache_dtypes` and `_ops`."""

    backend_name = NAME
    kv_cache_dtypes = tuple(KV_CACHE_DTYPES)

    @staticmethod
    def _ops():
        return _cpp_build.ops()

    def __init__(self, num_heads, head_size, scale, num_kv_heads=None, alibi_slopes=None, sliding_window=None,
                 kv_cache_dtype="auto", logits_soft_cap=None, attn_type=AttentionType.DECODER,
                 kv_sharing_target_layer_name=None, sinks=None, **extra):
        if extra:
            raise NotImplementedError(f"the {self.backend_name} attention backend takes no {', '.join(sorted(extra))}")
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}")
        if AttentionType(attn_type) != AttentionType.DECODER:
            raise NotImplementedError(f"the {self.backend_name} attention backend has no "
                                      f"{AttentionType(attn_type).value} attention "
                                      "(decoder self-attention over the paged cache only)")
        if kv_cache_dtype not in self.kv_cache_dtypes:
            raise NotImplementedError(f"the {self.backend_name} attention backend has no kv_cache_dtype "
                                      f"{kv_cache_dtype!r} (supported: {', '.join(self.kv_cache_dtypes)})")
        if sliding_window is not None and sliding_window < 1:
            raise ValueError(f"sliding_window={sliding_window} must be >= 1 (None: no window)")
        if logits_soft_cap is not None and logits_soft_cap < 0:
            raise ValueError(f"logits_soft_cap={logits_soft_cap} must be positive (None or 0: no cap)")
        if sinks is not None and tuple(sinks.shape) != (num_heads,):
            raise ValueError(f"sinks has shape {tuple(sinks.shape)}, expected ({num_heads},)")
        if alibi_slopes is not None and len(alibi_slopes) != num_heads:
            raise ValueError(f"alibi_slopes has {len(alibi_slopes)} values, expected {num_heads}")
        self.num_heads, self.head_size, self.scale = num_heads, head_size, float(scale)
        self.num_kv_heads = num_kv_heads
        self.alibi_slopes = None if alibi_slopes is None else torch.tensor(alibi_slopes, dtype=torch.float32)
        self.sliding_window = sliding_window
        self.kv_cache_dtype = kv_cache_dtype
        self.logits_soft_cap = float(logits_soft_cap or 0.0)
        self.attn_type = AttentionType(attn_type)
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        self.sinks = None if sinks is None else sinks.detach().to(device="cpu", dtype=torch.float32)

    def _heads(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        return x if x.dim() == 3 else x.view(x.shape[0], heads, self.head_size)

    def do_kv_cache_update(self, layer, key, value, kv_cache, slot_mapping) -> None:
        key, value = self._heads(key, self.num_kv_heads), self._heads(value, self.num_kv_heads)
        slots = slot_mapping[: key.shape[0]].to(torch.int64)
        self._ops().reshape_and_cache(key, value, kv_cache, slots, self.kv_cache_dtype,
                                           layer._k_scale_float, layer._v_scale_float)

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale=None,
                output_block_scale=None):
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError(f"the {self.backend_name} attention backend has no fused output quantization")
        if attn_metadata is None:
            return output
        m = attn_metadata
        out = self._heads(output, self.num_heads)
        for name in ("alibi_slopes", "sinks"):  # per-head parameters follow the query's device
            t = getattr(self, name)
            if t is not None and t.device != query.device:
                setattr(self, name, t.to(query.device))
        self._ops().paged_attention(
            out, self._heads(query, self.num_heads), kv_cache, m.query_start_loc, m.seq_lens, m.block_table,
            self.scale, m.causal, self.sliding_window or -1, self.logits_soft_cap, self.alibi_slopes, self.sinks,
            self.kv_cache_dtype, layer._k_scale_float, layer._v_scale_float)
        return output


@register_backend(NAME, CLASS_PATH)
class CppAttentionBackend(AttentionBackend):
    """Decoder attention over the paged cache with the C++ CPU kernels: any block and head size, fp32/fp16/bf16,
    auto and fp8 (e4m3, e5m2) caches, sliding window, soft cap, ALiBi, sinks, causal or not."""

    supported_dtypes = [torch.float32, torch.float16, torch.bfloat16]
    supported_kv_cache_dtypes = list(KV_CACHE_DTYPES)
    forward_includes_kv_cache_update = False

    @staticmethod
    def get_name() -> str:
        return NAME

    @staticmethod
    def get_impl_cls():
        return CppAttentionImpl

    @staticmethod
    def get_builder_cls():
        return CppAttentionMetadataBuilder

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None):
        return [MultipleOf(1)]

    @classmethod
    def supports_sink(cls) -> bool:
        return True

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return True

    @classmethod
    def supports_non_causal(cls) -> bool:
        return True

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == AttentionType.DECODER
