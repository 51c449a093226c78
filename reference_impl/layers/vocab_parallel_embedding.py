"""Vocabulary-parallel embedding and LM head in vLLM's padded, sharded layout.

The base vocabulary (`org_num_embeddings` ids) is padded to a multiple of `padding_size`; the
added (LoRA) ids follow, and the total is padded again. Each rank holds an equal slice of the
padded base part and an equal slice of the padded added part, base first (the seed's table:
1010 base + 16 added ids, padding 64 -> 1088 rows; with tp 2, rank 0 holds ids 0..511 at rows
0..511 and the added ids 1010..1025 at rows 512..527; rank 1 holds ids 512..1009 at rows 0..497).
A lookup maps ids to this rank's rows, embeds, zeroes ids another rank holds, and all-reduces.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn as nn
import torch.nn.functional as F

from reference_impl.custom_op import PluggableLayer
from reference_impl.distributed import GroupCoordinator, get_tp_group
from reference_impl.distributed.parallel_state import _DEFAULT_TP
from reference_impl.ir.cases import randn
from reference_impl.ir.tolerances import DEFAULT_TOLERANCES, LINEAR_TOLERANCES
from reference_impl.layers import cpu_gemm
from reference_impl.layers.cases import LayerCase, declare_cases

DEFAULT_VOCAB_PADDING_SIZE = 64


def pad_vocab_size(vocab_size: int, pad_to: int = DEFAULT_VOCAB_PADDING_SIZE) -> int:
    """`vocab_size` rounded up to a multiple of `pad_to`."""
    if pad_to <= 0:
        raise ValueError(f"padding_size={pad_to} must be positive")
    return -(-vocab_size // pad_to) * pad_to


def vocab_range_from_per_partition_vocab_size(per_partition: int, rank: int, offset: int = 0) -> tuple[int, int]:
    start = offset + rank * per_partition
    return start, start + per_partition


def vocab_range_from_global_vocab_size(global_size: int, rank: int, world_size: int,
                                       offset: int = 0) -> tuple[int, int]:
    if global_size % world_size:
        raise ValueError(f"padded vocabulary part of {global_size} rows is not divisible by the tensor-parallel "
                         f"size {world_size}; choose a padding_size that is a multiple of it")
    return vocab_range_from_per_partition_vocab_size(global_size // world_size, rank, offset)


@dataclasses.dataclass(frozen=True)
class VocabParallelEmbeddingShardIndices:
    """One rank's part of the vocabulary, as in vLLM.

    `org_vocab_*` and `added_vocab_*` are token-id ranges (the padding removed); the `padded_*`
    ranges include the padding: base rows in row space, added rows offset by the base vocab size.
    """

    padded_org_vocab_start_index: int
    padded_org_vocab_end_index: int
    padded_added_vocab_start_index: int
    padded_added_vocab_end_index: int
    org_vocab_start_index: int
    org_vocab_end_index: int
    added_vocab_start_index: int
    added_vocab_end_index: int

    @property
    def num_org_elements(self) -> int:
        return self.org_vocab_end_index - self.org_vocab_start_index

    @property
    def num_added_elements(self) -> int:
        return self.added_vocab_end_index - self.added_vocab_start_index

    @property
    def num_org_elements_padded(self) -> int:
        return self.padded_org_vocab_end_index - self.padded_org_vocab_start_index

    @property
    def num_added_elements_padded(self) -> int:
        return self.padded_added_vocab_end_index - self.padded_added_vocab_start_index

    @property
    def num_org_vocab_padding(self) -> int:
        return self.num_org_elements_padded - self.num_org_elements

    @property
    def num_added_vocab_padding(self) -> int:
        return self.num_added_elements_padded - self.num_added_elements

    @property
    def num_elements_padded(self) -> int:
        return self.num_org_elements_padded + self.num_added_elements_padded

    def __post_init__(self):
        if not (self.padded_org_vocab_start_index <= self.padded_org_vocab_end_index
                and self.padded_added_vocab_start_index <= self.padded_added_vocab_end_index
                and self.org_vocab_start_index <= self.org_vocab_end_index
                and self.added_vocab_start_index <= self.added_vocab_end_index
                and self.num_org_elements <= self.num_org_elements_padded
                and self.num_added_elements <= self.num_added_elements_padded):
            raise ValueError(f"inconsistent vocabulary shard indices: {self}")

    def token_ids(self) -> list[int]:
        """The token id of each of this rank's rows, -1 for padding (the seed table's middle row)."""
        return (list(range(self.org_vocab_start_index, self.org_vocab_end_index)) + [-1] * self.num_org_vocab_padding
                + list(range(self.added_vocab_start_index, self.added_vocab_end_index))
                + [-1] * self.num_added_vocab_padding)


def shard_indices(vocab_size_padded: int, org_vocab_size_padded: int, vocab_size: int, org_vocab_size: int,
                  tp_rank: int, tp_size: int) -> VocabParallelEmbeddingShardIndices:
    """Rank `tp_rank`'s shard of the layout the module docstring describes."""
    added_padded = vocab_size_padded - org_vocab_size_padded
    p_org_start, p_org_end = vocab_range_from_global_vocab_size(org_vocab_size_padded, tp_rank, tp_size)
    p_add_start, p_add_end = vocab_range_from_global_vocab_size(added_padded, tp_rank, tp_size, offset=org_vocab_size)
    return VocabParallelEmbeddingShardIndices(
        p_org_start, p_org_end, p_add_start, p_add_end,
        min(p_org_start, org_vocab_size), min(p_org_end, org_vocab_size),
        min(p_add_start, vocab_size), min(p_add_end, vocab_size))


