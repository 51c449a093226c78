"""The runtime's paged KV cache and its attention through the platform's backend: the block allocator, block tables
and slot mapping, generation on small blocks, chunked prefill and mixed batches at the model, ended sequences
freeing their blocks, the backend the platform selects (and its declarations) running every layer, and the errors
that name what does not fit."""

from __future__ import annotations

import pytest
import torch

import _runtime_tp
from reference_impl.attention import MultipleOf
from reference_impl.attention.cpp_backend import available as cpp_available
from reference_impl.attention.reference import (
    ReferenceAttentionBackend,
    ReferenceAttentionImpl,
    ReferenceAttentionMetadataBuilder,
)
from reference_impl.models import DecoderConfig, build_model, generate, greedy_generate
from reference_impl.models.kv_cache import BlockAllocator, KVCache, KVCacheFull, using_kv_cache
from reference_impl.platforms import CpuPlatform, activate_platform

PROMPTS = _runtime_tp.PROMPTS     # 6, 3 and 5 tokens
WINDOWED = DecoderConfig(num_layers=3, num_heads=6, num_kv_heads=2, sliding_window=5, sliding_window_layers=(1,))
BACKENDS = ["REFERENCE"] + (["CPP"] if cpp_available() else [])


def _recompute(model, prompt, new_tokens):
    """Full recompute of one sequence (no cache, SDPA): its tokens and positions' logits."""
    ref = greedy_generate(model, torch.tensor(prompt), new_tokens)
    return ref.tokens, torch.cat([ref.prompt_logits, ref.step_logits[1:]])


# ----- blocks, rows, metadata ----------------------------------------------------------------------
def test_block_allocator_never_hands_out_the_null_block_and_takes_blocks_back():
    alloc = BlockAllocator(5)
    assert alloc.num_free == 4
    first = alloc.allocate(3)
    assert first == [1, 2, 3] and 0 not in first
    with pytest.raises(KVCacheFull, match="out of blocks: 2 more needed, 1 of 4 free"):
        alloc.allocate(2)
    alloc.free([2, 3])
    assert sorted(alloc.allocate(3)) == [2, 3, 4] and alloc.num_free == 0
    with pytest.raises(ValueError, match="num_blocks=1"):
        BlockAllocator(1)


def test_rows_grow_block_by_block_and_release_moves_the_later_rows_up():
    cache = KVCache.allocate(1, 3, 12, 1, 8, torch.float32, "cpu", block_size=4, num_blocks=8)
    cache.reserve(0, 5)
    cache.reserve(1, 4)
    cache.reserve(0, 8)                    # grows within its second block: no new block
    assert [len(t) for t in cache.block_tables] == [2, 1] and cache.free_blocks == 4
    epoch = cache.epoch
    cache.reserve(0, 9)
    assert len(cache.block_tables[0]) == 3 and cache.epoch > epoch
    row1 = list(cache.block_tables[1])
    cache.release([0])
    assert cache.block_tables == [row1] and cache.free_blocks == 6
    with pytest.raises(ValueError, match="row 3 is not the next one"):
        cache.reserve(3, 1)
    with pytest.raises(ValueError, match="position 12 does not fit the cache's max_len 12"):
        cache.reserve(1, 13)
    with pytest.raises(ValueError, match="row 5 holds no sequence"):
        cache.release([5])
    cache.reserve(1, 12)
    cache.reserve(2, 8)                    # 1 + 3 + 2 of 7 blocks held
    with pytest.raises(KVCacheFull, match="out of blocks: 2 more needed, 1 of 7 free"):
        cache.reserve(0, 12)
    cache.reset()
    assert cache.block_tables == [] and cache.free_blocks == 7


