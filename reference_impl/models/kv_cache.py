"""The KV cache of the reference decoder and the attention that reads and writes it.

The cache is contiguous: per layer one key and one value tensor `[max_seqs, num_kv_heads, max_len,
head_dim]`, and sequence `s` of a batch owns row `s`. Contiguous rather than block-paged because a
reference runtime wants the attention it checks to be obviously right: a row is a plain slice, no
block table can be wrong, and decode reads `cache[:batch, :, :longest]`. Paging saves memory when
ragged batches share a large pool, which the small models and batches run here never need. Head
major, so every head's keys are one contiguous `[length, head_dim]` block for the attention kernel.

`cached_attention` is one opaque torch op (`reference_model::cached_attention`) over packed tokens:
token `t` of sequence `s` (rows `cu_seqlens[s]:cu_seqlens[s + 1]`) at position `positions[t]` first
writes its key and value to `cache[s, positions[t]]`, then attends causally to `cache[s, :positions[t]
+ 1]` (with a sliding `window` W > 0, to the last W of those positions only). Prefill packs whole
prompts (varlen: one segment per sequence); a decode step packs one token per sequence and reads
each row up to its own length `seq_lens[s]`, its query heads grouped by the KV head they share
(`[seqs, kv_heads, group, head_dim]`: no KV head is copied per query head). Like vLLM's attention op, the
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
    """Per-layer key and value tensors `[max_seqs, num_kv_heads, max_len, head_dim]` (this rank's heads)."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]

    @classmethod
    def allocate(cls, num_layers: int, max_seqs: int, max_len: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str) -> KVCache:
        shape = (max_seqs, num_kv_heads, max_len, head_dim)
        return cls([torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)],
                   [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)])

    @property
    def max_seqs(self) -> int:
        return self.keys[0].shape[0]

    @property
    def max_len(self) -> int:
        return self.keys[0].shape[2]

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


@dataclasses.dataclass
class CachedBatch:
    """What every layer's cached attention needs to know about one forward's packed tokens, worked out once
    (eager models plan it per forward; the compiled op plans it per call, as shapes must stay symbolic)."""

    positions: torch.Tensor
    cu_seqlens: torch.Tensor
    seq_lens: torch.Tensor
    rows: torch.Tensor           # the sequence (cache row) of every token
    decode: bool                 # one token per sequence, each at its row's last position
    shortest: int                # shortest and longest sequence once these tokens are in
    longest: int
    bounds: list[int]            # cu_seqlens and seq_lens on the host (prefill)
    lengths: list[int]


def plan_batch(positions: torch.Tensor, cu_seqlens: torch.Tensor, seq_lens: torch.Tensor,
               num_layers: int | None = None) -> CachedBatch:
    """Check the batch fits the current cache (errors name what does not) and precompute its row indices."""
    cache = current_kv_cache()
    tokens, num_seqs = positions.shape[0], seq_lens.shape[0]
    if num_layers is not None and num_layers > len(cache.keys):
        raise ValueError(f"cached attention: layer {len(cache.keys)} is not in the cache ({len(cache.keys)} layers)")
    if num_seqs > cache.max_seqs:
        raise ValueError(f"cached attention: {num_seqs} sequences do not fit the cache's {cache.max_seqs} rows")
    highest = int(positions.max()) + 1 if tokens else 0
    if highest > cache.max_len:
        raise ValueError(f"cached attention: position {highest - 1} does not fit the cache's max_len "
                         f"{cache.max_len}")
    decode = tokens == num_seqs
    if decode:
        rows = torch.arange(num_seqs, device=positions.device)
        bounds, lengths = [], []
    else:
        rows = torch.repeat_interleave(torch.arange(num_seqs, device=positions.device), cu_seqlens.diff(),
                                       output_size=tokens)
        bounds, lengths = cu_seqlens.tolist(), seq_lens.tolist()
    shortest, longest = (int(v) for v in seq_lens.aminmax()) if num_seqs else (0, 0)
    return CachedBatch(positions, cu_seqlens, seq_lens, rows, decode, shortest, longest, bounds, lengths)


