"""VocabParallelEmbedding, ParallelLMHead and LogitsProcessor: the seed's padded layout, lookups, logits.

The layout tests reproduce the seed document's example (1010 base ids + 16 added, padding 64) for
tp 1 and both ranks of tp 2 exactly; other ranks are simulated (multi-rank runs: test_distributed).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from _layer_support import f64
from reference_impl.custom_op import CustomOp
from reference_impl.distributed import simulated_tensor_parallel
from reference_impl.layers.cases import conformance_of
from reference_impl.layers.logits_processor import LogitsProcessor
from reference_impl.layers.vocab_parallel_embedding import (
    ParallelLMHead,
    VocabParallelEmbedding,
    VocabParallelEmbeddingShardIndices,
    pad_vocab_size,
)

SEED_EXAMPLE = dict(num_embeddings=1026, embedding_dim=4, org_num_embeddings=1010, padding_size=64)


def _embedding(rank=0, tp=1, cls=VocabParallelEmbedding, **kwargs):
    with simulated_tensor_parallel(rank, tp):
        return cls(**{**SEED_EXAMPLE, "params_dtype": torch.float64, **kwargs})


def _local_rows(layer, ids):
    """The row of this rank's shard that each id lands in (-1: another rank holds it)."""
    from reference_impl.layers.vocab_parallel_embedding import masked_input_and_mask

    idx = layer.shard_indices
    rows, elsewhere = masked_input_and_mask(torch.tensor(ids), idx.org_vocab_start_index, idx.org_vocab_end_index,
                                            idx.num_org_vocab_padding, idx.added_vocab_start_index,
                                            idx.added_vocab_end_index)
    return torch.where(elsewhere, -1, rows).tolist()


def test_registered_names():
    assert CustomOp.op_registry["vocab_parallel_embedding"] is VocabParallelEmbedding
    assert CustomOp.op_registry["parallel_lm_head"] is ParallelLMHead
    assert CustomOp.op_registry["logits_processor"] is LogitsProcessor


def test_seed_example_tp1():
    layer = _embedding()
    assert (layer.org_vocab_size_padded, layer.num_embeddings_padded, layer.num_embeddings_per_partition) == (
        1024, 1088, 1088)
    assert layer.weight.shape == (1088, 4)
    assert layer.shard_indices.token_ids() == (list(range(1010)) + [-1] * 14 + list(range(1010, 1026)) + [-1] * 48)
    # token ids 0..1009 at rows 0..1009, base padding rows 1010..1023, 1010..1025 at 1024..1039
    assert _local_rows(layer, [0, 1009, 1010, 1025, 1026]) == [0, 1009, 1024, 1039, -1]


def test_seed_example_tp2_rank0():
    layer = _embedding(0, 2)
    assert layer.weight.shape == (544, 4)
    assert layer.shard_indices == VocabParallelEmbeddingShardIndices(0, 512, 1010, 1042, 0, 512, 1010, 1026)
    assert layer.shard_indices.token_ids() == list(range(512)) + list(range(1010, 1026)) + [-1] * 16
    assert _local_rows(layer, [0, 497, 511, 512, 1009, 1010, 1025]) == [0, 497, 511, -1, -1, 512, 527]


def test_seed_example_tp2_rank1():
    layer = _embedding(1, 2)
    idx = layer.shard_indices
    assert idx == VocabParallelEmbeddingShardIndices(512, 1024, 1042, 1074, 512, 1010, 1026, 1026)
    assert (idx.num_org_elements, idx.num_org_vocab_padding, idx.num_added_elements, idx.num_added_vocab_padding,
            idx.num_elements_padded) == (498, 14, 0, 32, 544)
    assert idx.token_ids() == list(range(512, 1010)) + [-1] * 46
    assert _local_rows(layer, [511, 512, 1009, 1010, 1025]) == [-1, 0, 497, -1, -1]


def test_loader_places_rows_by_rank_and_zeroes_padding():
    table = f64(1026, 4, seed=1)
    for rank, tp in ((0, 1), (0, 2), (1, 2)):
        layer = _embedding(rank, tp)
        layer.weight_loader(layer.weight, table)
        for row, token in enumerate(layer.shard_indices.token_ids()):
            expected = table[token] if token >= 0 else torch.zeros(4, dtype=torch.float64)
            assert torch.equal(layer.weight[row], expected), (rank, tp, row, token)
    base_only = _embedding()
    base_only.weight_loader(base_only.weight, table[:1010])   # the base checkpoint: added rows stay zero
    assert torch.equal(base_only.weight[:1010], table[:1010]) and not base_only.weight[1010:].any()
    with pytest.raises(ValueError, match=r"checkpoint tensor of shape \(1000, 4\), expected \(1010 or 1026, 4\)"):
        base_only.weight_loader(base_only.weight, table[:1000])


def test_lookup_is_embedding_of_every_id_and_zero_outside():
    table = f64(1026, 4, seed=2)
    layer = _embedding()
    layer.weight_loader(layer.weight, table)
    ids = torch.tensor([[3, 1009, 1010], [1025, 1026, -5]])
    out = layer(ids)
    assert out.shape == (2, 3, 4)
    torch.testing.assert_close(out[0], F.embedding(ids[0], table), atol=0, rtol=0)
    torch.testing.assert_close(out[1, 0], table[1025], atol=0, rtol=0)
    assert not out[1, 1:].any()