def test_plan_maps_every_token_to_its_block_and_offset():
    cache = KVCache.allocate(1, 2, 16, 1, 8, torch.float32, "cpu", block_size=4)
    cache.reserve(0, 1)
    cache.reserve(1, 1)
    cache.release([0])                     # scrambles the free list: rows do not own consecutive blocks
    # sequence 0: 3 new tokens after 3 of context (seq_len 6); sequence 1: one decode token at position 4
    md = cache.plan(torch.tensor([3, 4, 5, 4]), torch.tensor([0, 3, 4]), torch.tensor([6, 5]))
    tables = cache.block_tables
    assert md.block_table_tensor.tolist() == [tables[0] + [0] * (2 - len(tables[0])),
                                             tables[1] + [0] * (2 - len(tables[1]))]
    slot = [tables[0][p // 4] * 4 + p % 4 for p in (3, 4, 5)] + [tables[1][1] * 4 + 0]
    assert md.slot_mapping.tolist() == slot and md.slot_mapping.dtype == torch.int64
    assert md.seq_lens.tolist() == [6, 5] and md.query_start_loc.tolist() == [0, 3, 4]
    assert (md.num_reqs, md.num_actual_tokens, md.max_query_len, md.max_seq_len) == (2, 4, 3, 6)
    assert 0 not in sum(tables, [])
    # as many tokens as sequences, yet not a decode step: sequence 1 has no new token
    md = cache.plan(torch.tensor([4, 5]), torch.tensor([0, 2, 2]), torch.tensor([6, 5]))
    assert md.slot_mapping.tolist() == [tables[0][1] * 4 + 0, tables[0][1] * 4 + 1]
    with pytest.raises(ValueError, match="token 1 is at position 9, but .* must be at 4"):
        cache.plan(torch.tensor([3, 9, 5]), torch.tensor([0, 3]), torch.tensor([6]))
    with pytest.raises(ValueError, match=r"cu_seqlens has shape \(2,\), expected \(3,\)"):
        cache.plan(torch.tensor([3, 4]), torch.tensor([0, 2]), torch.tensor([5, 5]))
    with pytest.raises(ValueError, match="sequence 0 has 3 new tokens but seq_len 2"):
        cache.plan(torch.tensor([0, 1, 2]), torch.tensor([0, 3]), torch.tensor([2]))
    with pytest.raises(ValueError, match="3 sequences do not fit the cache's 2 rows"):
        cache.plan(torch.tensor([0, 0, 0]), torch.arange(4), torch.tensor([1, 1, 1]))


# ----- generation through the backends --------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_generation_on_small_blocks_equals_full_recompute(backend):
    """Blocks of 4 tokens (every sequence spans several, in scrambled order), GQA 6/2, a windowed layer."""
    model = build_model(WINDOWED, torch.float32, seed=3, attn_backend=backend, block_size=4)
    assert model.attention_backends == [backend] and model.model.attention.block_size == 4
    cache = model.allocate_kv_cache(4, 16)
    with using_kv_cache(cache):            # a sequence left from earlier holds blocks: the others are scattered
        model(torch.tensor([1, 2, 3, 4, 5]), torch.arange(5), torch.tensor([0, 5]), torch.tensor([5]))
    out = generate(model, PROMPTS, 6, cache=cache, prompt_logits=True)
    for s, prompt in enumerate(PROMPTS):
        tokens, logits = _recompute(model, prompt, 6)
        assert out.tokens[s] == tokens, s
        torch.testing.assert_close(out.sequence_logits(s), logits, atol=2e-5, rtol=2e-5)
    assert cache.block_tables == [] and cache.free_blocks == cache.num_blocks - 1   # all freed at the end


@pytest.mark.parametrize("backend", BACKENDS)
def test_chunked_prefill_and_a_mixed_batch_at_the_model(backend):
    """Sequence 0's prompt in two chunks, the second beside sequence 1's decode step (one mixed batch)."""
    model = build_model(WINDOWED, torch.float32, seed=4, attn_backend=backend, block_size=4)
    a, b = [7, 8, 9, 10, 11, 12, 13, 14, 15], [20, 21, 22, 23]
    with torch.no_grad(), using_kv_cache(model.allocate_kv_cache(2, 16)):
        first = model(torch.tensor(a[:5] + b[:3]), torch.tensor([0, 1, 2, 3, 4, 0, 1, 2]), torch.tensor([0, 5, 8]),
                      torch.tensor([5, 3]))
        second = model(torch.tensor(a[5:] + b[3:]), torch.tensor([5, 6, 7, 8, 3]), torch.tensor([0, 4, 5]),
                       torch.tensor([9, 4]))
    with torch.no_grad():
        full_a = model(torch.tensor(a), torch.arange(len(a)))
        full_b = model(torch.tensor(b), torch.arange(len(b)))
    torch.testing.assert_close(torch.cat([first[:5], second[:4]]), full_a, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(torch.cat([first[5:], second[4:]]), full_b, atol=2e-5, rtol=2e-5)


def test_ended_sequences_leave_the_batch_and_free_their_blocks():
    model = build_model(DecoderConfig(), torch.float32, seed=11, block_size=4)
    full = generate(model, PROMPTS, 6, cache=model.allocate_kv_cache(3, 16), prompt_logits=True)
    stop = full.tokens[0][1]                           # sequence 0 ends at its second token
    cache = model.allocate_kv_cache(3, 16)
    batches, held = [], []

    def recording(*args):
        batches.append(args[3].shape[0])               # sequences in this forward
        held.append(cache.num_blocks - 1 - cache.free_blocks)
        return model(*args)

    out = generate(recording, PROMPTS, 6, cache=cache, stop_token_ids={stop}, prompt_logits=True)
    assert out.tokens == [t[:t.index(stop) + 1] if stop in t else t for t in full.tokens]
    for k in range(len(batches)):                      # forward k computes every running sequence's token k
        running = [s for s in range(3) if stop not in full.tokens[s][:k]]
        assert batches[k] == len(running), k
        # before it, the cache holds the running sequences' blocks only (the ended ones' went back)
        assert held[k] == (0 if k == 0 else sum(-(-(len(PROMPTS[s]) + k - 1) // 4) for s in running)), k
    assert batches[2] < 3
    for s in range(3):
        torch.testing.assert_close(out.sequence_logits(s), full.sequence_logits(s)[:len(PROMPTS[s]) +
                                                                                    len(out.tokens[s]) - 1])
    assert bool(out.step_logits[2:, 0].isnan().all())  # an ended sequence's rows are not computed
    assert cache.free_blocks == cache.num_blocks - 1


def test_generate_refuses_a_cache_with_too_few_blocks():
    model = build_model(DecoderConfig(), torch.float32, seed=1, block_size=4)
    cache = model.allocate_kv_cache(3, 16, num_blocks=5)
    with pytest.raises(ValueError, match=r"3 sequences of up to 11 tokens need 8 blocks of 4 tokens; the KV cache "
                                         r"has 4"):
        generate(model, PROMPTS, 6, cache=cache)


# ----- the platform's backend -------------------------------------------------------------------------
CALLS: list[str] = []


class CountingImpl(ReferenceAttentionImpl):
    def do_kv_cache_update(self, layer, key, value, kv_cache, slot_mapping):
        CALLS.append(f"write {layer.layer_name}")
        super().do_kv_cache_update(layer, key, value, kv_cache, slot_mapping)

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs):
        CALLS.append(f"forward {layer.layer_name}")
        return super().forward(layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs)


class CountingBackend(ReferenceAttentionBackend):
    @staticmethod
    def get_name():
        return "COUNTING"

    @staticmethod
    def get_impl_cls():
        return CountingImpl

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None):
        return [MultipleOf(32)]


class CountingPlatform(CpuPlatform):
    def get_attn_backend_cls(self, selected_backend, selector_config, num_heads=None):
        return f"{__name__}.CountingBackend"


def test_the_runtime_attends_through_the_backend_the_platform_selects():
    with activate_platform(CountingPlatform()):
        model = build_model(DecoderConfig(num_layers=2), torch.float32, seed=2)
    assert model.attention_backends == ["COUNTING"]
    assert model.model.attention.block_size == 32       # the backend's declared MultipleOf(32), not 16
    cache = model.allocate_kv_cache(3, 16)
    assert cache.block_size == 32 and cache.layers[0].shape[2] == 32
    with activate_platform(CountingPlatform()), pytest.raises(
            ValueError, match=r"block_size=16 is not a KV-cache block size the attention backend COUNTING takes "
                              r"\(declared: \[MultipleOf\(32\)\]\)"):
        build_model(DecoderConfig(num_layers=2), torch.float32, block_size=16)
    CALLS.clear()
    generate(model, PROMPTS, 3, cache=cache)
    per_forward = [f"{what} model.layers.{i}.self_attn.attn" for i in range(2) for what in ("write", "forward")]
    assert CALLS == per_forward * 3                      # the prefill and two decode steps, every layer
    if cpp_available():
        with activate_platform(CpuPlatform()):
            assert build_model(DecoderConfig(), torch.float32).attention_backends == ["CPP"]


class DecodesFirstBuilder(ReferenceAttentionMetadataBuilder):
    reorder_batch_threshold = 1


class DecodesFirstBackend(ReferenceAttentionBackend):
    @staticmethod
    def get_builder_cls():
        return DecodesFirstBuilder


def test_errors_name_the_backend_the_layer_and_what_does_not_fit():
    ids = torch.tensor([1, 2, 3])
    wide = build_model(DecoderConfig(), torch.float64, seed=1)   # no backend here computes float64 attention
    with using_kv_cache(wide.allocate_kv_cache(1, 8)), pytest.raises(
            ValueError, match=r"cannot serve model.layers.0.self_attn.attn \(head size 16, float64, kv cache auto, "
                              r"block 16\): dtype not supported"):
        wide(ids, torch.arange(3), torch.tensor([0, 3]), torch.tensor([3]))
    model = build_model(DecoderConfig(), torch.float32, seed=1)
    other = build_model(DecoderConfig(num_kv_heads=1), torch.float32, seed=1)
    with using_kv_cache(other.allocate_kv_cache(1, 8)), pytest.raises(
            ValueError, match=r"the cache holds blocks of 16 tokens x 1 kv heads .* need 16 x 2 x 16"):
        model(ids, torch.arange(3), torch.tensor([0, 3]), torch.tensor([3]))
    deep = build_model(DecoderConfig(num_layers=3), torch.float32, seed=1)
    with using_kv_cache(deep.allocate_kv_cache(1, 8)), pytest.raises(ValueError, match="has 3 layers, the decoder 2"):
        model(ids, torch.arange(3), torch.tensor([0, 3]), torch.tensor([3]))
    ordered = build_model(DecoderConfig(), torch.float32, seed=1, attn_backend=DecodesFirstBackend)
    with using_kv_cache(ordered.allocate_kv_cache(2, 8)):
        ordered(torch.tensor([1, 2]), torch.tensor([0, 0]), torch.tensor([0, 1, 2]), torch.tensor([1, 1]))
        ordered(torch.tensor([5, 6]), torch.tensor([1, 1]), torch.tensor([0, 1, 2]), torch.tensor([2, 2]))
        with pytest.raises(ValueError, match=r"takes a batch's decodes \(query length <= 1\) before its prefills; "
                                             r"this batch's query lengths are \[2, 1\]"):
            ordered(torch.tensor([7, 8, 9]), torch.tensor([2, 3, 2]), torch.tensor([0, 2, 3]), torch.tensor([4, 3]))
