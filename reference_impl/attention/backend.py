"""The attention-backend contract, with vLLM 0.32's names and semantics (vllm/v1/attention/backend.py).

A backend is a class of static/class methods naming its impl and metadata-builder classes and declaring
what it supports; the impl computes attention over a paged KV cache and writes the result into the
`output` it is given; the builder turns the batch's `CommonAttentionMetadata` into the impl's own
metadata. Where we differ from vLLM (no VllmConfig, a plain `AttentionSpec`) is in docs/attention.md.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, ClassVar, NamedTuple, Protocol

import torch

# kv_cache_dtype names a backend may declare; "auto" stores the model dtype, the fp8 ones store fp8 bits
# in torch.uint8 ("fp8" is "fp8_e4m3", as in vLLM).
FP8_KV_DTYPES = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
KV_CACHE_DTYPES = ("auto", "float16", "bfloat16", *FP8_KV_DTYPES)


class AttentionType(str, enum.Enum):
    """Which tokens attend to which; a str so it passes through torch.compile as a constant."""

    DECODER = "decoder"                  # causal self-attention over the paged cache
    ENCODER = "encoder"                  # encoder self-attention of an encoder-decoder model
    ENCODER_ONLY = "encoder_only"        # bidirectional self-attention within the batch, no cache
    ENCODER_DECODER = "encoder_decoder"  # decoder queries over encoder keys/values


@dataclasses.dataclass(frozen=True)
class MultipleOf:
    """A block-size declaration: any multiple of `base`."""

    base: int

    def __repr__(self) -> str:
        return f"MultipleOf({self.base})"


class AttentionSelectorConfig(NamedTuple):
    """What a layer asks of its backend; `Platform.get_attn_backend_cls` selects on it (vLLM's field names)."""

    head_size: int
    dtype: torch.dtype
    kv_cache_dtype: str | None
    block_size: int | None
    use_mla: bool = False
    has_sink: bool = False
    use_sparse: bool = False
    use_mm_prefix: bool = False
    use_per_head_quant_scales: bool = False
    attn_type: str = AttentionType.DECODER
    has_sliding_window: bool = False
    use_non_causal: bool = False
    use_batch_invariant: bool = False
    use_kv_connector: bool = False
    use_pcp: bool = False
    use_adaptive_verification: bool = False
    use_dcp: bool = False
    use_rswa: bool = False


@dataclasses.dataclass(frozen=True)
class AttentionSpec:
    """One layer's KV cache: what vLLM's `FullAttentionSpec`/`SlidingWindowSpec` say (block size, heads, dtype)."""

    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: torch.dtype                   # the model dtype
    kv_cache_dtype: str = "auto"
    sliding_window: int | None = None

    @property
    def cache_dtype(self) -> torch.dtype:
        """The torch dtype of the cache tensor: the model dtype for "auto"/"float16"/"bfloat16", uint8 for fp8."""
        return kv_cache_torch_dtype(self.kv_cache_dtype, self.dtype)

    def cache_shape(self, num_blocks: int) -> tuple[int, int, int, int]:
        """The per-layer logical cache shape `[num_blocks, num_kv_heads, block_size, 2 * head_size]` (LBHNC)."""
        return (num_blocks, self.num_kv_heads, self.block_size, 2 * self.head_size)


def kv_cache_torch_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """The cache tensor's torch dtype for a kv_cache_dtype name (uint8 holding fp8 bits for the fp8 names)."""
    if kv_cache_dtype == "auto":
        return model_dtype
    if kv_cache_dtype in FP8_KV_DTYPES:
        return torch.uint8
    if kv_cache_dtype in ("float16", "bfloat16"):
        return getattr(torch, kv_cache_dtype)
    raise ValueError(f"kv_cache_dtype {kv_cache_dtype!r} is not one of {KV_CACHE_DTYPES}")


@dataclasses.dataclass
class CommonAttentionMetadata:
    """Per-batch metadata shared by every layer and backend (vLLM 0.32's field names and meaning).

    Requests are packed: request i's new tokens are `query[query_start_loc[i]:query_start_loc[i+1]]`, its
    keys are positions `[0, seq_lens[i])` of which the last `query_len` are new, found through
    `block_table_tensor[i]` (slot = block * block_size + offset). `slot_mapping[t]` is where token t's key
    and value are written; < 0 (padding) is never written. `max_seq_len` may be an upper bound.
    """

    query_start_loc: torch.Tensor          # int32 [B+1]
    query_start_loc_cpu: torch.Tensor      # int32 [B+1], on the CPU
    seq_lens: torch.Tensor                 # int32 [B]: context + new tokens
    num_reqs: int
    num_actual_tokens: int                 # tokens past this are padding
    max_query_len: int
    max_seq_len: int
    block_table_tensor: torch.Tensor       # int32 [B, max_blocks_per_req]
    slot_mapping: torch.Tensor             # int64 [T]
    causal: bool | torch.Tensor = True
    encoder_seq_lens: torch.Tensor | None = None
    positions: torch.Tensor | None = None

    def batch_size(self) -> int:
        return self.seq_lens.shape[0]

    def naive_query_lens(self) -> torch.Tensor:
        return self.query_start_loc[1:] - self.query_start_loc[:-1]

    def replace(self, **kwargs) -> CommonAttentionMetadata:
        return dataclasses.replace(self, **kwargs)


class AttentionLayer(Protocol):
    """What an impl reads from the layer it serves: the q/k/v quantization scales."""

    _q_scale: torch.Tensor
    _k_scale: torch.Tensor
    _v_scale: torch.Tensor
    _q_scale_float: float
    _k_scale_float: float
    _v_scale_float: float


class AttentionBackend:
    """An attention backend: static/class methods only, as in vLLM 0.32 (never instantiated).

    Declarations a platform selects on and the `attention` family checks against behaviour: dtypes, KV
    cache dtypes, kernel block sizes, head sizes, and the capability predicates.
    """

    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16]
    supported_kv_cache_dtypes: ClassVar[list[str]] = ["auto", "float16", "bfloat16"]
    # False: the layer calls `impl.do_kv_cache_update` before `impl.forward`, which then reads the cache only
    forward_includes_kv_cache_update: ClassVar[bool] = True

    @staticmethod
    def get_name() -> str:
        raise NotImplementedError

    @staticmethod
    def get_impl_cls() -> type[AttentionImpl]:
        raise NotImplementedError

    @staticmethod
    def get_builder_cls() -> type[AttentionMetadataBuilder]:
        raise NotImplementedError

    @classmethod
    def full_cls_name(cls) -> tuple[str, str]:
        return (cls.__module__, cls.__qualname__)

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec: Any = None) -> list[int | MultipleOf]:
        return [MultipleOf(1)]

    @classmethod
    def supports_block_size(cls, block_size: int | None) -> bool:
        """A block size some declared size divides (a manager block may be k kernel blocks, as in vLLM)."""
        if block_size is None:
            return True
        sizes = cls.get_supported_kernel_block_sizes()
        if not sizes:
            return True
        return any(block_size % (s.base if isinstance(s, MultipleOf) else s) == 0 for s in sizes)

    @classmethod
    def get_preferred_block_size(cls, default_block_size: int) -> int:
        sizes = cls.get_supported_kernel_block_sizes()
        if not sizes or cls.supports_block_size(default_block_size):
            return default_block_size
        return min(s.base if isinstance(s, MultipleOf) else s for s in sizes)

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        """[] = any head size."""
        return []

    @classmethod
    def supports_head_size(cls, head_size: int) -> bool:
        sizes = cls.get_supported_head_sizes()
        return not sizes or head_size in sizes

    @classmethod
    def supports_dtype(cls, dtype: torch.dtype) -> bool:
        return dtype in cls.supported_dtypes

    @classmethod
    def supports_kv_cache_dtype(cls, kv_cache_dtype: str | None) -> bool:
        if kv_cache_dtype is None:
            return True
        return not cls.supported_kv_cache_dtypes or kv_cache_dtype in cls.supported_kv_cache_dtypes

    @classmethod
    def is_mla(cls) -> bool:
        return False

    @classmethod
    def is_sparse(cls) -> bool:
        return False

    @classmethod
    def supports_sink(cls) -> bool:
        return False

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return False

    @classmethod
    def supports_non_causal(cls) -> bool:
        """Non-causal (bidirectional) attention over the paged cache of a decoder (`causal=False`)."""
        return False

    @classmethod
    def supports_alibi_sqrt(cls) -> bool:
        return False

    @classmethod
    def supports_mm_prefix(cls) -> bool:
        return False

    @classmethod
    def supports_per_head_quant_scales(cls) -> bool:
        return False

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == AttentionType.DECODER

    @classmethod
    def supports_combination(cls, head_size: int, dtype: torch.dtype, kv_cache_dtype: str | None,
                             block_size: int | None, use_mla: bool, has_sink: bool, use_sparse: bool,
                             use_mm_prefix: bool, device_capability: Any = None) -> str | None:
        """A reason a combination of otherwise supported values is not, or None."""
        return None

    @classmethod
    def validate_configuration(cls, head_size: int, dtype: torch.dtype, kv_cache_dtype: str | None,
                               block_size: int | None, use_mla: bool = False, has_sink: bool = False,
                               use_sparse: bool = False, use_mm_prefix: bool = False,
                               use_per_head_quant_scales: bool = False, device_capability: Any = None,
                               attn_type: str = AttentionType.DECODER, has_sliding_window: bool = False,
                               use_non_causal: bool = False, **_other_flags: bool) -> list[str]:
        """The reasons this backend cannot serve the configuration (vLLM's wording); [] when it can. The
        keyword names equal `AttentionSelectorConfig`'s fields, so `validate_configuration(**cfg._asdict())`
        works; flags of vLLM features we do not model (pcp, dcp, ...) are accepted and ignored."""
        reasons = []
        if not cls.supports_head_size(head_size):
            reasons.append("head_size not supported")
        if not cls.supports_dtype(dtype):
            reasons.append("dtype not supported")
        if not cls.supports_kv_cache_dtype(kv_cache_dtype):
            reasons.append("kv_cache_dtype not supported")
        if not cls.supports_block_size(block_size):
            reasons.append("block_size not supported")
        if use_mm_prefix and not cls.supports_mm_prefix():
            reasons.append("partial multimodal token full attention not supported")
        if use_mla != cls.is_mla():
            reasons.append("MLA not supported" if use_mla else "non-MLA not supported")
        if has_sink and not cls.supports_sink():
            reasons.append("attention sinks not supported")
        if use_sparse != cls.is_sparse():
            reasons.append("sparse not supported" if use_sparse else "non-sparse not supported")
        if use_per_head_quant_scales and not cls.supports_per_head_quant_scales():
            reasons.append("per-head quant scales not supported")
        if not cls.supports_attn_type(attn_type):
            reasons.append(f"attention type {AttentionType(attn_type).value} not supported")
        if has_sliding_window and not cls.supports_sliding_window():
            reasons.append("sliding window not supported")
        if use_non_causal and not cls.supports_non_causal():
            reasons.append("non-causal attention not supported")
        combination = cls.supports_combination(head_size, dtype, kv_cache_dtype, block_size, use_mla, has_sink,
                                               use_sparse, use_mm_prefix, device_capability)
        if combination is not None:
            reasons.append(combination)
        return reasons