def test_padding_and_argument_errors():
    assert pad_vocab_size(1010, 64) == 1024 and pad_vocab_size(1024, 64) == 1024
    with pytest.raises(ValueError, match="padding_size=0"):
        pad_vocab_size(10, 0)
    with pytest.raises(ValueError, match="org_num_embeddings=20"):
        VocabParallelEmbedding(10, 4, org_num_embeddings=20)
    with pytest.raises(NotImplementedError, match="quantization"):
        VocabParallelEmbedding(10, 4, quant_config=object())
    with simulated_tensor_parallel(0, 3), pytest.raises(ValueError, match="not divisible by the tensor-parallel size 3"):
        VocabParallelEmbedding(100, 4, padding_size=64)


def test_lm_head_logits_cover_the_padded_shard():
    table, bias = f64(1026, 4, seed=3), f64(1026, seed=4)
    head = _embedding(0, 2, cls=ParallelLMHead, bias=True)
    head.weight_loader(head.weight, table)
    head.weight_loader(head.bias, bias)
    h = f64(3, 4, seed=5)
    logits = head(h)
    assert logits.shape == (3, 544)
    ids = head.shard_indices.token_ids()
    for col in (0, 511, 512, 527, 540):
        expected = h @ table[ids[col]] + bias[ids[col]] if ids[col] >= 0 else torch.zeros(3, dtype=torch.float64)
        torch.testing.assert_close(logits[:, col], expected)
    with pytest.raises(ValueError, match="expected hidden size 4"):
        head(f64(3, 5))


def test_tie_weights_shares_the_embedding():
    emb = _embedding()
    head = _embedding(cls=ParallelLMHead)
    assert head.tie_weights(emb) is head and head.weight is emb.weight
    with pytest.raises(ValueError, match="tie_weights"):
        _embedding(cls=ParallelLMHead).tie_weights(_embedding(num_embeddings=1010))


def test_gathered_ranges_put_ids_in_order():
    assert _embedding().gathered_ranges(1010) == [(0, 1010)]
    assert _embedding().gathered_ranges(1026) == [(0, 1010), (1024, 1040)]
    # tp 2: rank 0's shard is 0..543 (ids 0..511, then 1010..1025), rank 1's starts at 544
    assert _embedding(0, 2).gathered_ranges(1010) == [(0, 512), (544, 1042)]
    assert _embedding(1, 2).gathered_ranges(1026) == [(0, 512), (544, 1042), (512, 528)]


def test_logits_processor_softcaps_scales_and_drops_padding():
    table = f64(1026, 4, seed=6)
    head = _embedding(cls=ParallelLMHead)
    head.weight_loader(head.weight, table)
    h = f64(5, 4, seed=7) * 3
    full = h @ table.T
    out = LogitsProcessor(1026, 1010, scale=0.5, soft_cap=2.0)(head, h)
    torch.testing.assert_close(out, torch.tanh(full[:, :1010] / 2.0) * 2.0 * 0.5)   # cap first, then scale
    assert out.abs().max() <= 1.0
    torch.testing.assert_close(LogitsProcessor(1026)(head, h), full)   # every id, the added ones too
    bias = f64(1088, seed=8)
    torch.testing.assert_close(LogitsProcessor(1010)(head, h, bias), (h @ head.weight.T + bias)[:, :1010])
    as_input = LogitsProcessor(300, logits_as_input=True, soft_cap=30.0, scale=2.0)
    x = f64(2, 300, seed=9) * 50
    torch.testing.assert_close(as_input(None, x), torch.tanh(x / 30.0) * 60.0)


def test_logits_processor_errors():
    with pytest.raises(ValueError, match="soft_cap=0"):
        LogitsProcessor(10, soft_cap=0)
    with pytest.raises(ValueError, match="org_vocab_size=20"):
        LogitsProcessor(10, 20)
    with pytest.raises(ValueError, match="needs an lm_head"):
        LogitsProcessor(10)(None, torch.zeros(1, 4))
    with pytest.raises(ValueError, match="exceeds the LM head's 1026 ids"):
        LogitsProcessor(2000)(_embedding(cls=ParallelLMHead), torch.zeros(1, 4, dtype=torch.float64))


def _cases():
    for cls in (VocabParallelEmbedding, ParallelLMHead, LogitsProcessor):
        for case in conformance_of(cls).cases:
            for dtype in (torch.float32, torch.bfloat16):
                yield pytest.param(cls, case, dtype, id=f"{cls.__name__}::{case.name}::{str(dtype)[6:]}")


@pytest.mark.parametrize("cls,case,dtype", list(_cases()))
def test_conformance_cases_track_float64(cls, case, dtype):
    layer = cls(**case.make_kwargs(dtype))
    if case.init_params is not None:
        case.init_params(layer, torch.Generator().manual_seed(3))
    inputs = case.make_inputs(dtype, "cpu", torch.Generator().manual_seed(4))
    out = layer(*inputs)
    golden_inputs = [a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else
                     copy.deepcopy(a).to(torch.float64) if isinstance(a, torch.nn.Module) else a for a in inputs]
    golden = copy.deepcopy(layer).to(torch.float64)(*golden_inputs)
    atol, rtol = conformance_of(cls).get_tolerance(dtype)
    assert out.dtype == dtype and out.shape == golden.shape
    torch.testing.assert_close(out.double(), golden, atol=4 * atol, rtol=4 * rtol)