def _decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: CachedBatch,
            num_kv_heads: int, scale: float, window: int) -> torch.Tensor:
    """One query per sequence against its cache row up to `seq_lens[s]`; q `[seqs, heads, dim]`."""
    seqs, heads, dim = q.shape
    longest = batch.longest
    mask = None
    if batch.shortest != longest or (window > 0 and longest > window):   # ragged rows or a window
        columns = torch.arange(longest, device=q.device)[None, :]
        mask = columns < batch.seq_lens[:, None]
        if window > 0:
            mask &= columns >= batch.seq_lens[:, None] - window
        mask = mask[:, None, None]                                   # [seqs, 1, 1, longest]
    grouped = q.view(seqs, num_kv_heads, heads // num_kv_heads, dim)  # query heads sharing a KV head
    out = F.scaled_dot_product_attention(grouped, k_cache[:seqs, :, :longest], v_cache[:seqs, :, :longest],
                                         attn_mask=mask, scale=scale)
    return out.reshape(seqs, heads * dim)


def _prefill(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: CachedBatch, scale: float,
             window: int) -> torch.Tensor:
    """Varlen: each sequence's segment of queries against its cache row, causally; q `[tokens, heads, dim]`."""
    out = torch.empty_like(q)
    gqa = q.shape[1] != k_cache.shape[1]
    bounds = batch.bounds
    for s, (start, end) in enumerate(zip(bounds, bounds[1:])):
        if end == start:
            continue
        length = batch.lengths[s]
        keys, values = k_cache[s:s + 1, :, :length], v_cache[s:s + 1, :, :length]   # [1, kv_heads, length, dim]
        query = q[start:end].transpose(0, 1)[None]                                  # [1, heads, n, dim]
        if end - start == length and window <= 0:    # the whole sequence from position 0: plain causal
            seg = F.scaled_dot_product_attention(query, keys, values, is_causal=True, scale=scale, enable_gqa=gqa)
        else:
            positions = batch.positions[start:end, None]
            columns = torch.arange(length, device=q.device)[None, :]
            mask = columns <= positions
            if window > 0:
                mask &= columns > positions - window
            seg = F.scaled_dot_product_attention(query, keys, values, attn_mask=mask[None, None], scale=scale,
                                                 enable_gqa=gqa)
        out[start:end] = seg[0].transpose(0, 1)
    return out


def attend_cached(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: CachedBatch, layer: int,
                  num_heads: int, num_kv_heads: int, scale: float, window: int) -> torch.Tensor:
    """Write `k`, `v` ([tokens, kv_heads * head_dim]) to the current cache, attend `q` causally; `[tokens,
    num_heads * head_dim]` in q's dtype (see the module docstring for the packing). Eager models call
    this with a batch planned once per forward; compiled graphs call the opaque
    `reference_model::cached_attention`."""
    cache = current_kv_cache()
    if not 0 <= layer < len(cache.keys):
        raise ValueError(f"cached attention: layer {layer} is not in the cache ({len(cache.keys)} layers)")
    tokens = q.shape[0]
    head_dim = q.shape[1] // num_heads
    k_cache, v_cache = cache.keys[layer], cache.values[layer]
    # cache[rows[t], :, positions[t]] = token t's heads ([tokens, kv_heads, dim])
    k_cache[batch.rows, :, batch.positions] = k.view(tokens, num_kv_heads, head_dim).to(k_cache.dtype)
    v_cache[batch.rows, :, batch.positions] = v.view(tokens, num_kv_heads, head_dim).to(v_cache.dtype)
    q = q.view(tokens, num_heads, head_dim)
    if batch.decode:
        return _decode(q, k_cache, v_cache, batch, num_kv_heads, scale, window)
    return _prefill(q, k_cache, v_cache, batch, scale, window).reshape(tokens, num_heads * head_dim)


@torch.library.custom_op("reference_model::cached_attention", mutates_args=())
def cached_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                     cu_seqlens: torch.Tensor, seq_lens: torch.Tensor, layer: int, num_heads: int,
                     num_kv_heads: int, scale: float, window: int) -> torch.Tensor:
    """`attend_cached` as one opaque torch op over plain tensors (for compiled graphs)."""
    return attend_cached(q, k, v, plan_batch(positions, cu_seqlens, seq_lens), layer, num_heads, num_kv_heads,
                         scale, window)


@cached_attention.register_fake
def _(q, k, v, positions, cu_seqlens, seq_lens, layer, num_heads, num_kv_heads, scale, window):
    return q.new_empty(q.shape)