def masked_input_and_mask(ids: torch.Tensor, org_start: int, org_end: int, num_org_padding: int,
                          added_start: int, added_end: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(this rank's row of each id, 0 where another rank holds it; mask True where another rank holds it)."""
    org_mask = (ids >= org_start) & (ids < org_end)
    added_mask = (ids >= added_start) & (ids < added_end)
    added_offset = added_start - (org_end - org_start) - num_org_padding
    offset = org_start * org_mask + added_offset * added_mask
    mine = org_mask | added_mask
    return mine * (ids - offset), ~mine


@PluggableLayer.register("vocab_parallel_embedding")
class VocabParallelEmbedding(PluggableLayer):
    """Embedding sharded over the vocabulary in the padded layout of the module docstring.

    `weight` is this rank's `[num_embeddings_per_partition, embedding_dim]`; padding rows are zero.
    Ids outside the vocabulary embed to zeros (like an id that another rank holds). `quant_config`
    and `quant_method` must be None (quantization is not part of the reference). A PluggableLayer, as
    in vLLM 0.32. vLLM's keyword arguments: `disable_tp` (a single-rank layer), `reduce_results`
    (False leaves this rank's partial lookup un-reduced) and `parallel_group` (the group to shard
    over instead of the tensor-parallel one).
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, params_dtype: torch.dtype | None = None,
                 org_num_embeddings: int | None = None, padding_size: int = DEFAULT_VOCAB_PADDING_SIZE,
                 quant_config=None, prefix: str = "", *, disable_tp: bool = False, reduce_results: bool = True,
                 quant_method=None, parallel_group: GroupCoordinator | None = None):
        super().__init__()
        if quant_config is not None or quant_method is not None:
            raise NotImplementedError(f"{type(self).__name__}({prefix!r}): quantization is not part of the reference")
        org = org_num_embeddings if org_num_embeddings is not None else num_embeddings
        if not 0 < org <= num_embeddings or embedding_dim <= 0:
            raise ValueError(f"{type(self).__name__}({prefix!r}): need 0 < org_num_embeddings={org} <= "
                             f"num_embeddings={num_embeddings} and embedding_dim={embedding_dim} > 0")
        self.tp_group: GroupCoordinator = (_DEFAULT_TP if disable_tp else parallel_group or get_tp_group())
        self.disable_tp, self.reduce_results = disable_tp, reduce_results
        self.tp_rank = self.tp_group.rank_in_group
        self.tp_size = self.tp_group.world_size
        self.num_embeddings = num_embeddings
        self.org_vocab_size = org
        self.num_added_embeddings = num_embeddings - org
        self.padding_size = padding_size
        self.embedding_dim = embedding_dim
        self.prefix = prefix
        self.org_vocab_size_padded = pad_vocab_size(org, padding_size)
        self.num_embeddings_padded = pad_vocab_size(self.org_vocab_size_padded + self.num_added_embeddings,
                                                    padding_size)
        self.shard_indices = self.shard_indices_of(self.tp_rank)
        self.num_embeddings_per_partition = self.num_embeddings_padded // self.tp_size
        if self.shard_indices.num_elements_padded != self.num_embeddings_per_partition:
            raise ValueError(f"{type(self).__name__}({prefix!r}): shard of {self.shard_indices.num_elements_padded} "
                             f"rows != {self.num_embeddings_per_partition} rows per partition")
        dtype = params_dtype or torch.get_default_dtype()
        self.weight = nn.Parameter(torch.zeros(self.num_embeddings_per_partition, embedding_dim, dtype=dtype),
                                   requires_grad=False)

    def shard_indices_of(self, rank: int) -> VocabParallelEmbeddingShardIndices:
        return shard_indices(self.num_embeddings_padded, self.org_vocab_size_padded, self.num_embeddings,
                             self.org_vocab_size, rank, self.tp_size)

    def gathered_ranges(self, num_tokens: int) -> list[tuple[int, int]]:
        """Ranges of the rank-order concatenation of all shards holding ids `0 .. num_tokens-1`, in id order."""
        located: list[tuple[int, int, int]] = []   # (first id, position, length)
        for rank in range(self.tp_size):
            idx, base = self.shard_indices_of(rank), rank * self.num_embeddings_per_partition
            located.append((idx.org_vocab_start_index, base, idx.num_org_elements))
            located.append((idx.added_vocab_start_index, base + idx.num_org_elements_padded, idx.num_added_elements))
        ranges: list[tuple[int, int]] = []
        for first, pos, length in sorted(located):
            length = min(length, num_tokens - first)
            if length <= 0:
                continue
            if ranges and ranges[-1][1] == pos:
                ranges[-1] = (ranges[-1][0], pos + length)
            else:
                ranges.append((pos, pos + length))
        return ranges

    def forward_native(self, input_: torch.Tensor) -> torch.Tensor:
        idx = self.shard_indices
        rows, elsewhere = masked_input_and_mask(input_, idx.org_vocab_start_index, idx.org_vocab_end_index,
                                                idx.num_org_vocab_padding, idx.added_vocab_start_index,
                                                idx.added_vocab_end_index)
        out = F.embedding(rows.long(), self.weight)
        out = out.masked_fill(elsewhere.unsqueeze(-1), 0)
        return self.tp_group.all_reduce(out) if self.reduce_results else out

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
        """Copy this rank's rows of a full `[org_num_embeddings or num_embeddings, dim]` checkpoint tensor.

        With `org_num_embeddings` rows the added rows stay zero (they are loaded with the adapter);
        padding rows are zero either way. 1-D tensors (a ParallelLMHead bias) load the same way.
        """
        if param is not getattr(self, "weight", None) and param is not getattr(self, "bias", None):
            raise ValueError(f"{type(self).__name__}({self.prefix!r}): weight_loader got a parameter of another layer")
        rows = loaded_weight.shape[0] if loaded_weight.dim() else -1
        if rows not in (self.org_vocab_size, self.num_embeddings) or loaded_weight.shape[1:] != param.shape[1:]:
            raise ValueError(f"{type(self).__name__}({self.prefix!r}): checkpoint tensor of shape "
                             f"{tuple(loaded_weight.shape)}, expected ({self.org_vocab_size} or {self.num_embeddings}"
                             f"{''.join(f', {d}' for d in param.shape[1:])})")
        idx = self.shard_indices
        with torch.no_grad():
            param.zero_()
            param[:idx.num_org_elements].copy_(loaded_weight[idx.org_vocab_start_index:idx.org_vocab_end_index])
            if rows == self.num_embeddings and idx.num_added_elements:
                at = idx.num_org_elements_padded
                param[at:at + idx.num_added_elements].copy_(
                    loaded_weight[idx.added_vocab_start_index:idx.added_vocab_end_index])

    def extra_repr(self) -> str:
        return (f"num_embeddings={self.num_embeddings_per_partition}, embedding_dim={self.embedding_dim}, "
                f"org_vocab_size={self.org_vocab_size}, num_embeddings_padded={self.num_embeddings_padded}, "
                f"tp_size={self.tp_size}")


@PluggableLayer.register("parallel_lm_head")
class ParallelLMHead(VocabParallelEmbedding):
    """The LM head: a weight (and optional bias) in the embedding's padded sharded layout.

    `forward(hidden_states)` gives this rank's logits `h W_r^T (+ b_r)`, one column per row of the
    shard, padding included; `LogitsProcessor` gathers them and drops the padding. (vLLM's
    ParallelLMHead raises in forward and the logits processor applies the weight itself; here the
    matmul is the layer's forward so a platform can replace it like any other layer.)
    """

    computes_through_cpu_gemm = True   # cpu_gemm.pack_cpu_gemms may prepack its weight

    def __init__(self, num_embeddings: int, embedding_dim: int, bias: bool = False,
                 params_dtype: torch.dtype | None = None, org_num_embeddings: int | None = None,
                 padding_size: int = DEFAULT_VOCAB_PADDING_SIZE, quant_config=None, prefix: str = "", *,
                 disable_tp: bool = False):
        super().__init__(num_embeddings, embedding_dim, params_dtype, org_num_embeddings, padding_size,
                         quant_config, prefix, disable_tp=disable_tp)
        if bias:
            self.bias = nn.Parameter(torch.zeros(self.num_embeddings_per_partition, dtype=self.weight.dtype),
                                     requires_grad=False)
        else:
            self.register_parameter("bias", None)

    def tie_weights(self, embed_tokens: VocabParallelEmbedding) -> ParallelLMHead:
        """Share the input embedding's weight (same vocabulary and padding required)."""
        if embed_tokens.weight.shape != self.weight.shape or embed_tokens.shard_indices != self.shard_indices:
            raise ValueError(f"ParallelLMHead({self.prefix!r}).tie_weights: embedding layout "
                             f"{tuple(embed_tokens.weight.shape)} differs from the head's {tuple(self.weight.shape)}")
        self.weight = embed_tokens.weight
        return self

    def forward_native(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if hidden_states.shape[-1] != self.embedding_dim:
            raise ValueError(f"ParallelLMHead({self.prefix!r}) expected hidden size {self.embedding_dim}, got shape "
                             f"{tuple(hidden_states.shape)}")
        return cpu_gemm.linear(self, hidden_states, self.weight, self.bias)


# ----- conformance cases (single rank) ---------------------------------------------------------------
def _init_rows(layer: nn.Module, gen: torch.Generator) -> None:
    """Seeded values in the vocabulary rows; padding rows stay zero, as a loaded checkpoint leaves them."""
    with torch.no_grad():
        valid = torch.tensor([t >= 0 for t in layer.shard_indices.token_ids()])
        for name, p in layer.named_parameters():
            scale = layer.embedding_dim ** -0.5 if isinstance(layer, ParallelLMHead) and name == "weight" else 1.0
            values = torch.randn(p.shape, generator=gen) * scale
            values[~valid] = 0
            p.copy_(values.to(p.dtype))


def _embedding_case(name, tokens, vocab, dim, *, org=None, padding=DEFAULT_VOCAB_PADDING_SIZE, out_of_range=False):
    def make_inputs(dtype, device, gen):
        ids = torch.randint(0, vocab + (3 if out_of_range else 0), (tokens,), generator=gen)
        return (ids.to(device),)

    return LayerCase(name, lambda dtype: {"num_embeddings": vocab, "embedding_dim": dim, "params_dtype": dtype,
                                          "org_num_embeddings": org, "padding_size": padding},
                     make_inputs, init_params=_init_rows)


def _lm_head_case(name, tokens, vocab, dim, *, org=None, bias=False, padding=DEFAULT_VOCAB_PADDING_SIZE):
    def make_inputs(dtype, device, gen):
        return (randn((tokens, dim), dtype, device, gen),)

    return LayerCase(name, lambda dtype: {"num_embeddings": vocab, "embedding_dim": dim, "params_dtype": dtype,
                                          "org_num_embeddings": org, "padding_size": padding, "bias": bias},
                     make_inputs, init_params=_init_rows)


# a lookup: exact up to the last bit
declare_cases(VocabParallelEmbedding, tolerances=DEFAULT_TOLERANCES, cases=[
    _embedding_case("tokens=9,vocab=300,dim=65", 9, 300, 65),
    _embedding_case("tokens=16,vocab=1026,org=1010,dim=32", 16, 1026, 32, org=1010),
    _embedding_case("tokens=7,vocab=100,dim=16,out_of_range_ids", 7, 100, 16, out_of_range=True),
    _embedding_case("tokens=1,vocab=5,dim=1,padding=8", 1, 5, 1, padding=8),
])
declare_cases(ParallelLMHead, tolerances=LINEAR_TOLERANCES, cases=[
    _lm_head_case("tokens=5,vocab=300,dim=65", 5, 300, 65),
    _lm_head_case("tokens=4,vocab=1026,org=1010,dim=32,bias", 4, 1026, 32, org=1010, bias=True),
    _lm_head_case("tokens=1,vocab=5,dim=1,padding=8", 1, 5, 1, padding=8),
])
