"""A paged batch for one attention case: the tensors, block table, slot mappings and metadata a runner would
hand a backend, the logical problem the oracle computes, and the driver that runs a backend on it.

Blocks are a random permutation of 1..N (block 0 is the null block, never addressed; a case's `first_block` moves
them up, leaving every block below unaddressed), the block table is
wider than needed with 0 padding, and the cache's last blocks are never addressed (a write through a slot
of -1 as a Python index lands there). The cache starts filled with random finite values, not zeros, so a
backend that reads a slot it was not given reads something that changes its result.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import torch

from reference_impl.attention import kv_quant
from reference_impl.attention.backend import AttentionSpec, CommonAttentionMetadata, kv_cache_torch_dtype
from reference_impl.attention.cases import AttentionCase
from reference_impl.attention.oracle import AttentionProblem, alibi_slopes

SPARE_BLOCKS = 2     # never addressed, after the used ones
BULK_REQUESTS = 64   # a batch of more requests draws its keys and values in one call each (the size cases)


def _plain_call(where: str, fn: Callable, *args):
    return fn(*args)


@dataclasses.dataclass
class PagedBatch:
    case: AttentionCase
    dtype: torch.dtype
    kv_cache_dtype: str
    query: torch.Tensor                  # [T + padding, H, D]
    key: torch.Tensor                    # [T + padding, KVH, D]
    value: torch.Tensor
    context_key: torch.Tensor            # [C, KVH, D]: every context token not written yet (shared blocks once)
    context_value: torch.Tensor
    context_slots: torch.Tensor          # int64 [C]
    metadata: CommonAttentionMetadata
    num_blocks: int
    addressed_blocks: list[int]
    problem: AttentionProblem
    sinks: torch.Tensor | None
    alibi_slopes: list[float] | None
    k_scale: float
    v_scale: float
    cache_seed: int
    # caches made by new_cache, by (num_blocks, cache_seed): a second run on the batch (native's, then the backend's)
    # gets a copy instead of drawing 67 million values again (the size cases' caches of 65,540 blocks)
    _caches: dict = dataclasses.field(default_factory=dict, repr=False)

    @property
    def num_actual_tokens(self) -> int:
        return self.metadata.num_actual_tokens

    def spec(self) -> AttentionSpec:
        c = self.case
        return AttentionSpec(c.block_size, c.num_kv_heads, c.head_size, self.dtype, self.kv_cache_dtype,
                             c.sliding_window)

    def new_cache(self, num_blocks: int | None = None) -> torch.Tensor:
        """The cache tensor `[num_blocks, KVH, block, 2D]`, every element a random finite value of its dtype (drawn
        from `cache_seed`: every call with the same seed and size gives the same values, in a tensor of its own)."""
        key = (num_blocks or self.num_blocks, self.cache_seed)
        if key not in self._caches:
            spec = self.spec()
            gen = torch.Generator().manual_seed(self.cache_seed)
            values = torch.randn(spec.cache_shape(key[0]), generator=gen)
            fp8 = kv_quant.fp8_dtype(self.kv_cache_dtype)
            cache = kv_quant.quantize(values, fp8) if fp8 is not None else values.to(spec.cache_dtype)
            self._caches[key] = cache.to(self.query.device)
        return self._caches[key].clone()

    def make_layer(self, backend: type, prefix: str = "layer.0"):
        """The case's `Attention` layer on `backend` (its impl constructed with vLLM's arguments)."""
        from reference_impl.attention.layer import Attention

        c = self.case
        return Attention(c.num_heads, c.head_size, c.softmax_scale, c.num_kv_heads, self.alibi_slopes, c.block_size,
                         self.kv_cache_dtype, c.logits_soft_cap, c.sliding_window, prefix, c.attn_type, self.sinks,
                         attn_backend=backend, dtype=self.dtype, k_scale=self.k_scale, v_scale=self.v_scale)

    def tensors(self) -> list[tuple[str, torch.Tensor]]:
        """Every input tensor a backend must leave untouched, by name."""
        m = self.metadata
        return [("query", self.query), ("key", self.key), ("value", self.value),
                ("metadata.query_start_loc", m.query_start_loc), ("metadata.query_start_loc_cpu", m.query_start_loc_cpu),
                ("metadata.seq_lens", m.seq_lens), ("metadata.block_table_tensor", m.block_table_tensor),
                ("metadata.slot_mapping", m.slot_mapping)] + ([("sinks", self.sinks)] if self.sinks is not None else [])


def make_batch(case: AttentionCase, dtype: torch.dtype, kv_cache_dtype: str, seed: int, device="cpu") -> PagedBatch:
    """The batch of `case` in `dtype` with a `kv_cache_dtype` cache, every random choice from `seed`."""
    kv_cache_torch_dtype(kv_cache_dtype, dtype)     # a clear error for an unknown name
    gen = torch.Generator().manual_seed(seed)
    c = case
    h, kvh, d, bs = c.num_heads, c.num_kv_heads, c.head_size, c.block_size
    n = len(c.seq_lens)
    tokens = sum(c.query_lens)
    padded = tokens + c.padding

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(dtype)

    # every request's keys and values, context then new; shared prefix blocks copy request 0's
    bulk = n > BULK_REQUESTS and not c.shared_prefix_blocks and not c.encoder
    if bulk:        # one draw each, split per request (a size case's 65,537 draws took seconds)
        all_keys, all_values = randn(sum(c.seq_lens), kvh, d), randn(sum(c.seq_lens), kvh, d)
        keys, values = list(all_keys.split(list(c.seq_lens))), list(all_values.split(list(c.seq_lens)))
    else:
        keys = [randn(s, kvh, d) for s in c.seq_lens]
        values = [randn(s, kvh, d) for s in c.seq_lens]
    shared = c.shared_prefix_blocks * bs
    if shared:
        if min(c.seq_lens[0] - c.query_lens[0], c.seq_lens[1] - c.query_lens[1]) < shared:
            raise ValueError(f"case {c.name}: the shared prefix blocks must be context of both requests")
        keys[1][:shared], values[1][:shared] = keys[0][:shared], values[0][:shared]

    # blocks: a permutation of first_block..first_block+used-1 (1..used unless the case moves them up), the spare ones
    # after; the table is 2 wider than needed, 0-padded. Python lists, not tensor indexing: a size case has 65,537
    # requests and a million slots.
    per_request = [math.ceil(s / bs) for s in c.seq_lens]
    used = sum(per_request) - (c.shared_prefix_blocks if shared else 0)
    num_blocks = c.first_block + used + SPARE_BLOCKS
    perm = (torch.randperm(used, generator=gen) + c.first_block).tolist()
    width = max(per_request) + 2
    rows = [[0] * width for _ in range(n)]
    for i, nb in enumerate(per_request):
        start = 0
        if i == 1 and shared:
            rows[1][: c.shared_prefix_blocks] = rows[0][: c.shared_prefix_blocks]
            start = c.shared_prefix_blocks
        for b in range(start, nb):
            rows[i][b] = perm.pop()
    table = torch.tensor(rows, dtype=torch.int32)

    ctx_k, ctx_v, ctx_slots, new_slots = [], [], [], []
    for i, (ql, s) in enumerate(zip(c.query_lens, c.seq_lens)):
        if bulk:
            break               # the same slots and rows, computed as tensors below
        first = shared if (i == 1 and shared) else 0
        row = rows[i]
        ctx_k.append(keys[i][first: s - ql])
        ctx_v.append(values[i][first: s - ql])
        ctx_slots += [row[p // bs] * bs + p % bs for p in range(first, s - ql)]
        new_slots += [row[p // bs] * bs + p % bs for p in range(s - ql, s)]
    if c.encoder:
        ctx_k, ctx_v, ctx_slots = [], [], []

    query = randn(padded, h, d)
    if bulk:
        lens, queries = torch.tensor(c.seq_lens), torch.tensor(c.query_lens)
        ctx_rows, ctx_slot_t = _packed(table, lens - queries, torch.zeros_like(lens), lens, bs)
        new_rows, new_slot_t = _packed(table, queries, lens - queries, lens, bs)
        ctx_k, ctx_v, ctx_slots, new_slots = [all_keys[ctx_rows]], [all_values[ctx_rows]], ctx_slot_t.tolist(), \
            new_slot_t.tolist()
        key = torch.cat([all_keys[new_rows], randn(c.padding, kvh, d)])
        value = torch.cat([all_values[new_rows], randn(c.padding, kvh, d)])
    else:
        key = torch.cat([k[s - q:] for k, q, s in zip(keys, c.query_lens, c.seq_lens)] + [randn(c.padding, kvh, d)])
        value = torch.cat([v[s - q:] for v, q, s in zip(values, c.query_lens, c.seq_lens)] +
                          [randn(c.padding, kvh, d)])
    if c.fused_qkv:
        qkv = torch.cat([query.reshape(padded, -1), key.reshape(padded, -1), value.reshape(padded, -1)], dim=1)
        query = qkv[:, : h * d].view(padded, h, d)
        key = qkv[:, h * d: (h + kvh) * d].view(padded, kvh, d)
        value = qkv[:, (h + kvh) * d:].view(padded, kvh, d)
    sinks = (torch.randn(h, generator=gen) + 2.0).to(dtype) if c.sinks else None
    slopes = alibi_slopes(h) if c.alibi else None
    fp8 = kv_quant.fp8_dtype(kv_cache_dtype) is not None
    k_scale, v_scale = (c.k_scale, c.v_scale) if fp8 else (1.0, 1.0)

    qsl = torch.tensor([0] + list(torch.tensor(c.query_lens).cumsum(0).tolist()), dtype=torch.int32)
    metadata = CommonAttentionMetadata(
        query_start_loc=qsl.to(device), query_start_loc_cpu=qsl.clone(),
        seq_lens=torch.tensor(c.seq_lens, dtype=torch.int32, device=device), num_reqs=n, num_actual_tokens=tokens,
        max_query_len=max(c.query_lens), max_seq_len=max(c.seq_lens) + c.max_seq_len_extra,
        block_table_tensor=table.to(device),
        slot_mapping=torch.tensor(new_slots + [-1] * c.padding, dtype=torch.int64, device=device), causal=c.causal)
    problem = AttentionProblem(query[:tokens].clone(), keys, values, list(c.query_lens), list(c.seq_lens),
                               c.softmax_scale, c.sliding_window, c.logits_soft_cap, slopes, sinks, c.causal,
                               c.attn_type, kv_cache_dtype, k_scale, v_scale)
    empty = torch.empty(0, kvh, d, dtype=dtype)
    addressed = sorted({b for row, nb in zip(rows, per_request) for b in row[:nb]})
    return PagedBatch(c, dtype, kv_cache_dtype, query.to(device), key.to(device), value.to(device),
                      (torch.cat(ctx_k) if ctx_k else empty).to(device), (torch.cat(ctx_v) if ctx_v else empty).to(device),
                      torch.tensor(ctx_slots, dtype=torch.int64, device=device), metadata, num_blocks, addressed, problem,
                      None if sinks is None else sinks.to(device), slopes, k_scale, v_scale,
                      cache_seed=int(torch.randint(0, 2**31 - 1, (1,), generator=gen)))


def _packed(table: torch.Tensor, counts: torch.Tensor, starts: torch.Tensor, seq_lens: torch.Tensor,
            block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For positions `starts[i] .. starts[i] + counts[i] - 1` of every request i, in request order: their rows in the
    requests' packed keys (request i's keys start at the sum of the earlier seq_lens) and their slots through the
    block table (what the per-request loop computes, as tensors: a size case has a million positions)."""
    request = torch.repeat_interleave(torch.arange(counts.numel()), counts)
    before = torch.cumsum(counts, 0) - counts
    pos = torch.arange(request.numel()) - before[request] + starts[request]
    rows = (torch.cumsum(seq_lens, 0) - seq_lens)[request] + pos
    slots = table[request, pos // block_size].to(torch.int64) * block_size + pos % block_size
    return rows, slots


@dataclasses.dataclass
class BackendRun:
    """One backend's layer, builder and cache over a batch: write the context, the new tokens, build, forward.

    `call(where, fn, *args)` runs each call into the backend (the harness passes one that attributes a raise).
    """

    backend: type
    batch: PagedBatch
    call: Callable = _plain_call
    layer: Any = None
    builder: Any = None
    cache: torch.Tensor | None = None

    def __post_init__(self):
        if self.layer is None:
            self.layer = self.call(f"constructing {self.backend.__qualname__}'s impl", self.batch.make_layer,
                                   self.backend)
        if self.builder is None:
            builder_cls = self.backend.get_builder_cls()
            self.builder = self.call(f"constructing {builder_cls.__qualname__}", builder_cls, self.batch.spec(),
                                     [self.layer.layer_name], None, self.batch.query.device)
        if self.cache is None:
            self.cache = self.batch.new_cache()

    @property
    def impl(self):
        return self.layer.impl

    def write_context(self) -> None:
        b = self.batch
        if b.context_slots.numel():
            self.call("do_kv_cache_update (the context)", self.impl.do_kv_cache_update, self.layer, b.context_key,
                      b.context_value, self.cache, b.context_slots)

    def write_new(self) -> None:
        """The new tokens, through the writer, unless the backend writes them inside forward (or is an encoder)."""
        b = self.batch
        if not self.backend.forward_includes_kv_cache_update and not b.case.encoder:
            self.call("do_kv_cache_update (the new tokens)", self.impl.do_kv_cache_update, self.layer, b.key, b.value,
                      self.cache, b.metadata.slot_mapping)

    def build(self):
        return self.call("the metadata builder's build", self.builder.build, 0, self.batch.metadata)

    def forward(self, attn_metadata, output: torch.Tensor | None = None):
        """(output, returned): forward into `output` (NaN-filled when not given), and what it returned."""
        b = self.batch
        if output is None:
            output = torch.full_like(b.query, float("nan"), memory_format=torch.contiguous_format)
        returned = self.call("forward", self.impl.forward, self.layer, b.query, b.key, b.value, self.cache,
                             attn_metadata, output)
        return output, returned

    def run(self):
        """The whole step: context, new tokens, build, forward; (output, returned, built metadata)."""
        self.write_context()
        self.write_new()
        md = self.build()
        output, returned = self.forward(md)
        return output, returned, md
