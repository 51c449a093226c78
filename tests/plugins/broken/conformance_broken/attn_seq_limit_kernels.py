"""Fault: an attention kernel whose launch grid covers at most 4,096 sequences (a grid or a per-batch buffer sized
for a maximum batch): the requests past it are never computed, their output rows stay as the buffer was given.
Correct on every batch of up to 4,096 requests; the decode batches just past the request limits
(reference_impl.attention.size_cases) catch it."""

import dataclasses

from conformance_broken.attention_base import Impl, make_backend

MAX_SEQS = 4096


class SeqLimitImpl(Impl):
    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale=None,
                output_block_scale=None):
        if attn_metadata is not None and len(attn_metadata.seq_lens) > MAX_SEQS:     # the bug: a fixed grid
            attn_metadata = dataclasses.replace(attn_metadata, seq_lens=attn_metadata.seq_lens[:MAX_SEQS],
                                                query_start_loc=attn_metadata.query_start_loc[:MAX_SEQS + 1])
        return super().forward(layer, query, key, value, kv_cache, attn_metadata, output)


Backend = make_backend("BROKEN_SEQ_LIMIT", SeqLimitImpl)
