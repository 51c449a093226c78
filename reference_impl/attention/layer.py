"""The `Attention` layer: selects its backend through the current platform, writes the cache, runs the impl.

As vLLM 0.32's `Attention`: the backend comes from `current_platform.get_attn_backend_cls(None,
AttentionSelectorConfig(...), num_heads)` (a qualname, resolved by the registry) unless `attn_backend` is
given; the impl is built with vLLM's positional arguments; when the backend says
`forward_includes_kv_cache_update = False` the layer writes the new keys and values through
`impl.do_kv_cache_update` before `impl.forward`. The cache and metadata are passed to `forward` explicitly
(vLLM takes them from a forward context).
"""

from __future__ import annotations

import torch

from reference_impl.attention import forward_context
from reference_impl.attention.backend import AttentionSelectorConfig, AttentionSpec, AttentionType
from reference_impl.attention.registry import resolve


@torch.library.custom_op("reference_attention::unified_attention_with_output", mutates_args=("output", "kv_cache"))
def unified_attention_with_output(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, output: torch.Tensor,
                                  kv_cache: torch.Tensor, layer_name: str) -> None:
    """One layer's cache write and attention as one op (vLLM's opaque attention): the layer, its metadata and
    slot mapping come from the forward context by name, so a compiled graph holds only this call."""
    layer = forward_context.layer_named(layer_name)
    attn_metadata, slot_mapping = forward_context.batch_of(layer_name)
    layer.run_backend(query, key, value, kv_cache, attn_metadata, slot_mapping, output)


@unified_attention_with_output.register_fake
def _(query, key, value, output, kv_cache, layer_name) -> None:
    return None


def select_backend(config: AttentionSelectorConfig, num_heads: int | None = None) -> type:
    """The backend class the current platform selects for `config`."""
    from reference_impl.platforms import get_current_platform

    platform = get_current_platform()
    qualname = platform.get_attn_backend_cls(None, config, num_heads)
    if not isinstance(qualname, str):
        raise TypeError(f"{type(platform).__qualname__}.get_attn_backend_cls returned {type(qualname).__name__}, "
                        "not a class path string")
    return resolve(qualname)


class Attention(torch.nn.Module):
    """Paged attention of one layer; `forward(query, key, value, kv_cache, attn_metadata, slot_mapping)`."""

    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int | None = None,
                 alibi_slopes: list[float] | None = None, block_size: int = 16, kv_cache_dtype: str = "auto",
                 logits_soft_cap: float | None = None, per_layer_sliding_window: int | None = None,
                 prefix: str = "", attn_type: str = AttentionType.DECODER, sinks: torch.Tensor | None = None,
                 attn_backend: type | None = None, dtype: torch.dtype | None = None, k_scale: float = 1.0,
                 v_scale: float = 1.0, block_size_user_specified: bool = False, **extra_impl_args):
        super().__init__()
        self.num_heads, self.head_size = num_heads, head_size
        self.num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        self.dtype = dtype or torch.get_default_dtype()
        self.kv_cache_dtype = kv_cache_dtype
        self.sliding_window = per_layer_sliding_window
        self.attn_type = AttentionType(attn_type)
        self.layer_name = prefix
        self.selector_config = AttentionSelectorConfig(
            head_size=head_size, dtype=self.dtype, kv_cache_dtype=kv_cache_dtype,
            block_size=block_size if block_size_user_specified else None, has_sink=sinks is not None,
            attn_type=self.attn_type, has_sliding_window=per_layer_sliding_window is not None)
        self.attn_backend = attn_backend if attn_backend is not None else select_backend(self.selector_config,
                                                                                        num_heads)
        self.block_size = block_size
        forward_context.register_layer(prefix, self)
        self.set_scales(k_scale, v_scale)
        impl_cls = self.attn_backend.get_impl_cls()
        self.impl = impl_cls(num_heads, head_size, scale, self.num_kv_heads, alibi_slopes, per_layer_sliding_window,
                             kv_cache_dtype, logits_soft_cap, self.attn_type, None, sinks=sinks, **extra_impl_args)

    def set_scales(self, k_scale: float, v_scale: float, q_scale: float = 1.0) -> None:
        """The fp8 scales an impl reads from its layer (`_k_scale` tensors and `_k_scale_float` floats)."""
        for name, value in (("q", q_scale), ("k", k_scale), ("v", v_scale)):
            setattr(self, f"_{name}_scale", torch.tensor(float(value), dtype=torch.float32))
            setattr(self, f"_{name}_scale_float", float(value))

    def get_kv_cache_spec(self) -> AttentionSpec:
        return AttentionSpec(self.block_size, self.num_kv_heads, self.head_size, self.dtype, self.kv_cache_dtype,
                             self.sliding_window)

    def allocate_kv_cache(self, num_blocks: int, device=None) -> torch.Tensor:
        """A zeroed cache of the contract's shape and dtype (block 0 is the null block: never addressed)."""
        spec = self.get_kv_cache_spec()
        return torch.zeros(spec.cache_shape(num_blocks), dtype=spec.cache_dtype, device=device)

    def forward(self, query: torch.Tensor, key: torch.Tensor | None, value: torch.Tensor | None,
                kv_cache: torch.Tensor, attn_metadata=None, slot_mapping: torch.Tensor | None = None,
                opaque: bool = False) -> torch.Tensor:
        """query `[T, H*D]` or `[T, H, D]`, key/value `[T, KVH*D]` or 3-D; returns `[T, H*D]`. With `opaque`, the
        write and attention run as one custom op that reads the metadata and slot mapping from the forward
        context (`forward_context.set_forward_context`); what torch.compile traces is then only that call."""
        tokens = query.shape[0]
        q = query.view(tokens, self.num_heads, self.head_size)
        k = None if key is None else key.view(tokens, self.num_kv_heads, self.head_size)
        v = None if value is None else value.view(tokens, self.num_kv_heads, self.head_size)
        output = torch.empty_like(q)
        if opaque:
            if k is None or v is None:
                raise ValueError(f"attention layer {self.layer_name!r}: the opaque op takes key and value")
            torch.ops.reference_attention.unified_attention_with_output(q, k, v, output, kv_cache, self.layer_name)
        else:
            self.run_backend(q, k, v, kv_cache, attn_metadata, slot_mapping, output)
        return output.view(tokens, self.num_heads * self.head_size)

    def run_backend(self, q, k, v, kv_cache, attn_metadata, slot_mapping, output) -> None:
        """The cache write (when the layer does it) and the impl's forward into `output`."""
        if (not self.attn_backend.forward_includes_kv_cache_update and k is not None and attn_metadata is not None
                and self.attn_type == AttentionType.DECODER):
            if slot_mapping is None:
                raise ValueError(f"attention layer {self.layer_name!r}: the backend writes the cache through "
                                 "do_kv_cache_update, which needs slot_mapping")
            self.impl.do_kv_cache_update(self, k, v, kv_cache, slot_mapping)
        self.impl.forward(self, q, k, v, kv_cache, attn_metadata, output)
