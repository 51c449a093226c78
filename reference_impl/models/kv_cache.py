"""The decoder's paged KV cache: per layer one tensor of fixed-size blocks, a block table per sequence, a block
allocator, and the attention metadata of a batch over it (block table, slot mapping, sequence lengths), as
vLLM's runner keeps them.

Each layer's tensor has the attention contract's layout `[num_blocks, num_kv_heads, block_size, 2 * head_dim]`
(docs/attention.md) and is written and read only through that layer's attention backend
(`models/paged_attention.py`). Block 0 is the null block: never handed out, it pads block tables. Row s of
the cache is sequence s of the batch the model runs: it owns the blocks of `block_tables[s]`, allocated as
the sequence grows (`reserve`, done by `plan` for every batch) and freed when it ends (`release`), after
which the later rows move up (their block tables move; no key or value is copied).

`plan(positions, cu_seqlens, seq_lens)` turns one forward's packed tokens into `CommonAttentionMetadata`:
sequence s's new tokens are rows `cu_seqlens[s]:cu_seqlens[s + 1]` at positions `seq_lens[s] - query_len
.. seq_lens[s] - 1` (the last `query_len` of its `seq_lens[s]` tokens), so one batch can hold prompts, chunks
of prompts after a context, and decode steps. The cache a model forward reads is made current by
`using_kv_cache(cache)` (vLLM finds it through its forward context), so a compiled graph holds one opaque call
per layer and no cache tensor.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator, Sequence

import torch

from reference_impl.attention.backend import AttentionSpec, CommonAttentionMetadata

DEFAULT_BLOCK_SIZE = 16
NULL_BLOCK = 0


class KVCacheFull(ValueError):
    """A sequence needs more blocks than the cache has free."""


class BlockAllocator:
    """Blocks 1..num_blocks-1 (0 is the null block): `allocate(n)` hands out n free ones, `free` takes them back."""

    def __init__(self, num_blocks: int):
        if num_blocks < 2:
            raise ValueError(f"num_blocks={num_blocks}: a cache needs the null block and at least one more")
        self.num_blocks = num_blocks
        self._free = list(range(num_blocks - 1, NULL_BLOCK, -1))   # popped from the end: 1, 2, 3, ...

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise KVCacheFull(f"the KV cache is out of blocks: {n} more needed, {len(self._free)} of "
                              f"{self.num_blocks - 1} free (allocate it with more blocks or fewer sequences)")
        taken = self._free[len(self._free) - n:][::-1]
        del self._free[len(self._free) - n:]
        return taken

    def free(self, blocks: Sequence[int]) -> None:
        self._free.extend(reversed(blocks))


@dataclasses.dataclass(eq=False)
class KVCache:
    """Per-layer block tensors `[num_blocks, num_kv_heads, block_size, 2 * head_dim]` (this rank's heads), the
    block table of every sequence row and the allocator of the blocks; `epoch` counts block-table changes."""

    layers: list[torch.Tensor]
    spec: AttentionSpec
    max_seqs: int
    max_len: int
    allocator: BlockAllocator
    block_tables: list[list[int]] = dataclasses.field(default_factory=list)
    epoch: int = 0

    @classmethod
    def allocate(cls, num_layers: int, max_seqs: int, max_len: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str, *, block_size: int = DEFAULT_BLOCK_SIZE,
                 kv_cache_dtype: str = "auto", num_blocks: int | None = None) -> KVCache:
        """A zeroed cache for `max_seqs` sequences of up to `max_len` tokens; `num_blocks` (null block included)
        defaults to enough for all of them at full length."""
        for name, value in (("num_layers", num_layers), ("max_seqs", max_seqs), ("max_len", max_len),
                            ("block_size", block_size)):
            if value < 1:
                raise ValueError(f"KV cache: {name}={value} must be at least 1")
        if num_blocks is None:
            num_blocks = 1 + max_seqs * math.ceil(max_len / block_size)
        spec = AttentionSpec(block_size, num_kv_heads, head_dim, dtype, kv_cache_dtype)
        allocator = BlockAllocator(num_blocks)
        layers = [torch.zeros(spec.cache_shape(num_blocks), dtype=spec.cache_dtype, device=device)
                  for _ in range(num_layers)]
        return cls(layers, spec, max_seqs, max_len, allocator)

    # ----- shape ---------------------------------------------------------------------------------
    @property
    def block_size(self) -> int:
        return self.spec.block_size

    @property
    def num_blocks(self) -> int:
        return self.allocator.num_blocks

    @property
    def free_blocks(self) -> int:
        return self.allocator.num_free

    @property
    def device(self) -> torch.device:
        return self.layers[0].device

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.layers)

    def blocks_for(self, length: int) -> int:
        """Blocks a sequence of `length` tokens occupies."""
        return math.ceil(length / self.block_size)

    # ----- sequences -----------------------------------------------------------------------------
    def reserve(self, row: int, length: int) -> None:
        """Give sequence row `row` (an existing row, or the next new one) blocks for `length` tokens."""
        if row > len(self.block_tables) or row >= self.max_seqs:
            raise ValueError(f"KV cache: row {row} is not the next one ({len(self.block_tables)} rows of at most "
                             f"{self.max_seqs})")
        if length > self.max_len:
            raise ValueError(f"cached attention: position {length - 1} does not fit the cache's max_len "
                             f"{self.max_len}")
        if row == len(self.block_tables):
            self.block_tables.append([])
            self.epoch += 1
        table = self.block_tables[row]
        missing = self.blocks_for(length) - len(table)
        if missing > 0:
            table.extend(self.allocator.allocate(missing))
            self.epoch += 1

    def release(self, rows: Sequence[int]) -> None:
        """Free the blocks of sequence rows `rows` (ended sequences); the later rows move up."""
        for row in sorted(set(rows), reverse=True):
            if not 0 <= row < len(self.block_tables):
                raise ValueError(f"KV cache: row {row} holds no sequence ({len(self.block_tables)} rows)")
            self.allocator.free(self.block_tables.pop(row))
        self.epoch += 1

    def reset(self) -> None:
        """Free every sequence's blocks (the values stay; nothing addresses them any more)."""
        self.release(range(len(self.block_tables)))

    # ----- a batch ---------------------------------------------------------------------------------
    def plan(self, positions: torch.Tensor, cu_seqlens: torch.Tensor, seq_lens: torch.Tensor) -> CommonAttentionMetadata:
        """Reserve every sequence's blocks and return the batch's metadata (errors name what does not fit)."""
        tokens, num_seqs = positions.shape[0], seq_lens.shape[0]
        if tuple(cu_seqlens.shape) != (num_seqs + 1,):
            raise ValueError(f"cached attention: cu_seqlens has shape {tuple(cu_seqlens.shape)}, expected "
                             f"({num_seqs + 1},) for {num_seqs} sequences")
        if num_seqs > self.max_seqs:
            raise ValueError(f"cached attention: {num_seqs} sequences do not fit the cache's {self.max_seqs} rows")
        bounds, lengths = cu_seqlens.tolist(), seq_lens.tolist()
        query_lens = [b - a for a, b in zip(bounds, bounds[1:])]
        if bounds[0] != 0 or bounds[-1] != tokens or min(query_lens, default=0) < 0:
            raise ValueError(f"cached attention: cu_seqlens {bounds} must rise from 0 to the {tokens} tokens")
        bad = next((s for s, (q, n) in enumerate(zip(query_lens, lengths)) if q > n), None)
        if bad is not None:
            raise ValueError(f"cached attention: sequence {bad} has {query_lens[bad]} new tokens but seq_len "
                             f"{lengths[bad]}")
        longest = max(lengths, default=0)
        if longest > self.max_len:
            raise ValueError(f"cached attention: position {longest - 1} does not fit the cache's max_len "
                             f"{self.max_len}")
        device = positions.device
        qlens = torch.tensor(query_lens, dtype=torch.int64, device=device)
        rows = torch.arange(num_seqs, device=device)              # the sequence (cache row) of every token
        if any(q != 1 for q in query_lens):                        # not a decode step of one token each
            rows = torch.repeat_interleave(rows, qlens, output_size=tokens)
        # token t of sequence s sits at seq_lens[s] - (cu_seqlens[s + 1] - t)
        expected = seq_lens.to(device=device, dtype=torch.int64)[rows] - (
            cu_seqlens.to(device=device, dtype=torch.int64)[1:][rows] - torch.arange(tokens, device=device))
        if not torch.equal(positions.to(torch.int64), expected):
            t = int((positions.to(torch.int64) != expected).nonzero()[0])
            raise ValueError(f"cached attention: token {t} is at position {int(positions[t])}, but its sequence's new "
                             f"tokens are the last of its seq_len, so it must be at {int(expected[t])}")
        for s, n in enumerate(lengths):
            self.reserve(s, n)
        width = max((len(self.block_tables[s]) for s in range(num_seqs)), default=0) or 1
        table = torch.tensor([t + [NULL_BLOCK] * (width - len(t)) for t in self.block_tables[:num_seqs]],
                             dtype=torch.int32, device="cpu").view(num_seqs, width).to(device)
        bs = self.block_size
        pos = positions.to(torch.int64)
        slot_mapping = table[rows, pos // bs].to(torch.int64) * bs + pos % bs
        qsl = cu_seqlens.to(torch.int32)
        return CommonAttentionMetadata(
            query_start_loc=qsl.to(device), query_start_loc_cpu=qsl.cpu(),
            seq_lens=seq_lens.to(device=device, dtype=torch.int32), num_reqs=num_seqs, num_actual_tokens=tokens,
            max_query_len=max(query_lens, default=0), max_seq_len=longest, block_table_tensor=table,
            slot_mapping=slot_mapping, causal=True)


_CURRENT: list[KVCache] = []


@contextlib.contextmanager
def using_kv_cache(cache: KVCache) -> Iterator[KVCache]:
    """Make `cache` the one the model's cached attention reads and writes inside the block."""
    _CURRENT.append(cache)
    try:
        yield cache
    finally:
        _CURRENT.pop()


def current_kv_cache() -> KVCache:
    if not _CURRENT:
        raise RuntimeError("cached attention ran outside `using_kv_cache(cache)`: no KV cache is current")
    return _CURRENT[-1]
