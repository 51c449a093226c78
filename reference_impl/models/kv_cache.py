"""The KV cache of the reference decoder and the attention that reads and writes it.

The cache is contiguous: per layer one key and one value tensor `[max_seqs, max_len, num_kv_heads,
head_dim]`, and sequence `s` of a batch owns row `s`. Contiguous rather than block-paged because a
reference runtime wants the attention it checks to be obviously right: a row is a plain slice, no
block table can be wrong, and decode reads `cache[:batch, :longest]`. Paging saves memory when
ragged batches share a large pool, which the small models and batches run here never need.

`cached_attention` is one opaque torch op (`reference_model::cached_attention`) over packed tokens:
token `t` of sequence `s` (rows `cu_seqlens[s]:cu_seqlens[s + 1]`) at position `positions[t]` first
writes its key and value to `cache[s, positions[t]]`, then attends causally to `cache[s, :positions[t]
+ 1]` (with a sliding `window` W > 0, to the last W of those positions only). Prefill packs whole
prompts (varlen: one segment per sequence); a decode step packs one token per sequence and reads
each row up to its own length `seq_lens[s]`. Like vLLM's attention op, the
cache is found through the forward context (`using_kv_cache`), not passed as an argument, so a
compiled graph holds one opaque call per layer with no cache copies, and its shapes depend only on
the number of tokens and sequences (marked dynamic), never on the sequence lengths.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

import torch
import torch.nn.functional as F


@dataclasses.dataclass
class KVCache:
    """Per-layer key and value tensors `[max_seqs, max_len, num_kv_heads, head_dim]` (this rank's heads)."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]

    @classmethod
    def allocate(cls, num_layers: int, max_seqs: int, max_len: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str) -> KVCache:
        shape = (max_seqs, max_len, num_kv_heads, head_dim)
        return cls([torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)],
                   [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)])

    @property
    def max_seqs(self) -> int:
        return self.keys[0].shape[0]

    @property
    def max_len(self) -> int:
        return self.keys[0].shape[1]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))


_CURRENT: list[KVCache] = []


@contextlib.contextmanager
def using_kv_cache(cache: KVCache) -> Iterator[KVCache]:
    """Make `cache` the one `cached_attention` reads and writes inside the block."""
    _CURRENT.append(cache)
    try:
        yield cache
    finally:
        _CURRENT.pop()


def current_kv_cache() -> KVCache:
    if not _CURRENT:
        raise RuntimeError("cached attention ran outside `using_kv_cache(cache)`: no KV cache is current")
    return _CURRENT[-1]


def _check_fits(cache: KVCache, layer: int, num_seqs: int, positions: torch.Tensor) -> None:
    if not 0 <= layer < len(cache.keys):
        raise ValueError(f"cached attention: layer {layer} is not in the cache ({len(cache.keys)} layers)")
    if num_seqs > cache.max_seqs:
        raise ValueError(f"cached attention: {num_seqs} sequences do not fit the cache's {cache.max_seqs} rows")
    longest = int(positions.max()) + 1 if positions.numel() else 0
    if longest > cache.max_len:
        raise ValueError(f"cached attention: position {longest - 1} does not fit the cache's max_len "
                         f"{cache.max_len}")


@torch.library.custom_op("reference_model::cached_attention", mutates_args=())
def cached_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                     cu_seqlens: torch.Tensor, seq_lens: torch.Tensor, layer: int, num_heads: int,
                     num_kv_heads: int, scale: float, window: int) -> torch.Tensor:
    """Write `k`, `v` ([tokens, kv_heads * head_dim]) to the current cache, attend `q` causally; `[tokens,
    num_heads * head_dim]` in q's dtype (see the module docstring for the packing)."""
    cache = current_kv_cache()
    tokens, num_seqs = q.shape[0], seq_lens.shape[0]
    head_dim = q.shape[1] // num_heads
    _check_fits(cache, layer, num_seqs, positions)
    k_cache, v_cache = cache.keys[layer], cache.values[layer]
    rows = torch.repeat_interleave(torch.arange(num_seqs, device=q.device), cu_seqlens.diff(), output_size=tokens)
    k_cache[rows, positions] = k.view(tokens, num_kv_heads, head_dim).to(k_cache.dtype)
    v_cache[rows, positions] = v.view(tokens, num_kv_heads, head_dim).to(v_cache.dtype)
    q = q.view(tokens, num_heads, head_dim)
    gqa = num_heads != num_kv_heads
    if tokens == num_seqs:   # decode: one query per sequence, each row read up to its own length
        longest = int(seq_lens.max())
        keys = k_cache[:num_seqs, :longest].transpose(1, 2)          # [seqs, kv_heads, longest, dim]
        values = v_cache[:num_seqs, :longest].transpose(1, 2)
        columns = torch.arange(longest, device=q.device)[None, :]
        mask = columns < seq_lens[:, None]
        if window > 0:
            mask &= columns >= seq_lens[:, None] - window
        out = F.scaled_dot_product_attention(q[:, :, None], keys, values, attn_mask=mask[:, None, None],
                                             scale=scale, enable_gqa=gqa)
        return out.reshape(tokens, num_heads * head_dim)
    out = torch.empty_like(q)
    bounds = cu_seqlens.tolist()
    for s, (start, end) in enumerate(zip(bounds, bounds[1:])):   # prefill: varlen, one segment per sequence
        if end == start:
            continue
        length = int(seq_lens[s])
        keys = k_cache[s, :length].transpose(0, 1)[None]            # [1, kv_heads, length, dim]
        values = v_cache[s, :length].transpose(0, 1)[None]
        columns = torch.arange(length, device=q.device)[None, :]
        mask = columns <= positions[start:end, None]
        if window > 0:
            mask &= columns > positions[start:end, None] - window
        seg = F.scaled_dot_product_attention(q[start:end].transpose(0, 1)[None], keys, values,
                                             attn_mask=mask[None, None], scale=scale, enable_gqa=gqa)
        out[start:end] = seg[0].transpose(0, 1)
    return out.reshape(tokens, num_heads * head_dim)


@cached_attention.register_fake
def _(q, k, v, positions, cu_seqlens, seq_lens, layer, num_heads, num_kv_heads, scale, window):
    return q.new_empty(q.shape)
