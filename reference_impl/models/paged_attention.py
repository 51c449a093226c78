"""The decoder's attention through the platform's attention backend, over the paged KV cache (models/kv_cache.py).

Every decoder layer's attention is an `Attention` layer (reference_impl/attention/layer.py) on the backend the
current platform selects (`Platform.get_attn_backend_cls`), or on the one the model is built with (the model
check's native run uses REFERENCE). `DecoderAttention` holds one model's layers: the block size all their
backends take, one metadata builder per distinct (backend, cache spec), and `step(...)`, which plans a batch on
the cache and builds each backend's metadata once for all layers. `DecoderStep.attend(i, ...)` then runs layer
i: its backend writes the new keys and values (`do_kv_cache_update`) and attends (`forward`).

Under torch.compile attention is one opaque op, `reference_model::paged_attention(q, k, v, positions,
cu_seqlens, seq_lens, decoder, layer)`: no backend's code is traced (ours are not traceable, a vendor's need not
be), the graph holds only tensors sized by the batch's tokens and sequences, so a new batch does not recompile.
The op plans the batch at the first layer and reuses the plan for the others (same tensors, same block tables).
"""

from __future__ import annotations

import dataclasses
import itertools
import weakref
from typing import Any

import torch

from reference_impl.attention import forward_context
from reference_impl.attention.backend import CommonAttentionMetadata
from reference_impl.attention.layer import Attention
from reference_impl.models.kv_cache import DEFAULT_BLOCK_SIZE, KVCache, current_kv_cache

_DECODERS: weakref.WeakValueDictionary[str, DecoderAttention] = weakref.WeakValueDictionary()
_NUMBERS = itertools.count()


def backend_name(backend: type) -> str:
    try:
        return backend.get_name()
    except Exception:  # noqa: BLE001 - a name for messages only
        return backend.__qualname__


class DecoderAttention:
    """One model's attention layers, the block size their backends share, their builders, and batch steps."""

    def __init__(self, layers: list[Attention], block_size: int | None = None):
        if not layers:
            raise ValueError("a decoder needs at least one attention layer")
        self.layers = list(layers)
        self.key = f"decoder#{next(_NUMBERS)}"
        _DECODERS[self.key] = self
        refusing = [backend_name(b) for b in self.backends if block_size and not b.supports_block_size(block_size)]
        if refusing:
            raise ValueError(f"block_size={block_size} is not a KV-cache block size the attention backend "
                             f"{', '.join(refusing)} takes (declared: "
                             f"{self.layers[0].attn_backend.get_supported_kernel_block_sizes()})")
        self.block_size = self._common_block_size(block_size or DEFAULT_BLOCK_SIZE)
        for layer in self.layers:
            layer.block_size = self.block_size
        self.problems = {}
        for layer in self.layers:
            reasons = layer.attn_backend.validate_configuration(
                **layer.selector_config._replace(block_size=self.block_size)._asdict())
            if reasons:
                self.problems[layer.layer_name] = reasons
        self._builders: dict[tuple[type, Any, torch.device], Any] = {}
        self._last: tuple | None = None

    @property
    def backends(self) -> list[type]:
        """The distinct backend classes of the layers, in layer order."""
        return list(dict.fromkeys(layer.attn_backend for layer in self.layers))

    def backend_names(self) -> list[str]:
        return [backend_name(b) for b in self.backends]

    def _common_block_size(self, requested: int) -> int:
        """`requested` if every backend takes it, else the first backend-preferred size they all take."""
        backends = self.backends
        for size in [requested] + [b.get_preferred_block_size(requested) for b in backends]:
            if all(b.supports_block_size(size) for b in backends):
                return size
        declared = "; ".join(f"{backend_name(b)}: {b.get_supported_kernel_block_sizes()}" for b in backends)
        raise ValueError(f"the decoder's attention backends share no KV-cache block size ({declared})")

    # ----- a batch -------------------------------------------------------------------------------
    def _check(self, cache: KVCache) -> None:
        if self.problems:
            name, reasons = next(iter(self.problems.items()))
            layer = next(lay for lay in self.layers if lay.layer_name == name)
            raise ValueError(f"the attention backend {backend_name(layer.attn_backend)} cannot serve {name} "
                             f"(head size {layer.head_size}, {str(layer.dtype).removeprefix('torch.')}, kv cache "
                             f"{layer.kv_cache_dtype}, block {self.block_size}): {'; '.join(reasons)}")
        if len(cache.layers) != len(self.layers):
            raise ValueError(f"cached attention: the cache has {len(cache.layers)} layers, the decoder "
                             f"{len(self.layers)}")
        want = self.layers[0].get_kv_cache_spec()
        have = cache.spec
        if (have.block_size, have.num_kv_heads, have.head_size, have.dtype, have.kv_cache_dtype) != (
                want.block_size, want.num_kv_heads, want.head_size, want.dtype, want.kv_cache_dtype):
            raise ValueError(f"cached attention: the cache holds blocks of {have.block_size} tokens x "
                             f"{have.num_kv_heads} kv heads x head size {have.head_size} ({have.dtype}, "
                             f"{have.kv_cache_dtype}); the decoder's layers need {want.block_size} x "
                             f"{want.num_kv_heads} x {want.head_size} ({want.dtype}, {want.kv_cache_dtype}): "
                             "allocate it with the model's allocate_kv_cache")

    def _builder(self, layer: Attention, device: torch.device):
        spec = layer.get_kv_cache_spec()
        key = (layer.attn_backend, spec, device)
        builder = self._builders.get(key)
        if builder is None:
            names = [lay.layer_name for lay in self.layers
                     if (lay.attn_backend, lay.get_kv_cache_spec()) == (layer.attn_backend, spec)]
            for lay in self.layers:   # a builder may look its layers up by name: this model's, not a later one's
                forward_context.register_layer(lay.layer_name, lay)
            # no config, as the attention family drives builders (docs/attention.md: "our runtime config or None")
            builder = layer.attn_backend.get_builder_cls()(spec, names, None, device)
            self._builders[key] = builder
        return builder

    def step(self, cache: KVCache, positions: torch.Tensor, cu_seqlens: torch.Tensor,
             seq_lens: torch.Tensor) -> DecoderStep:
        """Plan the batch on `cache` (reserving its blocks) and build every backend's metadata once."""
        self._check(cache)
        common = cache.plan(positions, cu_seqlens, seq_lens)
        built: dict[int, Any] = {}
        metadata = []
        for layer in self.layers:
            builder = self._builder(layer, cache.device)
            if id(builder) not in built:
                _check_order(builder, common, layer)
                built[id(builder)] = builder.build(0, common)
            metadata.append(built[id(builder)])
        return DecoderStep(self, cache, common, metadata)

    def step_for(self, cache: KVCache, positions: torch.Tensor, cu_seqlens: torch.Tensor,
                 seq_lens: torch.Tensor) -> DecoderStep:
        """`step`, reused while the tensors' values and the cache's block tables are those it was planned for
        (the compiled op calls this once per layer)."""
        last = self._last
        if (last is not None and last[0]() is cache and last[1] == cache.epoch
                and all(a.shape == b.shape and torch.equal(a, b)
                        for a, b in zip(last[2], (positions, cu_seqlens, seq_lens)))):
            return last[3]
        step = self.step(cache, positions, cu_seqlens, seq_lens)
        self._last = (weakref.ref(cache), cache.epoch, (positions.clone(), cu_seqlens.clone(), seq_lens.clone()),
                      step)
        return step