class AttentionMetadataBuilder:
    """Builds a backend's metadata from `CommonAttentionMetadata`, once per batch, shared by the layers named.

    `reorder_batch_threshold` not None: the runner orders each batch decodes (query_len <= threshold) first.
    """

    reorder_batch_threshold: ClassVar[int | None] = None

    def __init__(self, kv_cache_spec: AttentionSpec, layer_names: list[str], config: Any, device: torch.device):
        self.kv_cache_spec = kv_cache_spec
        self.layer_names = list(layer_names)
        self.config = config
        self.device = torch.device(device)

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> Any:
        """The backend's metadata for one batch (`common_prefix_len` is always 0, as in vLLM 0.32)."""
        raise NotImplementedError


class AttentionImpl:
    """One layer's attention computation over the paged cache (vLLM 0.32's constructor and forward).

    `forward` must write the result into `output[:num_actual_tokens]` (what it returns is ignored by the
    layer); with `attn_metadata=None` (warm-up) it returns `output` untouched.
    """

    supports_quant_query_input: ClassVar[bool] = False

    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int | None = None,
                 alibi_slopes: list[float] | None = None, sliding_window: int | None = None,
                 kv_cache_dtype: str = "auto", logits_soft_cap: float | None = None,
                 attn_type: str = AttentionType.DECODER, kv_sharing_target_layer_name: str | None = None,
                 sinks: torch.Tensor | None = None, **extra: Any) -> None:
        raise NotImplementedError

    def forward(self, layer: AttentionLayer, query: torch.Tensor, key: torch.Tensor | None,
                value: torch.Tensor | None, kv_cache: torch.Tensor, attn_metadata: Any, output: torch.Tensor,
                output_scale: torch.Tensor | None = None,
                output_block_scale: torch.Tensor | None = None) -> torch.Tensor:
        raise NotImplementedError

    def do_kv_cache_update(self, layer: AttentionLayer, key: torch.Tensor, value: torch.Tensor,
                           kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        """Write `key[t]`, `value[t]` at `slot_mapping[t]` of `kv_cache` for every t with a slot >= 0."""
        raise NotImplementedError