def _check_order(builder, common: CommonAttentionMetadata, layer: Attention) -> None:
    """A builder with `reorder_batch_threshold` takes its decodes first (vLLM's runner orders them so)."""
    threshold = getattr(builder, "reorder_batch_threshold", None)
    if threshold is None:
        return
    lens = common.query_start_loc_cpu[: common.num_reqs + 1].diff().tolist()
    seen_long = next((i for i, n in enumerate(lens) if n > threshold), None)
    if seen_long is not None and any(n <= threshold for n in lens[seen_long:]):
        raise ValueError(f"the attention backend {backend_name(layer.attn_backend)} takes a batch's decodes (query "
                         f"length <= {threshold}) before its prefills; this batch's query lengths are {lens}")


@dataclasses.dataclass
class DecoderStep:
    """One planned batch: the cache, the common metadata, and each layer's backend metadata."""

    decoder: DecoderAttention
    cache: KVCache
    common: CommonAttentionMetadata
    metadata: list[Any]

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Layer `layer`'s attention of q `[T, H*D]` over the cache after writing k, v `[T, KVH*D]`: `[T, H*D]`."""
        attention = self.decoder.layers[layer]
        return attention(q, k, v, self.cache.layers[layer], self.metadata[layer], self.common.slot_mapping)


@torch.library.custom_op("reference_model::paged_attention", mutates_args=())
def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                    cu_seqlens: torch.Tensor, seq_lens: torch.Tensor, decoder: str, layer: int) -> torch.Tensor:
    """Layer `layer` of decoder `decoder`'s cache write and attention over the current cache, as one op."""
    stack = _DECODERS.get(decoder)
    if stack is None:
        raise KeyError(f"no live decoder {decoder!r} (the model this graph was compiled from is gone)")
    return stack.step_for(current_kv_cache(), positions, cu_seqlens, seq_lens).attend(layer, q, k, v)


@paged_attention.register_fake
def _(q, k, v, positions, cu_seqlens, seq_lens, decoder, layer):
    return q.new_empty(q.shape)
